"""The published DeepPool planner's cost model and search, reproduced decision for decision.

``plan_deeppool(model, table, batch, gpus, amplification, data_parallel)`` returns the
:class:`~workbench.burst.plan.BurstPlan` that seojinpark/DeepPool@7922cac ``searchBestSplitsV3``
would choose from the shipped A100 tables, with its ``iterMs`` / ``gpuMs`` / ``maxGpusUsed`` as
``iteration_ms`` / ``gpu_ms`` / ``gpus_used``. The rules, quirks included, are those of
``data/PLANNER_COST_MODEL.md`` (section numbers below refer to it); times are us inside, ms in the
plan. Only the batch is split (sampleSplit=True, spatialSplit=filterSplit=False).

Readings chosen where the description leaves room (each reproduces its worked numbers):

* Float order and state follow the code: a chain layer's total is ``cum + (act + compute +
  sync)``, a join's per branch ``((cum + act) + compute) + sync``; branch tables are recomputed
  per start config and again with the chosen one in the backward pass, then read as they stand.
* ``LayerPlan.transfer_ms`` is the activation time booked into the layer (a join: the sum over
  its inputs); ``start_ms``/``end_ms`` are ``t[bestCfg][0] - t[bestCfg][1]`` and ``t[bestCfg][0]``
  (the published ``to_gpuTimeline``): a branch's layers sit on their branch's own cumulative
  clock from the fork, concurrently with the other branches, even where the backward pass runs
  a side branch serially (its time is then in ``iteration_ms`` as side-branch overtime).
* ``LayerPlan.amplification``: ``layerTime * gpus / noParallelTime`` (1 if ``layerTime <= 0`` or
  ``noParallelTime <= 300 us``), what the search judges the layer by when choosing the next
  layer's predecessor; also given for the last and fork layers, which it never judges.
* ``transfers``: one per graph edge whose two layers have different GPU counts; ``bytes`` =
  ``max(egress, ingress)`` of the path's formula, ``ms`` = the booked time (x2 for forward and
  backward, the x1000 penalty included where the destination is ReLU/flatten). Edges where the
  count stays but the ranks move (a side branch packed onto new GPUs) get no entry: the planner
  books them 0 and charges only the no-overlap adjustment of section 7.
* Batch sizes: the code takes ``b = int(B / 2**k)`` and drops ``b < 1``; a ``B`` not divisible
  by some tried ``2**k <= B`` would silently give per-GPU batches that do not cover ``B`` (or
  GPU counts that are not powers of two), so it is refused; ``B < G`` only caps the width at
  ``B`` (the code's own rule). In data-parallel mode ``G > B`` leaves no candidate (the code
  fails), so it is refused. ``gpus`` must be a power of two (the code truncates ``log2``).

Pure Python: no torch, no MPI, no numpy.
"""
from __future__ import annotations

import math

from ..checks import integer
from .graph import BurstError, Layer, ModelGraph, ProfileTable
from .plan import ActivationTransfer, BurstPlan, LayerPlan, sample_ranges

#: network bandwidth, bytes/us (the examples' ``netBw=2.66E5``, "2128 Gbps")
BANDWIDTH = 2.66e5
#: network latency per transfer, us (PP:66)
LATENCY_US = 240.0
#: layers whose unsplit time is at most this are never judged by amplification, us
EXEMPT_US = 300.0
#: multiplier on a transfer into ReLU2d/ReLU1d/flatten (PP:210-212)
PENALTY = 1000.0
#: bytes per parameter and per activation value (fp32)
BYTES = 4
_FAR, _AMP0 = 99999999999, 999999   # the code's "infinity" start values (PP:1496 and the join loop)

TYPES_2D, TYPES_1D = ("conv2d", "maxPool2d", "avgPool2d", "adAvgPool2d", "ReLU2d", "concat"), ("linear", "ReLU1d")
PENALIZED, _FLAT4 = ("ReLU2d", "ReLU1d", "flatten"), ("flatten",) + TYPES_2D[1:]


def _dims(dim) -> tuple:
    return (dim,) if isinstance(dim, int) else tuple(dim)


def initial_config(layer: Layer, batch: int) -> tuple:
    """``getInitialConfig`` (section 2): conv2d ``(B, W, H, C, F=output H)``, linear/ReLU1d
    ``(B, in, out)``, pools/ReLU2d/flatten/concat ``(B, W, H, C)``, else ``(B, *inputDim)``."""
    i, o = _dims(layer.input_dim), _dims(layer.output_dim)
    if layer.type == "conv2d":
        return (batch, i[1], i[2], i[0], o[2])
    if layer.type in TYPES_1D:
        return (batch, *i, *o)
    if layer.type in _FLAT4:
        return (batch, i[1], i[2], i[0])
    return (batch, *i)


def candidates(layer: Layer, batch: int, gpus: int, data_parallel: bool = False) -> list[tuple]:
    """``listConfigOptions``: ``b = int(B / 2**k)``, ``k = 0..log2 G`` (only ``log2 G`` in
    data-parallel mode), configs with an entry < 1 dropped; visited in this order."""
    init, splits = initial_config(layer, batch), gpus.bit_length() - 1
    ks = [splits] if data_parallel else range(splits + 1)
    return [c for c in ((int(init[0] / 2 ** k), *init[1:]) for k in ks) if min(c) >= 1]


def gpus_needed(layer: Layer, config: tuple, batch: int) -> int:
    """``calcGpusNeeded``: ``prod int(init[i] / config[i])`` (= ``B / b`` here)."""
    out = 1
    for a, b in zip(initial_config(layer, batch), config):
        out *= int(a / b)
    return out


def compute_us(table: ProfileTable, layer: Layer, batch_per_gpu: int) -> float:
    """``benchGpuTime``: the table's forward+backward time (us) at ``batch_per_gpu``; **1 us**
    when the row is missing or not positive. No interpolation."""
    row = table.get(layer, batch_per_gpu)
    return row.avg_us if row is not None and row.avg_us > 0 else 1


def sync_us(layer: Layer, config: tuple, batch: int, bandwidth: float = BANDWIDTH) -> float:
    """``calcSyncTime``: conv2d ``4*(kW*kH*config[4] + kW*kH)/BW`` with ``kH = 1`` for an int
    kernel and ``config[4]`` = output H; linear ``4*(in*out + out)/BW``, 0 when unsplit
    (``config[0] == batch``); every other type 0. No latency, no replica factor."""
    if layer.type == "conv2d":
        k = layer.params["kernel_size"]
        kw, kh = (k[0], k[1]) if isinstance(k, (list, tuple)) else (k, 1)
        return (kw * kh * config[4] + kw * kh) * BYTES / bandwidth
    if layer.type == "linear":
        return 0 if config[0] == batch else (config[1] * config[2] + config[2]) * BYTES / bandwidth
    return 0


def no_parallel_us(table: ProfileTable, layer: Layer, batch: int, bandwidth: float = BANDWIDTH) -> float:
    """Compute + sync of the unsplit layer (the amplification denominator)."""
    init = initial_config(layer, batch)
    return compute_us(table, layer, init[0]) + sync_us(layer, init, batch, bandwidth)


def amplification_of(layer_us: float, gpus: int, no_parallel: float) -> float:
    """``layerTime * gpus / noParallelTime``, or 1 if ``layerTime <= 0`` or the unsplit time is
    at most :data:`EXEMPT_US` (PP:1518-1521)."""
    return (layer_us * gpus) / no_parallel if (layer_us > 0 and no_parallel > EXEMPT_US) else 1


def activation_path(src: Layer, dst: Layer) -> str:
    """``2d``, ``linear`` or ``general``: which formula ``calcInputXfer`` uses."""
    if src.type in TYPES_2D and dst.type in TYPES_2D + ("flatten",):
        return "2d"
    if src.type in TYPES_1D + ("flatten",) and dst.type in TYPES_1D:
        return "linear"
    return "general"


def activation_bytes(src: Layer, dst: Layer, src_cfg: tuple, dst_cfg: tuple,
                     no_gpu_overlap: bool = False) -> tuple[float, float]:
    """``(egress, ingress)`` bytes of the activation moving from ``src`` at ``src_cfg`` into
    ``dst`` at ``dst_cfg`` by the path's formula (section 5; the 2-D path's channel count is
    ``src_cfg[4]`` for a conv source, i.e. its output H)."""
    s, d, path = src_cfg[0], dst_cfg[0], activation_path(src, dst)
    if path == "2d":
        si, so = _dims(src.input_dim), _dims(src.output_dim)
        sw, sh = src_cfg[1] * so[1] // si[1], src_cfg[2] * so[2] // si[2]
        ch = src_cfg[4] if len(src_cfg) >= 5 else src_cfg[3]
        dw, dh = dst_cfg[1], dst_cfg[2]
        src_gpus, dst_gpus = gpus_needed(src, src_cfg, s * d), gpus_needed(dst, dst_cfg, s * d)
        src_no_ind, dst_no_ind = not src_gpus > dst_gpus, not src_gpus < dst_gpus
        common = 0 if no_gpu_overlap else BYTES * min(s, d) * min(sw, dw) * min(sh, dh) * ch
        k = dst.params.get("kernel_size", 1)
        hw, hh = ((int((k[0] - 1) / 2), int((k[1] - 1) / 2)) if isinstance(k, (list, tuple))
                  else (int((k - 1) / 2),) * 2) if "kernel_size" in dst.params else (0, 0)
        di = _dims(dst.input_dim)
        pixels = 2 * hw * ((dh + hh) if dw != di[1] else 0) + 2 * hh * ((dw + hw) if dh != di[2] else 0)
        halo = BYTES * min(s, d) * pixels * ch
        egress = BYTES * s * sw * sh * ch + (halo - common if src_no_ind else halo)
        ingress = BYTES * d * dw * dh * ch + (halo - common if dst_no_ind else halo)
        return egress, ingress
    if path == "linear":
        if len(src_cfg) >= 4:
            so, si = _dims(src.output_dim), _dims(src.input_dim)
            sw = src_cfg[1] * 1 if src.type == "flatten" else so[1] // si[1]
            sh = src_cfg[2] * 1 if src.type == "flatten" else so[2] // si[2]
            f_src, split = sw * sh * (src_cfg[4] if len(src_cfg) >= 5 else src_cfg[3]), 1
        else:
            f_src, split = src_cfg[2], src.input_dim / src_cfg[1]
        f_dst = dst_cfg[1]
    else:
        f_src, f_dst, split = math.prod(_dims(src.output_dim)), math.prod(_dims(dst.input_dim)), 1
    common = 0 if no_gpu_overlap else BYTES * min(s, d) * min(f_src, f_dst)
    return BYTES * s * f_src * split - common, BYTES * d * f_dst * split - common


def activation_us(src: Layer, dst: Layer, src_cfg: tuple, dst_cfg: tuple, no_gpu_overlap: bool = False,
                  bandwidth: float = BANDWIDTH, latency_us: float = LATENCY_US) -> float:
    """``calcInputXfer``: ``2 * (max(egress, ingress)/BW + LAT if > 0)``, times
    :data:`PENALTY` when ``dst`` is ReLU2d/ReLU1d/flatten."""
    t = max(activation_bytes(src, dst, src_cfg, dst_cfg, no_gpu_overlap)) / bandwidth
    t += latency_us if t > 0 else 0
    return 2 * t * (PENALTY if dst.type in PENALIZED else 1)


class _Search:
    """searchLinear / searchBranch / backwardLinear / backwardBranch / gpuAssignLinear, state
    kept per layer id: ``t[id] = {cfg: (cum, layerTime, prevCfg, act, prevCfgs of a join)}``."""

    def __init__(self, model, table, batch, gpus, limit, dp, bw, lat):
        self.layers, self.table, self.batch, self.gpus = model.layers, table, batch, gpus
        self.limit, self.dp, self.bw, self.lat = limit, dp, bw, lat
        self.cands = [candidates(l, batch, gpus, dp) for l in self.layers]
        self.nopar = [no_parallel_us(table, l, batch, bw) for l in self.layers]
        self.t: dict[int, dict] = {}
        self.best: dict[int, tuple] = {}
        self.start_of: dict[int, int] = {}
        self.packed: dict[int, dict[int, list[int]]] = {}
        self.ranks: dict[int, tuple[int, ...]] = {}

    def xfer(self, src, dst, sc, dc, no_overlap=False):
        return activation_us(src, dst, sc, dc, no_overlap, self.bw, self.lat)

    def cost(self, layer, c):
        return compute_us(self.table, layer, c[0]), sync_us(layer, c, self.batch, self.bw)

    def amp(self, prev, p, entry):
        return amplification_of(entry[1], gpus_needed(prev, p, self.batch), self.nopar[prev.id])

    def linear(self, pre, pre_cfg, start):
        """searchLinear (PP:1457-1552); returns the join it stops at or the last layer."""
        layer = start
        while True:
            t = self.t[layer.id] = {}
            for c in self.cands[layer.id]:
                gpu, sync = self.cost(layer, c)
                if layer is start or not layer.prev:
                    cum, act = (0, 0) if pre is None else \
                        (self.t[pre.id][pre_cfg][0], self.xfer(pre, layer, pre_cfg, c))
                    lt = act + gpu + sync
                    t[c] = (cum + lt, lt, pre_cfg, act, None)
                    continue
                prev = self.layers[layer.prev[0]]
                best, keep, best_amp = _FAR, None, _AMP0
                for p, e in self.t[prev.id].items():
                    act = self.xfer(prev, layer, p, c)
                    amp, lt = self.amp(prev, p, e), act + gpu + sync
                    if e[0] + lt < best and (amp < self.limit or amp < best_amp):
                        best, keep, best_amp = e[0] + lt, (lt, p, act), amp
                t[c] = (best, *keep, None)
            while len(layer.next) > 1:
                layer = self.branch(layer)
            if not layer.next:
                return layer
            layer = self.layers[layer.next[0]]
            if len(layer.prev) > 1:
                return layer

    def branch(self, start):
        """searchBranch (PP:1554-1640): every start config (or the chosen one), every branch,
        then per join config the best predecessor of each branch; keeps the best start config."""
        opts = [self.best[start.id]] if start.id in self.best else list(self.t[start.id])
        join, by_j = None, {}
        for s in opts:
            for first in start.next:
                if len(self.layers[first].prev) > 1:
                    raise BurstError(f"model: branch from layer {start.id} to {first} has no layers; unsupported")
                end = self.linear(start, s, self.layers[first])
                if join is None:
                    join = end
                elif end is not join:
                    raise BurstError(f"model: branches from layer {start.id} join at {join.id} and {end.id}; "
                                     "the planner needs one join per fork")
            if len(join.prev) != len(start.next):
                raise BurstError(f"model: join {join.id} has {len(join.prev)} inputs, fork {start.id} "
                                 f"{len(start.next)} branches; unsupported")
            for j in self.cands[join.id]:
                gpu, sync = self.cost(join, j)
                top, acts, plist = 0, 0, []
                for pid in join.prev:
                    prev = self.layers[pid]
                    best, keep, best_amp = _FAR, None, _AMP0
                    for p, e in self.t[pid].items():
                        act = self.xfer(prev, join, p, j)
                        amp = self.amp(prev, p, e)
                        if e[0] + act + gpu + sync < best and (amp < self.limit or amp < best_amp):
                            best, keep, best_amp = e[0] + act + gpu + sync, (p, act), amp
                    top, acts = max(top, best), acts + keep[1]
                    plist.append(keep[0])
                if j not in by_j or top < by_j[j][0]:
                    by_j[j] = (top, acts + gpu + sync, s, acts, plist)
        self.t[join.id] = by_j
        self.start_of[join.id] = start.id
        return join

    def back_linear(self, last, cfg, stop=None):
        """backwardLinear (PP:1745-1786) -> (gpuUsec, maxGpus, startAdjustment, overtime)."""
        usec, top, start_adj, over, layer = 0, 0, 0, 0, last
        while True:
            self.best[layer.id] = cfg
            if layer is stop:
                return usec, top, start_adj, over
            g = gpus_needed(layer, cfg, self.batch)
            usec += self.t[layer.id][cfg][1] * g
            top = max(top, g)
            if not layer.prev:
                return usec, top, start_adj, over
            entry = self.t[layer.id][cfg]
            if len(layer.prev) > 1:
                start = self.layers[self.start_of[layer.id]]
                self.best[start.id] = entry[2]
                self.branch(start)
                b_usec, b_gpus, b_over = self.back_branch(layer, entry[4])
                usec, top, over = usec + b_usec, max(top, b_gpus), over + b_over
                layer, cfg = start, entry[2]
            else:
                prev = self.layers[layer.prev[0]]
                if prev is stop:
                    start_adj = self.xfer(prev, layer, entry[2], cfg, True) - self.xfer(prev, layer, entry[2], cfg)
                layer, cfg = prev, entry[2]

    def back_branch(self, join, plist):
        """backwardBranch (PP:1788-1861): branch times, serial-or-new-GPUs rule, GPU packing."""
        usec, start = 0, self.layers[self.start_of[join.id]]
        t0, jc, times = self.t[start.id][self.best[start.id]][0], self.best[join.id], []
        for pid, pc in zip(join.prev, plist):
            prev = self.layers[pid]
            b_usec, b_gpus, s_adj, b_over = self.back_linear(prev, pc, stop=start)
            e_adj = self.xfer(prev, join, pc, jc, True) - self.xfer(prev, join, pc, jc, False)
            usec += b_usec
            times.append((self.t[pid][pc][0] - t0 + b_over, b_gpus, pid, s_adj + e_adj))
        times.sort(reverse=True)
        top, over, ready, local = max(x[0] for x in times), 0, [], {}
        for i, (bt, need, pid, adj) in enumerate(times):
            if i >= 1:
                if (self.dp or self.gpus == 1 or top < adj
                        or ((adj + bt) / bt if bt > 0 else 1) > self.limit):
                    top, over = top + bt, over + bt
                else:
                    bt += adj
                    if bt > top:
                        over, top = over + bt - top, bt
                        usec += adj * need
            got, mine = 0, []
            for r in range(len(ready)):
                if ready[r] + bt <= top:
                    ready[r] += bt
                    got, mine = got + 1, mine + [r]
                if got >= need:
                    break
            local[pid] = mine + list(range(len(ready), len(ready) + need - got))
            ready += [bt] * (need - got)
        self.packed[join.id] = local
        g = gpus_needed(join, jc, self.batch)
        usec += self.t[join.id][jc][1] * g
        return usec, max(len(ready), g), over

    def assign(self, last, avail, stop=None):
        """gpuAssignLinear / gpuAssignBranch (PP:1868-1896)."""
        layer = last
        while layer is not stop:
            self.ranks[layer.id] = tuple(avail[i] for i in range(gpus_needed(layer, self.best[layer.id], self.batch)))
            if not layer.prev:
                return
            if len(layer.prev) > 1:
                start = self.layers[self.start_of[layer.id]]
                for pid in layer.prev:
                    self.assign(self.layers[pid], [avail[i] for i in self.packed[layer.id][pid]], stop=start)
                layer = start
            else:
                layer = self.layers[layer.prev[0]]


def _check(batch, gpus, amplification, data_parallel, bandwidth, latency_us) -> None:
    integer("batch", batch, 1, BurstError)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1 or gpus & (gpus - 1):
        raise BurstError(f"gpus must be a power of two >= 1 (1, 2, 4, 8, ...); got {gpus!r}")
    if not isinstance(amplification, (int, float)) or not amplification > 1:
        raise BurstError(f"amplification must be > 1 or inf; got {amplification!r}")
    if not bandwidth > 0 or not latency_us >= 0:
        raise BurstError(f"bandwidth must be > 0 bytes/us and latency_us >= 0; got {bandwidth!r}, {latency_us!r}")
    if data_parallel and gpus > batch:
        raise BurstError(f"gpus must be <= batch in data-parallel mode; got gpus {gpus} > batch {batch}")
    tried = [gpus] if data_parallel else [2 ** k for k in range(gpus.bit_length()) if 2 ** k <= batch]
    bad = [g for g in tried if batch % g]
    if bad:
        raise BurstError(f"batch must be divisible by every GPU count tried ({', '.join(map(str, tried))}); got "
                         f"batch {batch}, not divisible by {bad[0]} (the published int(B/2**k) would drop samples)")


def plan_deeppool(model: ModelGraph, table: ProfileTable, batch: int, gpus: int, amplification: float = math.inf,
                  data_parallel: bool = False, bandwidth: float = BANDWIDTH,
                  latency_us: float = LATENCY_US) -> BurstPlan:
    """The published DeepPool planner's plan for ``model`` at global ``batch`` on up to ``gpus``
    GPUs (see the module's text). ``amplification``: the limit on ``gpus * time / unsplit time``
    (``inf``: none); ``data_parallel``: the baseline with every layer on all ``gpus``."""
    _check(batch, gpus, amplification, data_parallel, bandwidth, latency_us)
    data_parallel = bool(data_parallel)
    s = _Search(model, table, batch, gpus, amplification, data_parallel, bandwidth, latency_us)
    final = s.linear(None, None, model.layers[0])
    if final.next:
        raise BurstError(f"model: search stopped at join layer {final.id} without a fork before it; unsupported")
    ends = s.t[final.id]
    usec, top, _, over = s.back_linear(final, min(ends, key=lambda c: ends[c][0]))   # first on ties
    s.assign(final, list(range(top)))
    missing = [l.id for l in model.layers if l.id not in s.best or l.id not in s.ranks]
    if missing:
        raise BurstError(f"model: layers {missing[:5]} are not reached from layer 0 along one path; unsupported")
    out, transfers, final_time, dp_time = [], [], 0, 0
    for layer in model.layers:
        cfg = s.best[layer.id]
        cum, lt, _, act, _ = s.t[layer.id][cfg]
        final_time, dp_time = max(cum, final_time), dp_time + lt
        g = gpus_needed(layer, cfg, batch)
        gpu, sync = s.cost(layer, cfg)
        out.append(LayerPlan(layer.id, layer.type, g, s.ranks[layer.id], cfg[0], gpu / 1000, sync / 1000,
                             act / 1000, (cum - lt) / 1000, cum / 1000, amplification_of(lt, g, s.nopar[layer.id]),
                             sample_ranges(batch, g)))
        for pid in (p for p in layer.prev if out[p].gpus != g):   # prev ids come first (topological)
            src, sc = model.layers[pid], s.best[pid]
            nbytes, ms = max(activation_bytes(src, layer, sc, cfg)), s.xfer(src, layer, sc, cfg) / 1000
            transfers.append(ActivationTransfer(pid, layer.id, out[pid].ranks, s.ranks[layer.id], nbytes, ms))
    iteration = dp_time if data_parallel else final_time + over
    return BurstPlan(model.name, batch, gpus, "deeppool", out, iteration / 1000, usec / 1000,
                     gpus if data_parallel else top, amplification, data_parallel, transfers)
