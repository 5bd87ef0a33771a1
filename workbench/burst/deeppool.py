"""The published DeepPool planner's search over its cost model, reproduced decision for decision.

``plan_deeppool(model, table, batch, gpus, amplification, data_parallel)`` returns the
:class:`~workbench.burst.plan.BurstPlan` that seojinpark/DeepPool@7922cac ``searchBestSplitsV3``
would choose from the shipped A100 tables, with its ``iterMs`` / ``gpuMs`` / ``maxGpusUsed`` as
``iteration_ms`` / ``gpu_ms`` / ``gpus_used``. The rules, quirks included, are those of
``data/PLANNER_COST_MODEL.md`` (section numbers below refer to it); times are us inside, ms in the
plan. Only the batch is split (sampleSplit=True, spatialSplit=filterSplit=False). The cost
model's terms (configurations, compute, sync, amplification, activation transfers) are
:mod:`workbench.burst.deeppool_costs`, re-exported here.

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
from .deeppool_costs import (BANDWIDTH, BYTES, EXEMPT_US, LATENCY_US, PENALIZED, PENALTY,  # noqa: F401 - re-exported
                             TYPES_1D, TYPES_2D, activation_bytes, activation_path, activation_us, amplification_of,
                             candidates, compute_us, gpus_needed, initial_config, no_parallel_us, sync_us)
from .graph import BurstError, ModelGraph, ProfileTable
from .plan import ActivationTransfer, BurstPlan, LayerPlan, sample_ranges

_FAR, _AMP0 = 99999999999, 999999   # the code's "infinity" start values (PP:1496 and the join loop)


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
