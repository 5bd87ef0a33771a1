"""The workbench's cost model for burst-parallel plans: what a layer costs at data-parallel
width ``g`` (a power of two) with global batch ``B``, in microseconds.

**compute(L, g)**: the profiled forward + backward time of layer ``L`` at per-GPU batch
``b = B / g`` (:class:`~workbench.burst.graph.ProfileTable`, ``avg_us``), exact where ``b`` was
measured. Between two measured sizes ``b0 < b < b1`` it is interpolated linearly in the batch,
``t(b0) + (t(b1) - t(b0)) (b - b0) / (b1 - b0)``: a layer's time is a fixed launch cost plus a
per-sample slope that changes only where the GPU's occupancy does, so a straight line between
the two nearest measurements is exact on any affine stretch, stays between the two measured
values and assumes nothing beyond them. Outside the measured range (or for a layer with no row
while other layers of its type have rows) it is a :class:`BurstError` naming the layer and the
sizes measured: nothing is extrapolated. A layer *type* with no row at all in the table (the A100
Inception table has no ``concat``, ``adAvgPool2d``, ``flatten`` or ``linear`` rows) follows
``missing``: ``"error"`` (the default, right for a table measured here) or ``"zero"`` (those
layers compute in no time; :meth:`CostModel.paper` uses it for the shipped tables, where the
published planner charges 1 us instead: 18 us per Inception iteration at most).

**sync(L, g)**: the all-reduce of ``L``'s true gradient bytes over its ``g`` GPUs, by the netsim
model ``network`` (``network.allreduce(nbytes, g)``; ring by default, any schedule name through
:class:`~workbench.netsim.costs.Simulated`); 0 at ``g = 1``. Bytes = ``(paramCount + bn) x
bytes_per_value``; ``bn = 2 x out_channels`` for each ``conv2d`` when ``batchnorm`` says the
layer list leaves out one BatchNorm (weight and bias) per conv. ``batchnorm="auto"`` decides it
from the model file: the omitted parameters (``totalParamCount`` minus the listed ones) are
exactly ``2 x`` the convs' output channels for Inception-v3 (34,432: every conv is conv+BN+ReLU)
and WRN-101-2 (128: the BatchNorm after ``conv1``), and 0 for VGG-16 (no BatchNorm).

**act(src -> dst)**: redistributing ``src``'s output activations to ``dst``'s GPUs. Each layer
holds contiguous equal shares of the batch (:func:`~workbench.burst.plan.sample_ranges`) on its
ranks, in order; a sample moves when its owning GPU changes. Every (sending GPU, receiving GPU)
pair is one point-to-point message of ``samples x elements x bytes_per_value`` bytes
(``elements``: ``src``'s output values per sample). Links are full duplex: a GPU's sends go one
after another, so do its receives, and the two overlap. One way takes
``max over GPUs and directions of (messages x latency + bytes / bandwidth)``; forward plus the
activation gradients in backward: ``act = 2 x`` that. A join's inputs (several edges) are summed
per GPU before the maximum. ``latency`` and ``bandwidth`` are ``network``'s own unless
``transfer_latency_us`` / ``transfer_bandwidth`` say otherwise.

**Constants.** :meth:`CostModel.paper`: the published 2.66e5 bytes/us per link and 240 us per
transfer, applied to every point-to-point message, the all-reduce's steps included (a ring on
``g`` GPUs has ``2 (g - 1)`` steps: 3.4 ms of latency per layer at 8 GPUs, where the published
planner charges its sync no latency at all; ``paper(sync_latency_us=...)`` sets the steps' own).
:meth:`CostModel.calibrated`: this machine's fitted link (``workbench calibrate``).

**Amplification** (what the planner limits): ``g x (act_in + compute + sync) / compute(L, 1)``;
layers with ``compute(L, 1) <= exempt_us`` are exempt (see :mod:`workbench.burst.planner`).

    cost = CostModel.paper()                      # 2.66e5 bytes/us, 240 us per transfer, ring
    cost = CostModel.calibrated("benchmarks/results/allreduce_4ranks.json")   # this machine
    bound = cost.bind(model, table, batch=32)
    bound.compute(layer_id, g), bound.sync(layer_id, g), bound.act(src_id, range(2), range(8))

Pure Python: no torch, no MPI.
"""
from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Sequence

from ..checks import integer
from .graph import BurstError, Layer, ModelGraph, ProfileTable

#: the published planner's link bandwidth, bytes per microsecond ("2128 Gbps")
PAPER_BANDWIDTH = 2.66e5
#: the published planner's cost of one transfer, microseconds
PAPER_LATENCY_US = 240.0
#: per ring step of the gradient all-reduce in the paper-scale studies, microseconds (see paper())
PAPER_SYNC_LATENCY_US = 5.0
#: layers this fast on one GPU (us) are exempt from the amplification limit (the published value)
EXEMPT_US = 300.0
MISSING = ("error", "zero")


def _network(bandwidth_bytes_per_us: float, latency_us: float, collective: str):
    from ..netsim import costs
    bandwidth, latency = bandwidth_bytes_per_us * 1e6, latency_us * 1e-6
    if collective in costs.CLOSED_FORMS:
        return costs.AlphaBeta(bandwidth, latency, collective)
    return costs.Simulated(bandwidth, latency, collective)


@lru_cache(maxsize=4096)
def traffic(batch: int, src_ranks: tuple[int, ...], dst_ranks: tuple[int, ...]) -> tuple[tuple[int, int, int], ...]:
    """The point-to-point messages that move a batch from ``src_ranks`` to ``dst_ranks`` (each
    holding contiguous equal shares in order): ``((from_gpu, to_gpu, samples), ...)``, samples
    that stay on their GPU left out."""
    s, d = batch // len(src_ranks), batch // len(dst_ranks)
    pairs: dict[tuple[int, int], int] = {}
    pos = 0
    while pos < batch:
        i, j = pos // s, pos // d
        nxt = min((i + 1) * s, (j + 1) * d)
        a, b = src_ranks[i], dst_ranks[j]
        if a != b:
            pairs[a, b] = pairs.get((a, b), 0) + nxt - pos
        pos = nxt
    return tuple((a, b, n) for (a, b), n in pairs.items())


def moved_samples(batch: int, src_ranks: Sequence[int], dst_ranks: Sequence[int]) -> int:
    """Samples whose owning GPU changes between the two layouts."""
    return sum(n for _, _, n in traffic(batch, tuple(src_ranks), tuple(dst_ranks)))


@dataclass(frozen=True)
class CostModel:
    """The network and every constant of the cost model (see the module's text).

    ``network``: a :mod:`workbench.netsim.costs` model (``allreduce``, ``latency`` s,
    ``bandwidth`` B/s; default the published 2.66e5 bytes/us and 240 us per transfer, ring);
    ``bytes_per_value`` 4 (fp32); ``missing`` ``"error"`` or ``"zero"`` for layer types without
    rows; ``batchnorm`` ``"auto"``, True or False; ``interpolate`` between measured batches;
    ``exempt_us``: amplification exemption threshold on the single-GPU time (0: none);
    ``transfer_latency_us`` / ``transfer_bandwidth`` (bytes/us): the activation messages' own,
    where they differ from ``network``'s (None: ``network``'s); ``cores``: processors the ranks
    share (None: every GPU its own). On a host with fewer cores than ranks (this machine: 4 ranks,
    2 cores) a layer on g ranks computes ``max(1, g / cores)`` times its profiled time (time-
    slicing; concurrent branches are not charged for each other)."""

    network: Any = None
    bytes_per_value: int = 4
    missing: str = "error"
    batchnorm: Any = "auto"
    interpolate: bool = True
    exempt_us: float = EXEMPT_US
    transfer_latency_us: float | None = None
    transfer_bandwidth: float | None = None
    name: str = "custom"
    cores: int | None = None

    def __post_init__(self) -> None:
        if self.cores is not None and not (isinstance(self.cores, int) and not isinstance(self.cores, bool)
                                           and self.cores >= 1):
            raise BurstError(f"cost model: cores must be an integer >= 1 or None; got {self.cores!r}")
        if self.network is None:
            object.__setattr__(self, "network", _network(PAPER_BANDWIDTH, PAPER_LATENCY_US, "ring"))
        for attr in ("allreduce", "latency", "bandwidth"):
            if not hasattr(self.network, attr):
                raise BurstError(f"cost model: network must be a workbench.netsim.costs model (AlphaBeta, "
                                 f"Simulated); got {type(self.network).__name__}")
        if self.missing not in MISSING:
            raise BurstError(f"cost model: missing must be one of {', '.join(MISSING)}; got {self.missing!r}")
        if self.batchnorm not in ("auto", True, False):
            raise BurstError(f"cost model: batchnorm must be 'auto', True or False; got {self.batchnorm!r}")
        integer("cost model: bytes_per_value", self.bytes_per_value, 1, BurstError)
        if not (isinstance(self.exempt_us, (int, float)) and self.exempt_us >= 0):
            raise BurstError(f"cost model: exempt_us must be a number >= 0; got {self.exempt_us!r}")
        for name in ("transfer_latency_us", "transfer_bandwidth"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and 0 <= value < math.inf
                                          and (value > 0 or name == "transfer_latency_us")):
                raise BurstError(f"cost model: {name} must be a finite number "
                                 f"{'>= 0' if name == 'transfer_latency_us' else '> 0'}; got {value!r}")

    @classmethod
    def paper(cls, bandwidth: float = PAPER_BANDWIDTH, latency_us: float = PAPER_LATENCY_US,
              collective: str = "ring", missing: str = "zero", sync_latency_us: float | None = PAPER_SYNC_LATENCY_US,
              **options) -> "CostModel":
        """The published constants: ``bandwidth`` bytes/us per link, ``latency_us`` per activation
        transfer (DeepPool's 240 us: a host-orchestrated redistribution). The gradient all-reduce is
        a collective library's ring, whose steps cost ``sync_latency_us`` each (default 5 us, the
        project's per-step latency for an InfiniBand/NVLink-class network, as in
        :data:`workbench.netsim.costs.DEFAULT_LATENCY`; the published planner charges its sync no
        latency at all; ``None`` charges 240 us per ring step, which keeps every plan at <= 4 GPUs);
        ``missing="zero"`` for the shipped tables' unprofiled Inception layers."""
        step = latency_us if sync_latency_us is None else sync_latency_us
        options.setdefault("transfer_latency_us", latency_us)
        return cls(_network(bandwidth, step, collective), missing=missing, name="paper", **options)

    @classmethod
    def calibrated(cls, calibration, collective: str = "ring", **options) -> "CostModel":
        """This machine's network: a :class:`~workbench.netsim.calibration.Calibration` or a
        ``workbench bench allreduce --json`` file (fitted on a bus of its ranks, as ``workbench
        calibrate`` does), through :func:`workbench.netsim.costs.from_calibration`."""
        from ..netsim import costs
        from ..netsim.calibration import calibrate_file
        if isinstance(calibration, (str, Path)):
            try:
                calibration = calibrate_file(calibration)
            except (OSError, ValueError) as exc:
                raise BurstError(f"calibration: {calibration}: {exc}") from None
        try:
            network = costs.from_calibration(calibration, collective)
        except costs.CostError as exc:
            raise BurstError(f"cost model: {exc}") from None
        return cls(network, name="calibrated", **options)

    @property
    def latency_us(self) -> float:
        """Microseconds per activation message."""
        if self.transfer_latency_us is not None:
            return float(self.transfer_latency_us)
        return float(self.network.latency) * 1e6

    @property
    def bandwidth(self) -> float:
        """Activation bytes per microsecond."""
        if self.transfer_bandwidth is not None:
            return float(self.transfer_bandwidth)
        return float(self.network.bandwidth) / 1e6

    def describe(self) -> str:
        return (f"{self.name}: transfers {self.bandwidth:.4g} bytes/us ({self.bandwidth * 8e6 / 1e9:.4g} Gbit/s) "
                f"and {self.latency_us:.4g} us per message; all-reduce {self.network.describe()}; "
                f"unprofiled layer types: {self.missing}; amplification exemption {self.exempt_us:g} us")

    # -- the three terms -------------------------------------------------------------------

    def compute_us(self, table: ProfileTable, layer: Layer, per_gpu_batch: int, unprofiled_type: bool = False) -> float:
        """Forward + backward us of ``layer`` at ``per_gpu_batch`` samples per GPU (see the module's
        text); ``unprofiled_type``: no layer of this type has a row (``missing`` applies)."""
        found = table.get(layer, per_gpu_batch)
        if found is not None:
            return found.avg_us
        have = table.batches(layer)
        if not have:
            if unprofiled_type and self.missing == "zero":
                return 0.0
            why = (f"no layer of type {layer.type} has a row (`--missing zero` or CostModel(missing='zero') "
                   "costs such layers 0)"
                   if unprofiled_type else "other layers of its type have rows: the profile does not match the model")
            raise BurstError(f"profile {table.source or '(table)'} has no row for layer {layer.id} ({layer.type}) "
                             f"at any batch size; {why}")
        if self.interpolate and have[0] < per_gpu_batch < have[-1]:
            k = bisect_left(have, per_gpu_batch)
            b0, b1 = have[k - 1], have[k]
            t0, t1 = table.time(layer, b0).avg_us, table.time(layer, b1).avg_us
            return t0 + (t1 - t0) * (per_gpu_batch - b0) / (b1 - b0)
        raise BurstError(f"profile {table.source or '(table)'} has no row for layer {layer.id} ({layer.type}) at "
                         f"per-GPU batch {per_gpu_batch}, outside the measured batches {list(have)} "
                         f"(no extrapolation)")

    def param_bytes(self, model: ModelGraph, layer: Layer) -> int:
        """The layer's true gradient bytes (see the module's text: BatchNorm counted)."""
        extra = 2 * _out_channels(layer) if layer.type == "conv2d" and self.has_batchnorm(model) else 0
        return (layer.param_count + extra) * self.bytes_per_value

    def has_batchnorm(self, model: ModelGraph) -> bool:
        if self.batchnorm != "auto":
            return bool(self.batchnorm)
        omitted = (model.total_params or model.params) - model.params
        convs = sum(2 * _out_channels(l) for l in model.layers if l.type == "conv2d")
        return omitted > 0 and omitted == convs

    def sync_us(self, nbytes: float, g: int) -> float:
        """All-reduce of ``nbytes`` over ``g`` GPUs by ``network``, us; 0 when ``g == 1`` or no bytes."""
        if g <= 1 or nbytes <= 0:
            return 0.0
        return float(self.network.allreduce(float(nbytes), int(g))) * 1e6

    def act_us(self, batch: int, edges: Iterable[tuple[Sequence[int], Sequence[int], int]]) -> float:
        """Forward + backward us to redistribute ``edges`` ``(src_ranks, dst_ranks, elements per
        sample)`` at once (summed per GPU, the busiest GPU and direction decides)."""
        alpha, beta, bpv = self.latency_us, self.bandwidth, self.bytes_per_value
        load: dict[tuple[int, int], list[float]] = {}
        for src, dst, elements in edges:
            for a, b, n in traffic(batch, tuple(src), tuple(dst)):
                for key in ((a, 0), (b, 1)):
                    entry = load.setdefault(key, [0, 0.0])
                    entry[0] += 1
                    entry[1] += n * elements * bpv
        if not load:
            return 0.0
        return 2.0 * max(m * alpha + nbytes / beta for m, nbytes in load.values())

    def bind(self, model: ModelGraph, table: ProfileTable, batch: int) -> "BoundCosts":
        return BoundCosts(self, model, table, batch)


def _out_channels(layer: Layer) -> int:
    if "out_channels" in layer.params:
        return int(layer.params["out_channels"])
    return int(layer.output_dim[0]) if isinstance(layer.output_dim, tuple) else int(layer.output_dim)


@dataclass
class BoundCosts:
    """A :class:`CostModel` for one model, table and global batch, with its terms cached (us)."""

    cost: CostModel
    model: ModelGraph
    table: ProfileTable
    batch: int
    _cache: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        profiled = {l.type for l in self.model.layers if self.table.batches(l)}
        self.unprofiled = {l.type for l in self.model.layers} - profiled

    def compute(self, lid: int, g: int) -> float:
        key = ("c", lid, g)
        if key not in self._cache:
            layer = self.model.layers[lid]
            if self.batch % g:
                raise BurstError(f"batch {self.batch} must be divisible by the layer's GPU count {g}")
            shared = max(1.0, g / self.cost.cores) if self.cost.cores else 1.0
            self._cache[key] = shared * self.cost.compute_us(self.table, layer, self.batch // g,
                                                             layer.type in self.unprofiled)
        return self._cache[key]

    def single(self, lid: int) -> float:
        """compute(L, 1) read at per-GPU batch B: the denominator of the amplification."""
        return self.compute(lid, 1)

    def sync(self, lid: int, g: int) -> float:
        key = ("s", lid, g)
        if key not in self._cache:
            self._cache[key] = self.cost.sync_us(self.cost.param_bytes(self.model, self.model.layers[lid]), g)
        return self._cache[key]

    def act(self, src: int, src_ranks: Sequence[int], dst_ranks: Sequence[int]) -> float:
        """One edge from layer ``src`` (its output per sample), us both ways."""
        key = ("a", src, tuple(src_ranks), tuple(dst_ranks))
        if key not in self._cache:
            elements = self.model.layers[src].output_elements
            self._cache[key] = self.cost.act_us(self.batch, [(src_ranks, dst_ranks, elements)])
        return self._cache[key]

    def act_many(self, edges: Iterable[tuple[int, Sequence[int], Sequence[int]]]) -> float:
        """Several edges ``(src layer, src_ranks, dst_ranks)`` into one layer at once, us."""
        key = ("m",) + tuple((i, tuple(s), tuple(d)) for i, s, d in edges)
        if key not in self._cache:
            self._cache[key] = self.cost.act_us(self.batch, [(s, d, self.model.layers[i].output_elements)
                                                             for i, s, d in key[1:]])
        return self._cache[key]

    def moved_bytes(self, src: int, src_ranks: Sequence[int], dst_ranks: Sequence[int]) -> int:
        return (moved_samples(self.batch, src_ranks, dst_ranks) * self.model.layers[src].output_elements
                * self.cost.bytes_per_value)

    def exempt(self, lid: int) -> bool:
        return self.single(lid) <= self.cost.exempt_us

    def amplification(self, lid: int, g: int, time_us: float) -> float:
        """``g x time / compute(L, 1)``; 1.0 for a layer that takes no time on one GPU (an
        unprofiled layer under ``missing="zero"``: exempt whatever its width)."""
        t1 = self.single(lid)
        if t1 <= 0:
            return 1.0
        return g * time_us / t1
