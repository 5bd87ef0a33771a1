"""Which DeepPool layer a torch module or functional op is: its ``type`` and ``params``
(:func:`module_kind`, :func:`function_kind`), for the layer graph :mod:`workbench.burst.layergraph`
reads off a model.

``type``: DeepPool's names where its tables have them (``conv2d``, ``linear``,
``ReLU2d``/``ReLU1d``, ``maxPool2d``, ``avgPool2d``, ``adAvgPool2d``, ``flatten``, ``concat``) with
DeepPool's ``params`` (a torchvision VGG-16's or Inception-v3's keys are those of the A100 tables;
fields DeepPool lacks appear only when not at their default); otherwise the class or function
name, first letter lower-case (``batchNorm2d``, ``dropout``, ``add``, ``image``), with the module's
constructor arguments read back from its attributes (a function's literal arguments).
``params`` values are JSON (a size DeepPool's way: one int when all its entries are equal).

torch is imported here (``torch.fx`` for the traced nodes).
"""
from __future__ import annotations

import inspect

import torch
import torch.fx as fx
from torch import nn
from torch.utils import _pytree as pytree

#: DeepPool writes these constants into every ReLU row's params
_RELU_CONSTANTS = {"kernel_size": 1, "stride": 1, "padding": 0}
#: the ops given DeepPool types: positional parameter names (also the modules' attribute names)
#: and, after the size arguments, the extra fields with their defaults (written when not default)
_OPS = {
    "relu": (("input", "inplace"), {}),
    "max_pool2d": (("input", "kernel_size", "stride", "padding", "dilation", "ceil_mode"),
                   {"dilation": 1, "ceil_mode": False}),
    "avg_pool2d": (("input", "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor_override"),
                   {"ceil_mode": False, "count_include_pad": True, "divisor_override": None}),
    "adaptive_avg_pool2d": (("input", "output_size"), {}),
    "flatten": (("input", "start_dim", "end_dim"), {}),
    "cat": (("tensors", "dim"), {}),
}
_MODULE_OPS = {nn.ReLU: "relu", nn.MaxPool2d: "max_pool2d", nn.AvgPool2d: "avg_pool2d",
               nn.AdaptiveAvgPool2d: "adaptive_avg_pool2d", nn.Flatten: "flatten"}
_ALIASES = {"iadd": "add", "concat": "cat", "concatenate": "cat"}


def _lower(name: str) -> str:
    name = name.lstrip("_") or name
    return name[:1].lower() + name[1:]


def _json(value):
    """A JSON-able form of an argument, or ``...`` (dropped) when there is none."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return "_".join(value.split())     # no whitespace: keys are whitespace-separated
    if isinstance(value, torch.Tensor):      # a bias/weight argument: whether it is there
        return True
    if isinstance(value, (tuple, list, torch.Size)):
        items = [_json(v) for v in value]
        return ... if any(v is ... for v in items) else items
    return str(value) if isinstance(value, (torch.dtype, torch.device)) else ...


def _square(value):
    """DeepPool's spelling of a size: an int when all entries are equal, else a list."""
    items = _json(value)
    return items[0] if isinstance(items, list) and items and all(v == items[0] for v in items) else items


def _extras(a: dict, defaults: dict) -> dict:
    return {k: _square(a.get(k, d)) for k, d in defaults.items() if _square(a.get(k, d)) != _square(d)}


def _deeppool_kind(op: str, a: dict, in_shape: tuple, inplace: bool = False) -> tuple[str, dict] | None:
    """``(type, params)`` of an op DeepPool's tables name, from its arguments ``a``; else None."""
    defaults = _OPS.get(op, ((), {}))[1]
    if op == "relu":
        return ("ReLU2d" if len(in_shape) >= 3 else "ReLU1d"), {"inplace": bool(inplace or a.get("inplace")),
                                                                **_RELU_CONSTANTS}
    if op in ("max_pool2d", "avg_pool2d") and "kernel_size" in a:
        stride = a.get("stride") if a.get("stride") not in (None, [], ()) else a["kernel_size"]
        return ("maxPool2d" if op[0] == "m" else "avgPool2d"), {
            "kernel_size": _square(a["kernel_size"]), "stride": _square(stride),
            "padding": _square(a.get("padding", 0)), **_extras(a, defaults)}
    if op == "adaptive_avg_pool2d" and "output_size" in a:
        size = a["output_size"]
        h, w = size if isinstance(size, (tuple, list)) else (size, size)
        return "adAvgPool2d", {"output_height": int(h if h is not None else in_shape[-2]),
                               "output_width": int(w if w is not None else in_shape[-1])}
    if op == "flatten":     # torch.flatten's default start is 0 (nn.Flatten's, always given here, 1)
        dims = {"start_dim": a.get("start_dim", 0), "end_dim": a.get("end_dim", -1)}
        return "flatten", {"kernel_size": 1, **_extras(dims, {"start_dim": 1, "end_dim": -1})}
    if op == "cat":
        return "concat", {"kernel_size": 1, **_extras({"dim": a.get("dim", 0)}, {"dim": 1})}
    return None


def _constructor_args(module: nn.Module) -> dict:
    try:
        signature = inspect.signature(type(module).__init__)
    except (TypeError, ValueError):
        return {}
    out = {}
    for name, p in signature.parameters.items():
        if name in ("self", "device", "dtype") or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if hasattr(module, name) and not isinstance(getattr(module, name), nn.Module):
            value = _json(getattr(module, name))
            if value is not ...:
                out[name] = value
    return out


def module_kind(m: nn.Module, in_shape: tuple) -> tuple[str, dict]:
    """``(type, params)`` of a module called on per-sample shape ``in_shape``."""
    if isinstance(m, nn.Conv2d):
        return "conv2d", {"in_channels": m.in_channels, "out_channels": m.out_channels,
                          "kernel_size": _square(m.kernel_size), "stride": _square(m.stride),
                          "padding": _square(m.padding),
                          **_extras(vars(m), {"dilation": 1, "groups": 1, "padding_mode": "zeros"})}
    if isinstance(m, nn.Linear):
        return "linear", {"in_features": m.in_features, "out_features": m.out_features, "bias": m.bias is not None}
    op = next((op for cls, op in _MODULE_OPS.items() if isinstance(m, cls)), None)
    if op is not None:
        found = _deeppool_kind(op, {k: getattr(m, k) for k in _OPS[op][0] if hasattr(m, k)}, in_shape)
        if found:
            return found
    return _lower(type(m).__name__), _constructor_args(m)


def _literal(value) -> bool:
    return not any(isinstance(v, fx.Node) for v in pytree.tree_leaves(value))


def function_kind(node: fx.Node, in_shape: tuple) -> tuple[str, dict]:
    """``(type, params)`` of a functional op (a call_function/call_method node)."""
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", str(node.target))
    inplace = name.endswith("_") and not name.endswith("__")
    op = _ALIASES.get(name.strip("_"), name.strip("_"))
    a = {**dict(zip(_OPS.get(op, ((),))[0], node.args)), **node.kwargs}
    found = _deeppool_kind(op, {k: v for k, v in a.items() if _literal(v)}, in_shape, inplace)
    if found:
        return found
    args = [_json(v) if _literal(v) else None for v in node.args]
    params = {"args": [None if v is ... else v for v in args]} if any(v is not None for v in args) else {}
    params.update({k: v for k, v in ((k, _json(v)) for k, v in node.kwargs.items() if _literal(v)) if v is not ...})
    return _lower(op), params
