"""What one ``sync-sgd`` step computes on this CPU, measured: the per-layer profile
(:mod:`workbench.bench.layers`) plus the update, fp16's casts and an evaluation, in one process
or in N at once, and how far apart N lock-step ranks finish (the predictor's ``skew_s``).

    from workbench.bench.step import profile_step
    step = profile_step("wide_mlp", 32)                                   # this process alone
    step = profile_step("wide_mlp", 32, processes=4, lockstep=True)       # 4 at once, a barrier per step
    step.layers, step.update_s, step.wire_cast_s["fp16"], step.evaluate_s, step.skew_s

**The rest of a step.** :func:`profile_step` times the update (:func:`update_phase`) and fp16's
casts (:func:`cast_phase`) as phases of the step loop after each backward, and one evaluation of
the test set (:func:`evaluate_seconds`).

**Concurrent profiles** (``processes=N``): N processes (``spawn``) profile the same model at once,
to see the compute the way N ranks on this machine see it, each in a session of its own; every
phase starts at a barrier and the load stays N processes throughout (:mod:`workbench.bench.concurrent`,
which runs them). The layer times are the mean over processes of each process's statistic
(default ``mean`` here: see :mod:`workbench.bench.layers` on time-slicing); each process's own
answer, with its session and ``"paused_s"``, is in ``per_process``.

**Lock-step** (``lockstep=True``, with ``processes=N``): every repetition starts at a spinning
barrier, the way ``sync-sgd``'s ranks meet at each step's all-reduce, and ``skew_s`` is
:func:`workbench.bench.concurrent.skew` of the processes' repetitions, forward + backward +
update: the straggler term of :func:`workbench.netsim.predict.predict`. Without ``lockstep``,
``skew_s`` is 0. ``pause_s`` (with ``lockstep``): seconds each process yields the CPU before each
meeting, as a rank waiting for its all-reduce (see :mod:`workbench.bench.concurrent`, "Pauses").

torch is imported here (this is ``workbench.bench``, not ``workbench.netsim``).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..netsim.profile import LayerProfile
from . import concurrent
from .layers import (DEFAULT_REPEATS, DEFAULT_WARMUP, LayerProfileError, builtin_model, check_timing, profile_model, summarise,
                     time_calls)

# -- the rest of a sync-sgd step ----------------------------------------------------------------
#
# The update and fp16's casts allocate several buffers the size of the model each step. Whether
# those allocations fault in fresh pages every step depends on what else the process allocated
# and freed (glibc's heap trimming): on wide_mlp the same update loop took 10 ms with 4,400 page
# faults per step, or 2 ms with none, depending on the loop around it. So profile_step times
# them as phases of the step loop itself, after each backward, in the order a sync-sgd step runs
# them, with the runtime's own code (the velocity rebound each step, as SyncSGD does).

def update_phase(ranks: int, lr: float = 0.05, momentum: float = 0.9) -> Callable:
    """``make(flat) -> update()``: :meth:`workbench.optim.sync.SyncSGD.step`'s update on the flat
    parameters (average the gradient sum, momentum SGD, copy back; the velocity is rebound)."""
    from ..optim import rules

    def make(flat):
        state = {"v": torch.zeros_like(flat.data)}

        def update():
            grad = flat.grad / ranks
            x, state["v"] = rules.momentum_sgd(flat.data, state["v"], grad, lr, momentum)
            flat.data.copy_(x)
        return update
    return make


def cast_phase(wire_dtype: str, ranks: int) -> Callable:
    """``make(flat) -> cast()``: the casts fp16/bf16 on the wire add to a step, on the whole flat
    gradient as one bucket, as :func:`workbench.comm.precision.wire_precision` does them: scale and
    cast to the wire dtype, check finite; after the all-reduce, cast back, unscale, check finite.
    The predictor has no term for them (its network model moves bytes only)."""
    from ..comm.options import WIRE_DTYPES
    from ..comm.precision import INITIAL_LOSS_SCALE
    if wire_dtype not in WIRE_DTYPES or wire_dtype == "fp32":
        raise LayerProfileError(f"wire_dtype must be fp16 or bf16; got {wire_dtype!r}")
    dtype = getattr(torch, WIRE_DTYPES[wire_dtype])
    scale = INITIAL_LOSS_SCALE if wire_dtype == "fp16" else 1.0

    def make(flat):
        tensor = flat.grad

        def cast():
            wire = (tensor * (scale / ranks)).to(dtype)
            bool(torch.isfinite(wire).all())
            tensor.copy_(wire.to(tensor.dtype) * (ranks / scale))
            bool(torch.isfinite(tensor).all())
        return cast
    return make


def _seconds(fn: Callable[[], object], repeats: int, warmup: int, statistic: str, sync=None) -> float:
    def timed():
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t
    if sync is not None:
        sync.barrier()
    return summarise(time_calls(timed, repeats, warmup, *(sync.hooks() if sync is not None else ())), statistic)


class _Pool:
    """Just enough of :class:`~workbench.models.FlatParams` for the phases: ``data`` and ``grad``."""

    def __init__(self, parameters: int) -> None:
        self.data, self.grad = torch.zeros(parameters), torch.rand(parameters) * 1e-3


def update_seconds(parameters: int, ranks: int = 4, *, repeats: int = DEFAULT_REPEATS, warmup: int = DEFAULT_WARMUP,
                   statistic: str = "median") -> float:
    """:func:`update_phase` alone on ``parameters`` float32 elements, in a loop of its own
    (allocation effects may differ from a run's: :func:`profile_step` times it in the step loop)."""
    check_timing(repeats, warmup, statistic)
    return _seconds(update_phase(ranks)(_Pool(parameters)), repeats, warmup, statistic)


def wire_cast_seconds(parameters: int, wire_dtype: str = "fp16", ranks: int = 4, *, repeats: int = DEFAULT_REPEATS,
                      warmup: int = DEFAULT_WARMUP, statistic: str = "median") -> float:
    """:func:`cast_phase` alone on ``parameters`` elements, in a loop of its own."""
    make = cast_phase(wire_dtype, ranks)
    check_timing(repeats, warmup, statistic)
    return _seconds(make(_Pool(parameters)), repeats, warmup, statistic)


def evaluate_seconds(model: nn.Module, X: torch.Tensor, y: torch.Tensor, *, repeats: int = 10, warmup: int = 2,
                     statistic: str = "median", _sync=None) -> float:
    """Seconds of one evaluation as :meth:`~workbench.runtime.rank.context.Context.evaluate` runs
    it (rank 0, at every evaluation point): forward of the whole test set, loss and accuracy."""
    check_timing(repeats, warmup, statistic)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)

    @torch.no_grad()
    def evaluate():
        out = model(X)
        F.cross_entropy(out, y).item()
        (out.argmax(1) == y).float().mean().item()
    try:
        return _seconds(evaluate, repeats, warmup, statistic, _sync)
    finally:
        torch.set_num_threads(threads)


@dataclass
class StepProfile:
    """What one ``sync-sgd`` step computes, measured: ``layers`` (forward order), ``update_s``
    (:func:`update_phase`), ``wire_cast_s`` (wire dtype -> :func:`cast_phase`),
    ``evaluate_s`` (:func:`evaluate_seconds` on the dataset's test set), at ``batch_size`` per
    rank; ``processes`` profiled at once, each layer's repetitions summarised by ``statistic``;
    ``skew_s``: the slowest process's extra seconds per lock-step repetition (0 unless
    ``lockstep``; see the module's text); ``pause_s``: the seconds each process yielded before
    each lock-step meeting."""

    model: str
    dataset: str
    batch_size: int
    layers: list[LayerProfile]
    update_s: float
    wire_cast_s: dict[str, float]
    evaluate_s: float
    processes: int = 1
    statistic: str = "median"
    repeats: int = DEFAULT_REPEATS
    skew_s: float = 0.0
    lockstep: bool = False
    pause_s: float = 0.0
    per_process: list[dict] = field(default_factory=list, repr=False)

    @property
    def parameters(self) -> int:
        return sum(layer.parameters for layer in self.layers)

    @property
    def forward_s(self) -> float:
        return sum(layer.forward_s for layer in self.layers)

    @property
    def backward_s(self) -> float:
        return sum(layer.backward_s for layer in self.layers)

    def scaled(self, factor: float) -> "StepProfile":
        """Every compute time times ``factor`` (e.g. ranks / cores for oversubscribed ranks)."""
        return replace(self, layers=[replace(l, forward_s=l.forward_s * factor, backward_s=l.backward_s * factor)
                                     for l in self.layers],
                       update_s=self.update_s * factor, wire_cast_s={k: v * factor for k, v in self.wire_cast_s.items()},
                       evaluate_s=self.evaluate_s * factor, skew_s=self.skew_s * factor, per_process=[])

    def mean_with(self, *others: "StepProfile") -> "StepProfile":
        """The mean of this profile and ``others`` (the same model, batch and layers, measured at
        other times): every time averaged; e.g. profiles taken before and after a run, so that a
        load that drifts while it runs is averaged in. LayerProfileError if they differ."""
        every = (self, *others)
        if any((o.model, o.batch_size, [(l.name, l.tensors) for l in o.layers])
               != (self.model, self.batch_size, [(l.name, l.tensors) for l in self.layers]) for o in others):
            raise LayerProfileError("profiles to average must be of the same model, batch_size and layers")
        mean = statistics.fmean
        layers = [replace(l, forward_s=mean(o.layers[k].forward_s for o in every),
                          backward_s=mean(o.layers[k].backward_s for o in every)) for k, l in enumerate(self.layers)]
        return replace(self, layers=layers, update_s=mean(o.update_s for o in every),
                       wire_cast_s={d: mean(o.wire_cast_s[d] for o in every) for d in self.wire_cast_s},
                       evaluate_s=mean(o.evaluate_s for o in every), skew_s=mean(o.skew_s for o in every),
                       pause_s=mean(o.pause_s for o in every), per_process=[])

    def to_dict(self) -> dict:
        out = asdict(self)   # the layers too
        out.update(parameters=self.parameters, forward_s=self.forward_s, backward_s=self.backward_s)
        return out


def _measure_step(name: str, batch_size: int, dataset: str, repeats: int, warmup: int, statistic: str,
                  wire_dtypes: Sequence[str], ranks: int, sync: concurrent.Sync | None) -> dict:
    """Everything :class:`StepProfile` holds, measured in this process (as a dict: it crosses
    process boundaries): the step loop (forward, backward, update) for the layers and the update;
    once more per wire dtype with its casts before the update, for the casts."""
    from .. import data
    torch.set_num_threads(1)
    model, info = builtin_model(name, dataset)
    totals: list[float] = []
    layers, (update,) = profile_model(model, info.feature_shape, batch_size, None, repeats, warmup, statistic,
                                 F.cross_entropy, after=(update_phase(ranks),), sync=sync, totals=totals)
    casts = {}
    for dtype in wire_dtypes:
        _, (casts[dtype], _) = profile_model(model, info.feature_shape, batch_size, None, repeats, warmup, statistic,
                                        F.cross_entropy, after=(cast_phase(dtype, ranks), update_phase(ranks)),
                                        sync=sync)
    test = data.load(dataset)
    evaluate = evaluate_seconds(model, test.X_test, test.y_test, repeats=max(3, repeats // 5),
                                warmup=max(1, warmup // 5), statistic=statistic, _sync=sync)
    return {"layers": [asdict(l) for l in layers], "update_s": update, "wire_cast_s": casts, "evaluate_s": evaluate,
            "totals": totals}


def profile_step(name: str, batch_size: int = 32, *, dataset: str = "digits", processes: int = 1,
                 repeats: int = DEFAULT_REPEATS, warmup: int = DEFAULT_WARMUP, statistic: str | None = None,
                 wire_dtypes: Sequence[str] = ("fp16",), ranks: int = 4, lockstep: bool = False,
                 pause_s: float = 0.0, timeout: float = 600) -> StepProfile:
    """A built-in model's whole ``sync-sgd`` step measured (:class:`StepProfile`).

    ``processes=1``: in this process. ``processes=N``: N ``spawn`` processes measure at once (see
    the module's text); the result is the mean over processes of each one's ``statistic``
    (default ``median`` alone, ``mean`` with N > 1). ``ranks``: the run's rank count (the update
    divides the gradient sum by it; the casts scale by it). ``lockstep`` (needs ``processes`` > 1):
    a spinning barrier before every repetition, and ``skew_s`` measured (see the module's text);
    ``pause_s`` (with ``lockstep``): seconds each process yields the CPU before each meeting.
    """
    statistic = statistic or ("median" if processes == 1 else "mean")
    check_timing(repeats, warmup, statistic)
    concurrent.check_processes(processes, lockstep, pause_s)
    args = (name, batch_size, dataset, repeats, warmup, statistic, tuple(wire_dtypes), ranks)
    if processes == 1:
        threads = torch.get_num_threads()
        try:
            results = [_measure_step(*args, sync=None)]
        finally:
            torch.set_num_threads(threads)
    else:
        builtin_model(name, dataset)   # a bad name fails here, not in N children
        results = concurrent.run(_measure_step, args, processes, lockstep=lockstep, pause_s=pause_s, timeout=timeout)
    n = len(results)
    first = [LayerProfile(**{**l, "tensors": tuple(l["tensors"])}) for l in results[0]["layers"]]
    layers = [LayerProfile(l.name, l.parameters, sum(r["layers"][k]["forward_s"] for r in results) / n,
                           sum(r["layers"][k]["backward_s"] for r in results) / n, l.tensors)
              for k, l in enumerate(first)]
    return StepProfile(name, dataset, batch_size, layers,
                       sum(r["update_s"] for r in results) / n,
                       {d: sum(r["wire_cast_s"][d] for r in results) / n for d in wire_dtypes},
                       sum(r["evaluate_s"] for r in results) / n, processes, statistic, repeats,
                       concurrent.skew([r["totals"] for r in results]) if lockstep else 0.0, lockstep, pause_s,
                       per_process=results if n > 1 else [])
