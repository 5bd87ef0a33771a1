"""A burst-parallel plan: per layer, how many GPUs (its data-parallel width), which ones, how
its share of the global batch is split, and what it is predicted to cost; the activation
transfers between layers of different widths; and the iteration as a per-GPU timeline.

Both cost models (``workbench``, :mod:`workbench.burst.planner`; ``deeppool``,
:mod:`workbench.burst.deeppool`) return a :class:`BurstPlan`; the executor
(:mod:`workbench.burst.execute`), the multiplexing simulation (:mod:`workbench.burst.multiplex`)
and ``workbench plan --json`` read it. Times are milliseconds.

JSON (``BurstPlan.to_dict``; the contract of ``workbench plan --json``)::

    {"iteration_ms", "gpu_ms", "gpus_used", "model", "batch", "gpus", "cost_model", "amplification",
     "data_parallel", "layers": [{"id", "type", "gpus", "ranks", "batch_per_gpu", "samples",
     "compute_ms", "sync_ms", "transfer_ms", "start_ms", "end_ms", "amplification"}, ...],
     "transfers": [{"src", "dst", "src_ranks", "dst_ranks", "bytes", "ms"}, ...]}

``samples`` lists, per rank of the layer (in ``ranks`` order), the ``[start, stop)`` range of
the global batch it holds: contiguous, equal shares, together exactly ``range(batch)``.

Pure Python: no torch, no MPI.
"""
from __future__ import annotations

import json
import math
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .graph import BurstError

#: cost models a plan can come from
COST_MODELS = ("workbench", "deeppool")


def sample_ranges(batch: int, gpus: int) -> list[tuple[int, int]]:
    """Equal contiguous shares of ``range(batch)`` over ``gpus`` GPUs (``batch`` divisible)."""
    if gpus < 1 or batch % gpus:
        raise BurstError(f"batch {batch} must be divisible by the layer's GPU count {gpus}")
    share = batch // gpus
    return [(r * share, (r + 1) * share) for r in range(gpus)]


@dataclass
class LayerPlan:
    """One layer's place in the plan (see the module's text)."""

    id: int
    type: str
    gpus: int
    ranks: tuple[int, ...]
    batch_per_gpu: int
    compute_ms: float
    sync_ms: float
    transfer_ms: float
    start_ms: float = 0.0
    end_ms: float = 0.0
    amplification: float = 1.0
    samples: list[tuple[int, int]] = field(default_factory=list)

    @property
    def time_ms(self) -> float:
        """Transfer in + compute + gradient sync: the layer's time on each of its GPUs."""
        return self.transfer_ms + self.compute_ms + self.sync_ms

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ranks"] = list(self.ranks)
        d["samples"] = [list(s) for s in self.samples]
        return d


@dataclass
class ActivationTransfer:
    """Activations (and, in backward, their gradients) moving from layer ``src`` on
    ``src_ranks`` to layer ``dst`` on ``dst_ranks``: ``bytes`` one way, ``ms`` both ways."""

    src: int
    dst: int
    src_ranks: tuple[int, ...]
    dst_ranks: tuple[int, ...]
    bytes: float
    ms: float

    def to_dict(self) -> dict:
        d = asdict(self)
        d["src_ranks"], d["dst_ranks"] = list(self.src_ranks), list(self.dst_ranks)
        return d


@dataclass(frozen=True)
class Busy:
    """GPU ``gpu`` busy with ``layer`` from ``start_ms`` to ``end_ms`` doing ``what``
    (``transfer``, ``compute`` or ``sync``)."""

    gpu: int
    start_ms: float
    end_ms: float
    layer: int
    what: str


@dataclass
class BurstPlan:
    """A plan for one iteration (see the module's text)."""

    model: str
    batch: int
    gpus: int
    cost_model: str
    layers: list[LayerPlan]
    iteration_ms: float
    gpu_ms: float
    gpus_used: int
    amplification: float | None = None
    data_parallel: bool = False
    transfers: list[ActivationTransfer] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.cost_model not in COST_MODELS:
            raise BurstError(f"cost_model must be one of {', '.join(COST_MODELS)}; got {self.cost_model!r}")

    def layer(self, layer_id: int) -> LayerPlan:
        return self.layers[[l.id for l in self.layers].index(layer_id)]

    def widths(self) -> dict[int, int]:
        """Layer id -> GPU count."""
        return {l.id: l.gpus for l in self.layers}

    def timeline(self) -> list[Busy]:
        """Per-GPU busy intervals of one iteration, from each layer's ``start_ms`` and its
        transfer, compute and sync times on each of its ranks."""
        out = []
        for l in self.layers:
            t = l.start_ms
            for what, ms in (("transfer", l.transfer_ms), ("compute", l.compute_ms), ("sync", l.sync_ms)):
                if ms > 0:
                    out += [Busy(g, t, t + ms, l.id, what) for g in l.ranks]
                t += ms
        return sorted(out, key=lambda b: (b.gpu, b.start_ms))

    def busy_ms(self) -> dict[int, float]:
        """GPU -> busy milliseconds in one iteration."""
        out = {g: 0.0 for g in range(self.gpus_used)}
        for b in self.timeline():
            out[b.gpu] = out.get(b.gpu, 0.0) + b.end_ms - b.start_ms
        return out

    def idle_windows(self, min_ms: float = 0.0) -> dict[int, list[tuple[float, float]]]:
        """GPU -> its idle ``(start, end)`` windows within ``[0, iteration_ms)`` (the GPUs of the
        job, ``range(gpus)``), windows shorter than ``min_ms`` left out."""
        busy: dict[int, list[tuple[float, float]]] = {g: [] for g in range(max(self.gpus, self.gpus_used))}
        for b in self.timeline():
            busy.setdefault(b.gpu, []).append((b.start_ms, b.end_ms))
        out = {}
        for g, spans in busy.items():
            windows, t = [], 0.0
            for s, e in sorted(spans):
                if s > t:
                    windows.append((t, s))
                t = max(t, e)
            if t < self.iteration_ms:
                windows.append((t, self.iteration_ms))
            out[g] = [(s, e) for s, e in windows if e - s > min_ms and e - s > 1e-12]
        return out

    def to_dict(self) -> dict:
        amp = self.amplification
        return {"iteration_ms": self.iteration_ms, "gpu_ms": self.gpu_ms, "gpus_used": self.gpus_used,
                "model": self.model, "batch": self.batch, "gpus": self.gpus, "cost_model": self.cost_model,
                "amplification": "inf" if amp is not None and math.isinf(amp) else amp,
                "data_parallel": self.data_parallel, "layers": [l.to_dict() for l in self.layers],
                "transfers": [t.to_dict() for t in self.transfers]}

    def write_json(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1))
        return path

    @classmethod
    def from_dict(cls, d: dict) -> "BurstPlan":
        layers = [LayerPlan(**{**l, "ranks": tuple(l["ranks"]), "samples": [tuple(s) for s in l.get("samples", [])]})
                  for l in d["layers"]]
        transfers = [ActivationTransfer(**{**t, "src_ranks": tuple(t["src_ranks"]),
                                           "dst_ranks": tuple(t["dst_ranks"])}) for t in d.get("transfers", [])]
        amp = d.get("amplification")
        amp = math.inf if amp == "inf" else amp
        return cls(d["model"], d["batch"], d["gpus"], d["cost_model"], layers, d["iteration_ms"], d["gpu_ms"],
                   d["gpus_used"], amp, d.get("data_parallel", False), transfers)


#: the classes' names before issue 23 (``Plan``: also ``vcluster.plan.Plan``, ``comm.executor.Plan``;
#: ``Transfer``: also ``schedules.Transfer``), importable for one release with a DeprecationWarning
RENAMED = {"Plan": "BurstPlan", "Transfer": "ActivationTransfer"}


def renamed(name: str, where: str = __name__):
    """The class once called ``name`` (a key of :data:`RENAMED`), with a DeprecationWarning."""
    new = RENAMED[name]
    warnings.warn(f"{where}.{name} is deprecated: it is {new} now (import it from workbench.burst); the old "
                  f"name goes in the next release", DeprecationWarning, stacklevel=3)
    return globals()[new]


def __getattr__(name: str):
    if name in RENAMED:
        return renamed(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
