"""Per-layer forward and backward times of a torch model at several per-GPU batch sizes, in
DeepPool's table format: the planner's input measured here instead of read from the published
A100 tables.

    from workbench.burst.profiler import profile, write_profile, torchvision_model
    model, shape = torchvision_model("vgg16")                  # weights=None: nothing downloaded
    graph, table = profile(model, shape, batch_sizes=(1, 2, 4), repeats=3)
    write_profile(graph, table, "vgg16_cpu.prof", "vgg16_cpu.json")
    # workbench.burst.graph.load_model("vgg16_cpu.json"), load_profile("vgg16_cpu.prof") read them back

The layer graph (how a model is cut into layers, types, params, keys) is
:func:`~workbench.burst.layergraph.layer_graph`, re-exported here; for an ``nn.Sequential``
layer ``i`` is ``model[i]``.

**How a layer is timed.** Layer by layer in the graph's order, at each per-GPU batch ``b``: the
model's input is a random batch; each layer runs on its prev layers' outputs at ``b`` (kept until
their last user has run). One repetition of layer ``i``:

* forward: ``fns[i](*inputs)`` on fresh copies of the saved inputs (copied outside the clock, so
  in-place layers such as ``ReLU(inplace=True)`` or ``out += identity`` find the same values every
  time); the copies are made from leaves that require grad (except the model's input: no layer
  computes a gradient for the data);
* backward: ``torch.autograd.grad(outputs, inputs + the layer's parameters, g)`` with ``g`` a
  fixed random gradient of the output's shape: exactly the layer's share of a backward pass, its
  input gradient (what the layer before needs) and its weight gradients, **in isolation**. Timing
  the whole model's backward with hooks instead books autograd's queueing and the next layer's
  work onto a neighbour (what the published A100 tables show: conv2d rows with near-zero ``bw_us``
  and the ReLU after them carrying it), and ``autograd.grad`` leaves ``.grad`` untouched, so no
  accumulation is timed either; a layer without parameters and without a gradient to pass back
  (e.g. ``cnn``'s reshape at the input) has ``bw_us = 0``. Each ``autograd.grad`` call carries
  the engine's fixed start-up (~15 us on this CPU), which a model's single backward pass pays
  once, not per layer: it is measured first (``autograd.grad`` through the input's clone alone)
  and subtracted from every backward time (floored at 0). With it, the layers' sums come within
  ~5-25% of a whole-model pass of ``cnn``/``wide_mlp`` at 1-64 samples (without: up to 75% over).

``warmup`` untimed repetitions, then the **median** of ``repeats`` timed ones, per phase, in
microseconds. CPU: ``time.perf_counter``, one thread (``torch.set_num_threads(1)``, as each rank
runs; on glibc, malloc keeps freed memory: :func:`_steady_malloc`). CUDA: a pair of
``torch.cuda.Event`` around each phase after ``torch.cuda.synchronize()``, their elapsed time
(launch gaps the GPU waits through count, as in a real step). Layers run in train mode
(BatchNorm batch statistics, dropout on); BatchNorm running statistics are restored afterwards.
A key seen again at the same batch (identical layers: VGG's repeated convs, WRN's blocks) is
timed once, at its first layer: the table holds one row per key, as DeepPool's planner reads it.

torch is imported here.
"""
from __future__ import annotations

import ctypes
import os
import statistics
import time
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn
from torch.utils import _pytree as pytree

from ..checks import integer
from .. import models
from ..models import one_line
from .graph import BurstError, ModelGraph, ProfileTable
from .layergraph import build, check_shape, layer_graph, modes

__all__ = ["profile", "layer_graph", "write_profile", "torchvision_model", "import_torchvision",
           "DEFAULT_BATCHES", "TORCHVISION_MODELS"]

DEFAULT_BATCHES = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_REPEATS = 10
DEFAULT_WARMUP = 2
#: torchvision models by name: (builder, keyword arguments, input shape)
TORCHVISION_MODELS = {
    "vgg16": ("vgg16", {}, (3, 224, 224)),
    "wide_resnet101_2": ("wide_resnet101_2", {}, (3, 224, 224)),
    "inception_v3": ("inception_v3", {"aux_logits": False, "init_weights": False}, (3, 299, 299)),
}
_TV_ALIASES = {"vgg": "vgg16", "wrn101_2": "wide_resnet101_2", "wrn": "wide_resnet101_2", "inception": "inception_v3"}


# -- checks ----------------------------------------------------------------------------------

def _batches(batch_sizes) -> tuple[int, ...]:
    try:
        values = list(batch_sizes)
    except TypeError:
        values = None
    if not values or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in values):
        raise BurstError(f"batch_sizes must be a non-empty list of per-GPU batch sizes, ints >= 1; got {batch_sizes!r}")
    return tuple(sorted(set(values)))


def _device(device) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise BurstError(f"device must be 'cpu' or 'cuda[:N]'; got {device!r}") from None
    if dev.type not in ("cpu", "cuda"):
        raise BurstError(f"device must be 'cpu' or 'cuda[:N]'; got {device!r}")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise BurstError(f"device {device!r}: torch sees no CUDA GPU here (use device='cpu')")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        if dev.index >= torch.cuda.device_count():
            raise BurstError(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s)")
    return dev


# -- timing ----------------------------------------------------------------------------------

class _Clock:
    """``clock(fn) -> (microseconds, fn())``: perf_counter on CPU, CUDA events on a GPU."""

    def __init__(self, dev: torch.device) -> None:
        self.cuda = dev.type == "cuda"
        if self.cuda:
            self.dev = dev
            self.events = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def __call__(self, fn):
        if self.cuda:
            torch.cuda.synchronize(self.dev)
            start, end = self.events
            start.record()
            out = fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) * 1000.0, out
        t = time.perf_counter()
        out = fn()
        return (time.perf_counter() - t) * 1e6, out


def _steady_malloc() -> bool:
    """glibc: keep freed heap memory (``M_TRIM_THRESHOLD`` 1 GiB) and serve blocks under 32 MiB
    from the heap (``M_MMAP_THRESHOLD``), for the rest of the process. Without it a weight
    gradient of a few MiB, allocated afresh by every ``autograd.grad``, comes now and then from
    pages just handed back to the kernel: 1024 page faults for 4 MiB, which made wide_mlp's
    1024x1024 layer's backward 226 us in one run and 1.7 ms in the next. False where there is no
    mallopt."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(-1, 1 << 30)) and bool(mallopt(-3, 32 << 20))   # M_TRIM_THRESHOLD, M_MMAP_THRESHOLD


def _tensors(value) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]


def _map(fn, value):
    return pytree.tree_map(lambda t: fn(t) if isinstance(t, torch.Tensor) else t, value)


def _time_layer(fn, inputs: list, grad_in: bool, params: list, clock: _Clock, repeats: int, warmup: int):
    """(median forward us, median backward us, the output detached) of one layer (see the
    module's text)."""
    fws, bws, grads, out = [], [], None, None
    for r in range(warmup + repeats):
        leaves = [_map(lambda t: t.detach().requires_grad_(grad_in and t.is_floating_point()), v) for v in inputs]
        args = [_map(torch.clone, v) for v in leaves]
        fw, out = clock(lambda: fn(*args))
        outs = [t for t in _tensors(out) if t.requires_grad]
        wrt = [t for v in leaves for t in _tensors(v) if t.requires_grad] + params
        bw = 0.0
        if outs and wrt:
            if grads is None or [g.shape for g in grads] != [t.shape for t in outs]:
                grads = [torch.randn_like(t) for t in outs]
            bw, _ = clock(lambda: torch.autograd.grad(outs, wrt, grads, allow_unused=True))
        if r >= warmup:
            fws.append(fw)
            bws.append(bw)
        del leaves, args
    return statistics.median(fws), statistics.median(bws), _map(torch.Tensor.detach, out)


def _call_overhead(dev: torch.device, clock: _Clock, repeats: int) -> float:
    """Median us of an ``autograd.grad`` through nothing but the input's clone: the engine's
    fixed cost per call, which a layer timed alone pays and a model's one backward pass does not."""
    leaf = torch.zeros(1, device=dev, requires_grad=True)
    grad = torch.ones(1, device=dev)
    times = []
    for _ in range(max(repeats, 20) + 5):
        y = leaf.clone()
        times.append(clock(lambda: torch.autograd.grad([y], [leaf], [grad]))[0])
    return statistics.median(times[5:])


def _profile_batch(graph: ModelGraph, fns: list, params: list, b: int, shape: tuple, dev: torch.device,
                   clock: _Clock, repeats: int, warmup: int, table: ProfileTable, overhead: float) -> None:
    x = torch.randn((b, *shape), device=dev)
    live, users = {}, [len(layer.next) for layer in graph.layers]
    for layer, fn, ps in zip(graph.layers, fns, params):
        inputs = [live[p] for p in layer.prev] if layer.prev else [x]
        try:
            if layer.key(b) in table.entries:     # an identical layer was timed at this batch
                with torch.no_grad():
                    out = fn(*[_map(torch.clone, v) for v in inputs])
            else:
                fw, bw, out = _time_layer(fn, inputs, bool(layer.prev), ps, clock, repeats, warmup)
                table.add(layer, b, round(fw, 3), round(max(bw - overhead, 0.0), 3) if bw else 0.0)
        except BurstError:
            raise
        except Exception as exc:  # noqa: BLE001 - the user's layer failed
            raise BurstError(f"layer {layer.id} ({layer.type}) fails at per-GPU batch {b} on {dev}: "
                             f"{one_line(exc)}") from None
        live[layer.id] = out
        for p in layer.prev:
            users[p] -= 1
            if users[p] == 0:
                del live[p]


def profile(model: nn.Module, input_shape: tuple, batch_sizes=DEFAULT_BATCHES, device="cpu",
            repeats: int = DEFAULT_REPEATS, warmup: int = DEFAULT_WARMUP, name: str = "model",
            leaf_modules=()) -> tuple[ModelGraph, ProfileTable]:
    """Each layer's forward and backward time (us, median of ``repeats`` after ``warmup``) at each
    per-GPU batch size in ``batch_sizes``, on ``device`` (``"cpu"``: one thread; ``"cuda[:N]"``:
    CUDA events). Returns the layer graph (:func:`layer_graph`; each layer's
    ``profiledPerGpuBatches`` filled) and the table (key -> LayerTime(avg = fw + bw, fw, bw)).

    How a layer's backward is timed in isolation, and why: see the module's text. ``model`` is
    moved to ``device`` (``model.to``); its modes and BatchNorm statistics are left as they were.
    :class:`BurstError` for an empty batch list or a size < 1, repeats < 1, warmup < 0, an
    unknown or absent device, or a model :func:`layer_graph` refuses."""
    batches = _batches(batch_sizes)
    integer("repeats", repeats, 1, BurstError)
    integer("warmup", warmup, 0, BurstError)
    shape = check_shape(input_shape)
    dev = _device(device)
    if not isinstance(model, nn.Module):
        raise BurstError(f"model must be a torch.nn.Module; got {type(model).__name__}")
    if any(t.is_meta for t in (*model.parameters(), *model.buffers())):
        raise BurstError("model is on the meta device (shapes only, no weights): build it on a real device to time it")
    model.to(dev)
    graph, fns, params = build(model, shape, name, leaf_modules)
    table = ProfileTable(source=f"workbench.burst.profiler of {name} on {dev}")
    buffers = [(buf, buf.detach().clone()) for buf in model.buffers()]
    threads = torch.get_num_threads()
    try:
        if dev.type == "cpu":
            torch.set_num_threads(1)
            _steady_malloc()
        with modes(model, True), (torch.cuda.device(dev) if dev.type == "cuda" else nullcontext()):
            clock = _Clock(dev)
            overhead = _call_overhead(dev, clock, repeats)
            table.source += f" (backward call overhead {overhead:.1f} us subtracted)"
            for b in batches:
                _profile_batch(graph, fns, params, b, shape, dev, clock, repeats, warmup, table, overhead)
    finally:
        torch.set_num_threads(threads)
        with torch.no_grad():
            for buf, saved in buffers:
                buf.copy_(saved)
    layers = [replace(layer, profiled=table.batches(layer)) for layer in graph.layers]
    return ModelGraph(graph.name, layers, graph.input_dim, graph.title, graph.total_params), table


def write_profile(graph: ModelGraph, table: ProfileTable, prof_path: str | Path,
                  model_json_path: str | Path) -> tuple[Path, Path]:
    """Write the table (``.prof``: one block per batch, ``SUM(avg)`` trailers, rows in layer
    order) and the model JSON naming it (``profileFile`` relative to the JSON's folder's parent,
    each layer's ``profiledPerGpuBatches`` from the table), so that
    :func:`~workbench.burst.graph.load_model` / :func:`~workbench.burst.graph.load_profile` read
    them back. Returns both paths."""
    if not len(table):
        raise BurstError("write_profile: the table is empty")
    prof = table.write(prof_path, graph.layers)
    json_path = Path(model_json_path)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    relative = Path(os.path.relpath(prof.resolve(), json_path.resolve().parent.parent))
    layers = [replace(layer, profiled=table.batches(layer)) for layer in graph.layers]
    ModelGraph(graph.name, layers, graph.input_dim, graph.title, graph.total_params, relative).write(json_path)
    return prof, json_path


# -- torchvision -----------------------------------------------------------------------------

def import_torchvision():
    """``torchvision`` (:func:`workbench.models.import_torchvision`); BurstError when it is not installed."""
    try:
        return models.import_torchvision()
    except ImportError as exc:
        raise BurstError(str(exc)) from None


def torchvision_model(name: str, device=None) -> tuple[nn.Module, tuple[int, ...]]:
    """A torchvision model without weights (nothing is downloaded) and its input shape:
    ``vgg16``, ``wide_resnet101_2`` (``wrn101_2``), ``inception_v3`` (``aux_logits=False,
    init_weights=False``, 3x299x299). ``device="meta"`` builds it without memory or
    initialisation cost (graphs only)."""
    key = _TV_ALIASES.get(name, name)
    if key not in TORCHVISION_MODELS:
        raise BurstError(f"torchvision model must be one of {', '.join(TORCHVISION_MODELS)}; got {name!r}")
    builder, kwargs, shape = TORCHVISION_MODELS[key]
    tv = import_torchvision()
    with torch.device(device) if device is not None else nullcontext():
        model = getattr(tv.models, builder)(weights=None, **kwargs)
    return model, shape
