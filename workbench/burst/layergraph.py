"""The planner's layer graph (:class:`~workbench.burst.graph.ModelGraph`) read off a torch model:
:func:`layer_graph` (import it from :mod:`workbench.burst.profiler`, which times the layers).

**How a model is cut into layers.** An ``nn.Sequential`` (the project's ``mlp``, ``wide_mlp``,
``cnn``) is a chain: **layer i is ``model[i]``**, every top-level child one layer whatever it holds
(``cnn``'s reshape module is layer 0), so an executor runs layer ``i`` as ``model[i]``. Any other
model is traced with ``torch.fx`` (torch.nn's own modules are leaves, plus the classes in
``leaf_modules``): one layer per leaf-module call and per functional op turning the input's
tensors into a tensor (``F.relu``, pools, ``torch.flatten``, ``torch.cat``: ``concat`` joins,
``+``/``+=``: ``add`` residual joins, ...); ops that only read sizes or pick from tuples are
folded into the layer using them. A module called twice is two layers (its parameters counted at
the first). Forks have several ``next``, joins several ``prev``; ids follow the trace (a
topological order). If the model's input feeds several layers, layer 0 is an ``input`` identity.

**Fields.** Each layer's ``type`` and ``params`` are DeepPool's where its tables have them
(:mod:`workbench.burst.layerkinds`, which says how they are read). ``inputDim``/``outputDim``:
per-sample shapes of the first input and of the output (``concat``: its output, as DeepPool);
``paramCount``: the module's trainable parameters. Key: ``type + params-JSON`` (sorted keys, no
spaces) ``+ [b] + inputDim-JSON``.
"""
from __future__ import annotations

import functools
import json
from contextlib import contextmanager

import torch
import torch.fx as fx
from torch import nn
from torch.utils import _pytree as pytree

from ..models import one_line
from .graph import BurstError, Layer, ModelGraph
from .layerkinds import function_kind, module_kind


# -- shapes ----------------------------------------------------------------------------------

def _first_tensor(value):
    return next((t for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor)), None)


def _shape(value) -> tuple[int, ...]:
    """Per-sample shape of the first tensor in ``value`` (the batch dimension dropped)."""
    t = _first_tensor(value)
    return tuple(int(s) for s in t.shape[1:]) if t is not None and t.dim() else ()


def _dim(shape: tuple[int, ...]):
    return int(shape[0]) if len(shape) == 1 else 1 if not shape else tuple(shape)


@contextmanager
def modes(model: nn.Module, train: bool):
    """``model`` in train or eval mode inside; every module's own mode restored after."""
    saved = [(m, m.training) for m in model.modules()]
    model.train(train)
    try:
        yield
    finally:
        for m, mode in saved:
            m.training = mode


def check_shape(input_shape) -> tuple[int, ...]:
    """One sample's shape as a tuple of ints >= 1 (an int: a 1-D sample); else BurstError."""
    shape = (input_shape,) if isinstance(input_shape, int) else input_shape
    if not isinstance(shape, (tuple, list, torch.Size)) or not shape or \
            any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in shape):
        raise BurstError(f"input_shape must be one sample's shape (no batch), ints >= 1; got {input_shape!r}")
    return tuple(int(s) for s in shape)


# -- the graph -------------------------------------------------------------------------------

class _NodeCall:
    """A traced node run on its source layers' outputs; size/tuple glue recomputed from them."""

    def __init__(self, gm: fx.GraphModule, node: fx.Node, sources: list[fx.Node]) -> None:
        self.gm, self.node, self.sources = gm, node, sources

    def __call__(self, *inputs):
        return self._eval(self.node, dict(zip(self.sources, inputs)))

    def _eval(self, n: fx.Node, env: dict):
        if n in env:
            return env[n]
        if n.op == "get_attr":
            value = self.gm
            for part in n.target.split("."):
                value = getattr(value, part)
            return value
        args = fx.node.map_arg(n.args, lambda a: self._eval(a, env))
        kwargs = fx.node.map_arg(n.kwargs, lambda a: self._eval(a, env))
        if n.op == "call_function":
            out = n.target(*args, **kwargs)
        elif n.op == "call_method":
            out = getattr(args[0], n.target)(*args[1:], **kwargs)
        elif n.op == "call_module":
            out = self.gm.get_submodule(n.target)(*args, **kwargs)
        else:
            raise BurstError(f"layer {self.node.name}: cannot evaluate node {n.name} ({n.op})")
        env[n] = out
        return out

    def __repr__(self) -> str:
        return f"<layer {self.node.format_node()}>"


class _Record(fx.Interpreter):
    """Runs the traced graph once, keeping each node's output (GraphModules free dead values)."""

    def __init__(self, gm: fx.GraphModule) -> None:
        super().__init__(gm)
        self.values: dict[fx.Node, object] = {}

    def run_node(self, n: fx.Node):
        out = super().run_node(n)
        kind = "tensor" if isinstance(out, torch.Tensor) else "tensors" if _first_tensor(out) is not None else None
        self.values[n] = (kind, _shape(out))
        return out


class _Tracer(fx.Tracer):
    def __init__(self, leaves: tuple[type, ...]) -> None:
        super().__init__()
        self.leaves = leaves

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return bool(self.leaves) and isinstance(m, self.leaves) or super().is_leaf_module(m, qualname)


def _chain(model: nn.Sequential, x: torch.Tensor) -> list[tuple]:
    """(fn, module, source indices, in_shape, out_shape, type, params) per child of a Sequential."""
    specs = []
    for i, m in enumerate(model):
        in_shape = _shape(x)
        try:
            x = m(x)
        except Exception as exc:  # noqa: BLE001 - any failure of the user's module
            raise BurstError(f"layer {i} ({type(m).__name__}) fails on a batch of per-sample shape {in_shape}: "
                             f"{one_line(exc)}") from None
        specs.append((m, m, [i - 1] if i else [], in_shape, _shape(x), *module_kind(m, in_shape)))
    if not specs:
        raise BurstError("model is an empty nn.Sequential: no layer")
    return specs


def _trace(model: nn.Module, x: torch.Tensor, leaves: tuple[type, ...], name: str):
    """Trace by torch.fx, run once on ``x``: the GraphModule, node -> output kind, node -> sample shape."""
    try:
        gm = fx.GraphModule(model, _Tracer(leaves).trace(model), type(model).__name__)
    except Exception as exc:  # noqa: BLE001 - fx raises many kinds
        raise BurstError(f"model {name!r} ({type(model).__name__}) cannot be traced by torch.fx ({one_line(exc)}); "
                         "make it an nn.Sequential whose children are the layers, or name its untraceable "
                         "blocks in leaf_modules") from None
    rec = _Record(gm)
    try:
        rec.run(x)
    except Exception as exc:  # noqa: BLE001
        raise BurstError(f"model {name!r} fails on a batch of per-sample shape {tuple(x.shape[1:])}: "
                         f"{one_line(exc)}") from None
    kind, shape = ({n: v[i] for n, v in rec.values.items()} for i in (0, 1))
    return gm, kind, shape


def _layer_nodes(gm: fx.GraphModule, inputs: list[fx.Node], kind: dict) -> list[fx.Node]:
    """The nodes that are layers: module calls and ops turning the input's tensors into tensors."""
    data, layers = set(inputs), []
    for n in gm.graph.nodes:
        if n.op in ("placeholder", "output", "get_attr"):
            continue
        if any(a in data for a in n.all_input_nodes):
            data.add(n)
        tensor_in = any(a in data and kind.get(a) == "tensor" for a in n.all_input_nodes)
        if n.op == "call_module" or (kind.get(n) is not None and tensor_in and n.target is not getattr):
            layers.append(n)
    return layers


def _traced(model: nn.Module, x: torch.Tensor, leaves: tuple[type, ...], name: str) -> list[tuple]:
    """As :func:`_chain`, for a model traced by torch.fx (see the module's text)."""
    gm, kind, shape = _trace(model, x, leaves, name)
    inputs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(inputs) != 1:
        raise BurstError(f"model {name!r} takes {len(inputs)} inputs; the profiler feeds exactly one tensor")
    layers = _layer_nodes(gm, inputs, kind)
    if not layers:
        raise BurstError(f"model {name!r} has no layer (its output is its input)")
    is_layer = set(layers) | set(inputs)

    @functools.cache
    def sources(n: fx.Node) -> list[fx.Node]:  # the layers (or the input) whose outputs ``n`` reads
        out = []
        for a in n.all_input_nodes:
            for s in ([a] if a in is_layer else [] if a.op == "get_attr" else sources(a)):
                if s not in out:
                    out.append(s)
        return out

    readers = [n for n in layers if inputs[0] in sources(n)]
    specs, index = [], {}
    if readers != [layers[0]]:          # the input feeds several layers: an identity layer 0 forks it
        index[inputs[0]] = 0
        specs.append((nn.Identity(), None, [], shape[inputs[0]], shape[inputs[0]], "input", {}))
    for n in layers:
        src = sources(n)
        in_shape = shape[src[0]] if src else ()
        if n.op == "call_module":
            m = gm.get_submodule(n.target)
            fn = m if not n.kwargs and list(n.args) == src and len(src) == 1 else _NodeCall(gm, n, src)
            kind_ = module_kind(m, in_shape)
        else:
            m, fn, kind_ = None, _NodeCall(gm, n, src), function_kind(n, in_shape)
        if kind_[0] == "concat":
            in_shape = shape[n]
        prev = [index[s] for s in src if s in index]
        index[n] = len(specs)
        specs.append((fn, m, prev, in_shape, shape[n], *kind_))
    return specs


def build(model: nn.Module, input_shape, name: str = "model", leaf_modules=()) -> tuple[ModelGraph, list, list]:
    """:func:`layer_graph`, and each layer's trainable parameters (the profiler's ``wrt``)."""
    if not isinstance(model, nn.Module):
        raise BurstError(f"model must be a torch.nn.Module; got {type(model).__name__}")
    shape = check_shape(input_shape)
    leaves = tuple(leaf_modules)
    if not all(isinstance(c, type) and issubclass(c, nn.Module) for c in leaves):
        raise BurstError(f"leaf_modules must be nn.Module classes; got {leaf_modules!r}")
    x = torch.zeros((1, *shape), device=next((t.device for t in (*model.parameters(), *model.buffers())), "cpu"))
    with torch.no_grad(), modes(model, False):
        specs = _chain(model, x) if isinstance(model, nn.Sequential) else _traced(model, x, leaves, name)
    nexts: list[list[int]] = [[] for _ in specs]
    for i, spec in enumerate(specs):
        for p in spec[2]:
            nexts[p].append(i)
    seen, layers, params = set(), [], []
    for i, (fn, m, prev, in_shape, out_shape, type_, kw) in enumerate(specs):
        mine = [p for p in (m.parameters() if m is not None else ()) if p.requires_grad]
        count = sum(p.numel() for p in mine if id(p) not in seen)
        seen.update(id(p) for p in mine)
        in_dim = _dim(in_shape)
        prefix = type_ + json.dumps(kw, sort_keys=True, separators=(",", ":"))
        suffix = json.dumps(list(in_dim) if isinstance(in_dim, tuple) else in_dim, separators=(",", ":"))
        layers.append(Layer(i, type_, kw, tuple(prev), tuple(nexts[i]), in_dim, _dim(out_shape), count, prefix,
                            suffix))
        params.append(mine)
    total = sum(p.numel() for p in model.parameters() if p.requires_grad)
    title = f"{type(model).__name__}, {len(layers)} layers (workbench.burst.profiler)"
    graph = ModelGraph(name, layers, _dim(shape), title, total)
    return graph, [s[0] for s in specs], params


def layer_graph(model: nn.Module, input_shape: tuple, name: str = "model", leaf_modules=()) -> tuple[ModelGraph, list]:
    """The planner's layer graph of ``model`` for samples of shape ``input_shape`` (no batch), and
    one callable per layer: ``fns[i](*outputs of graph.layers[i].prev)`` (layer 0: the model's
    input) computes layer ``i``.

    **Contract for chains**: for an ``nn.Sequential`` (``mlp``, ``wide_mlp``, ``cnn``) layer ``i``
    is ``model[i]`` (``fns[i] is model[i]``), every top-level child one layer (``cnn``'s reshape
    module included). Other models are traced with torch.fx: one layer per leaf-module call or
    functional op (``add`` and ``concat`` joins, forks where an output has several users); the
    classes in ``leaf_modules`` stay whole (e.g. torchvision's ``Bottleneck`` for DeepPool's
    one-layer-per-block WRN). See the module's text for types, params and keys.

    Shapes: one forward of a batch of 1, eval mode, no gradients, on the model's device (built
    under ``torch.device("meta")``: free). :class:`BurstError`: not a module, a bad shape, a model
    fx cannot trace (data-dependent control flow) or that fails on that shape."""
    graph, fns, _ = build(model, input_shape, name, leaf_modules)
    return graph, fns
