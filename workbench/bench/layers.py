"""Per-layer compute profile of a torch model on this CPU: the measured input of the scale-out
predictor (:mod:`workbench.netsim.predict`), which is pure and takes only numbers.

    from workbench.bench.layers import profile_layers, profile_builtin, write_profile_csv
    layers = profile_builtin("wide_mlp", batch_size=32)        # list of LayerProfile, forward order
    write_profile_csv(layers, "wide_mlp.csv")                  # `workbench predict --profile wide_mlp.csv`

**What a layer is.** A *parameterised layer* is a module that holds trainable parameters itself
(``parameters(recurse=False)``); its parameter tensors (weight, bias) are the ``tensors`` of its
:class:`~workbench.netsim.profile.LayerProfile`. Modules without parameters (ReLU, pooling,
flatten, a reshape) are folded into the parameterised layer before them, and whatever runs
before the first one (``cnn``'s reshape to images) into the first. The loss (cross-entropy, as
:meth:`~workbench.runtime.rank.context.Context.gradient` computes it) is folded into the last
layer, forward and backward.

**How it is timed** (one thread, ``torch.set_num_threads(1)``, as every rank runs). The model is a
copy whose parameters are views of one flat buffer (:class:`~workbench.models.FlatParams`), so
autograd accumulates into existing gradients exactly as in a run. One repetition is one forward
+ loss + backward with ``time.perf_counter`` marks:

- forward: a forward pre-hook on every parameterised layer marks where it starts; layer ``i``
  runs from its mark (the forward call's start for the first) to the next layer's mark (the loss's
  end for the last);
- backward: ``register_post_accumulate_grad_hook`` on every parameter (what the runtime's overlap
  uses to call a gradient ready) marks when a layer's last gradient landed; layers are ordered by
  that time and each runs from the previous one's mark (``backward()``'s call for the first) to
  its own (to ``backward()``'s return for the last, the first layer in forward order). So a
  layer's backward holds the backward of the activations after it and, for the last layer, the
  loss's.

Warm-up repetitions first, then ``repeats`` timed ones; each layer's time is the median of its
repetitions (``statistic="median"``), or the mean (``"mean"``): under time-slicing (more
processes than cores) a repetition that is preempted carries the wait, and only the mean
averages those waits in at the rate they happen; the median would drop them.

What else a ``sync-sgd`` step computes (update, casts, evaluation), profiles of several processes
at once and the ranks' skew: :mod:`workbench.bench.step`.

torch is imported here (this is ``workbench.bench``, not ``workbench.netsim``).
"""
from __future__ import annotations

import copy
import math
import statistics
import time
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..checks import integer
from ..netsim.profile import LayerProfile, profile_table

#: statistics a layer's repetitions can be summarised with
STATISTICS = ("median", "mean")
#: repetitions (timed, warm-up) by default
DEFAULT_REPEATS = 50
DEFAULT_WARMUP = 10


class LayerProfileError(ValueError):
    """A model or argument the profiler cannot take; the message names it."""


def parameterised_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(qualified name, module)`` of every module holding trainable parameters itself, in
    registration order."""
    out = []
    for name, module in model.named_modules():
        if any(p.requires_grad for p in module.parameters(recurse=False)):
            out.append((name or type(module).__name__, module))
    return out


def summarise(values: Sequence[float], statistic: str) -> float:
    return float(statistics.median(values) if statistic == "median" else statistics.fmean(values))


def check_timing(repeats: int, warmup: int, statistic: str) -> None:
    integer("repeats", repeats, 1, LayerProfileError)
    integer("warmup", warmup, 0, LayerProfileError)
    if statistic not in STATISTICS:
        raise LayerProfileError(f"statistic must be one of {', '.join(STATISTICS)}; got {statistic!r}")


def _inputs(model: nn.Module, sample, batch_size: int | None, target) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch and its labels: ``sample`` is a batch (a tensor) or one sample's shape."""
    if isinstance(sample, torch.Tensor):
        x = sample.detach()
        if batch_size is not None and x.shape[0] != batch_size:
            raise LayerProfileError(f"sample is a batch of {x.shape[0]}; batch_size says {batch_size}")
    else:
        try:
            shape = tuple(int(s) for s in sample)
        except TypeError:
            raise LayerProfileError("sample must be a batch (a tensor) or one sample's shape (a tuple of ints); "
                                    f"got {type(sample).__name__}") from None
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise LayerProfileError(f"batch_size must be an integer >= 1 with a sample shape; got {batch_size!r}")
        gen = torch.Generator().manual_seed(0)
        x = torch.rand((batch_size, *shape), generator=gen)
    if target is None:
        with torch.no_grad():
            out = model(x[:1])
        classes = out.shape[-1]
        target = torch.randint(0, classes, (x.shape[0],), generator=torch.Generator().manual_seed(1))
    return x, target


class _Marks:
    """The hooks of one profiled model: forward starts per layer, gradient-ready times per layer."""

    def __init__(self, layers: list[tuple[str, nn.Module]]) -> None:
        self.forward: dict[int, float] = {}
        self.ready: dict[int, float] = {}
        self.calls: dict[int, int] = {}
        self.handles = []
        for i, (_, module) in enumerate(layers):
            self.handles.append(module.register_forward_pre_hook(lambda _m, _a, i=i: self._start(i)))
            for p in module.parameters(recurse=False):
                if p.requires_grad:
                    self.handles.append(p.register_post_accumulate_grad_hook(lambda _p, i=i: self._ready(i)))

    def _start(self, i: int) -> None:
        self.calls[i] = self.calls.get(i, 0) + 1
        self.forward.setdefault(i, time.perf_counter())

    def _ready(self, i: int) -> None:
        self.ready[i] = time.perf_counter()   # the last of the layer's tensors wins

    def clear(self) -> None:
        self.forward.clear()
        self.ready.clear()
        self.calls.clear()

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _one_pass(model, flat, marks: _Marks, x, y, loss_fn) -> tuple[float, float, float, float]:
    """One forward + loss + backward: (forward start, loss end, backward call, backward return)."""
    flat.zero_grad()
    marks.clear()
    t0 = time.perf_counter()
    loss = loss_fn(model(x), y)
    t1 = time.perf_counter()
    t2 = time.perf_counter()
    loss.backward()
    t3 = time.perf_counter()
    return t0, t1, t2, t3


class _Profiler:
    """A model copy on a flat buffer, its hooks, a batch; :meth:`repetition` times one pass."""

    def __init__(self, model: nn.Module, sample, batch_size: int | None, target, loss_fn, after=()) -> None:
        from ..models import FlatParams
        self.model = copy.deepcopy(model)
        self.layers = parameterised_layers(self.model)
        if not self.layers:
            raise LayerProfileError("model has no trainable parameters: no layer to profile")
        self.flat = FlatParams(self.model)
        self.loss_fn = loss_fn
        self.x, self.y = _inputs(self.model, sample, batch_size, target)
        self.marks = _Marks(self.layers)
        # the forward order: the layers' first pre-hook calls in one pass
        _one_pass(self.model, self.flat, self.marks, self.x, self.y, loss_fn)
        missing = [self.layers[i][0] for i in range(len(self.layers)) if i not in self.marks.forward]
        if missing:
            raise LayerProfileError(f"layers {missing} hold parameters but never ran in forward")
        twice = [self.layers[i][0] for i, n in self.marks.calls.items() if n > 1]
        if twice:
            raise LayerProfileError(f"layers {twice} run more than once per forward (shared weights): "
                                    "one forward and backward interval per layer cannot describe them")
        self.order = sorted(self.marks.forward, key=self.marks.forward.get)   # forward order
        #: phases timed after each backward, in order: callables made from the flat parameters
        self.after = [make(self.flat) for make in after]

    def repetition(self) -> tuple[list[float], list[float], list[float]]:
        """Forward and backward seconds per layer (indices of :attr:`order`) of one pass, and the
        seconds of each phase of :attr:`after` run after it."""
        t0, t1, t2, t3 = _one_pass(self.model, self.flat, self.marks, self.x, self.y, self.loss_fn)
        starts = [self.marks.forward[i] for i in self.order]
        starts[0] = t0
        ends = starts[1:] + [t1]
        forward = [e - s for s, e in zip(starts, ends)]
        by_ready = sorted(range(len(self.order)), key=lambda k: self.marks.ready[self.order[k]])
        backward = [0.0] * len(self.order)
        previous = t2
        for rank, k in enumerate(by_ready):
            end = t3 if rank == len(by_ready) - 1 else self.marks.ready[self.order[k]]
            backward[k] = max(end - previous, 0.0)
            previous = end
        phases = []
        for phase in self.after:
            t = time.perf_counter()
            phase()
            phases.append(time.perf_counter() - t)
        return forward, backward, phases

    def result(self, forward_reps: list[list[float]], backward_reps: list[list[float]],
               statistic: str) -> list[LayerProfile]:
        out = []
        for k, i in enumerate(self.order):
            name, module = self.layers[i]
            tensors = tuple(p.numel() for p in module.parameters(recurse=False) if p.requires_grad)
            out.append(LayerProfile(f"{name}:{type(module).__name__}", sum(tensors),
                                    summarise([r[k] for r in forward_reps], statistic),
                                    summarise([r[k] for r in backward_reps], statistic), tensors))
        return out

    def close(self) -> None:
        self.marks.remove()


def time_calls(fn: Callable[[], object], repeats: int, warmup: int, keep_going: Callable[[], bool] | None = None,
           done: Callable[[], None] | None = None, before: Callable[[], None] | None = None) -> list:
    """``fn()`` ``warmup`` times untimed, then ``repeats`` times (its results); then, if
    ``keep_going`` is given, ``done()`` and more untimed calls while ``keep_going()``.
    ``before()`` (if given) runs before every call of the warm-up and the timed ones (a lock-step
    barrier: :func:`workbench.bench.step.profile_step`)."""
    def call():
        if before is not None:
            before()
        return fn()
    for _ in range(warmup):
        call()
    out = [call() for _ in range(repeats)]
    if keep_going is not None:
        done()
        while keep_going():
            fn()
    return out


def profile_model(model: nn.Module, sample, batch_size: int | None, target, repeats: int, warmup: int, statistic: str,
             loss_fn: Callable, after=(), sync=None, totals: list | None = None
             ) -> tuple[list[LayerProfile], list[float]]:
    """The layers, and each ``after`` phase's seconds (see :func:`profile_layers`). ``sync``: the
    barriers of concurrent profiles (:class:`workbench.bench.concurrent.Sync`); ``totals``: if a list, each
    timed repetition's whole seconds (forward + backward + phases) are appended to it."""
    check_timing(repeats, warmup, statistic)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        prof = _Profiler(model, sample, batch_size, target, loss_fn, after)
        try:
            hooks = ()
            if sync is not None:
                sync.barrier()
                hooks = (*sync.hooks(), sync.before)
            reps = time_calls(prof.repetition, repeats, warmup, *hooks)
            if totals is not None:
                totals.extend(sum(f) + sum(b) + sum(ph) for f, b, ph in reps)
            layers = prof.result([r[0] for r in reps], [r[1] for r in reps], statistic)
            return layers, [summarise([r[2][k] for r in reps], statistic) for k in range(len(prof.after))]
        finally:
            prof.close()
    finally:
        torch.set_num_threads(threads)


def profile_layers(model: nn.Module, sample, batch_size: int | None = None, *, target: torch.Tensor | None = None,
                   repeats: int = DEFAULT_REPEATS, warmup: int = DEFAULT_WARMUP, statistic: str = "median",
                   loss_fn: Callable = F.cross_entropy) -> list[LayerProfile]:
    """Forward and backward seconds of each parameterised layer of ``model`` on this CPU, one
    thread: a :class:`~workbench.netsim.profile.LayerProfile` per layer, in forward order, with
    its parameter tensors (registration order) in ``tensors``.

    ``sample``: a batch (a tensor: ``batch_size`` is then its length) or one sample's shape with
    ``batch_size`` (uniform random features). ``target``: the labels (default: random classes
    of the model's output width). ``model`` itself is not touched (a copy is profiled). See the
    module's text for what each interval holds and why ``statistic`` may be ``mean``.
    """
    return profile_model(model, sample, batch_size, target, repeats, warmup, statistic, loss_fn)[0]


# -- built-in models on their dataset's shapes --------------------------------------------------

def builtin_model(name: str, dataset: str):
    from .. import data, models
    if name not in models.BUILTIN_MODELS:
        raise LayerProfileError(f"model must be one of {', '.join(models.BUILTIN_MODELS)}; got {name!r}")
    info = data.describe(dataset)
    try:
        models.check_model(name, info.feature_shape, info.num_classes)
    except ValueError as exc:
        raise LayerProfileError(f"{exc} (dataset {dataset!r})") from None
    torch.manual_seed(0)
    return models.build(name, math.prod(info.feature_shape), info.num_classes), info


def profile_builtin(name: str, batch_size: int = 32, *, dataset: str = "digits", repeats: int = DEFAULT_REPEATS,
                    warmup: int = DEFAULT_WARMUP, statistic: str = "median") -> list[LayerProfile]:
    """:func:`profile_layers` of a built-in model (``mlp``, ``wide_mlp``, ``cnn``) built for
    ``dataset``'s shapes (digits: 64 features, 10 classes) at ``batch_size`` samples per step."""
    model, info = builtin_model(name, dataset)
    return profile_layers(model, info.feature_shape, batch_size, repeats=repeats, warmup=warmup, statistic=statistic)


# -- CSV -------------------------------------------------------------------------------------

def write_profile_csv(profile: Sequence[LayerProfile], path: str | Path) -> Path:
    """Write ``profile`` as the CSV :func:`~workbench.netsim.profile.profile_from_table` (and
    ``workbench predict --profile FILE.csv``) reads: ``name, parameters, forward_s, backward_s,
    tensors`` (``"65536+1024"``: weight + bias)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    profile_table(profile).to_csv(path, index=False, float_format="%.9g")
    return path
