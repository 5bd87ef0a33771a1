"""The workbench's burst-parallel planner (cost model ``workbench``): every layer its own
data-parallel width ``g = 2**k <= min(N, B)``, by dynamic programming over (layer, width) with
the costs of :mod:`workbench.burst.costs`.

    from workbench.burst.planner import plan
    p = plan("wrn101_2", None, 32, 64, amplification=2.0)   # None: the model's shipped A100 table
    p.iteration_ms, p.gpu_ms, p.gpus_used, p.widths(), p.timeline()

**Chains**: ``T[L][g] = min over g' of T[L-1][g'] + act(L-1@g' -> L@g) + compute(L, g) +
sync(L, g)``, the first layer without a transfer (each GPU loads its own samples); ties go to the
smaller GPU time. A layer at width ``g`` holds ranks ``0..g-1`` from its start to its end, layers
run one after another: the plan is exact (``tests/test_burst_planner.py`` checks it against
brute force).

**Amplification limit** ``A``: ``g (act_in + compute + sync) / compute(L, 1) <= A`` for every
layer, checked on every transition (the transfer *into* a layer is its cost: it holds ``g`` GPUs
meanwhile), so the search stays exact. Layers with ``compute(L, 1) <= CostModel.exempt_us``
(300 us, the published threshold) are exempt: they cannot waste more than a few hundred us of
GPU time at any width, while holding them to the limit would force the plan to narrow before
them and widen after, two redistributions costing more than the layer (always, at 240 us per
transfer). ``A = inf``: no limit; ``data_parallel``: every layer at ``N`` (``N`` must divide
``B``). The all-width-1 plan meets any limit, so a plan always exists.

**Branches** (series-parallel graphs: Inception). For a fork at width ``s`` and its join at
``j``, each branch is planned alone by the same program (its first layer paying the transfer
from the fork's ranks) with its widths capped at ``c``, for every cap. The longest branch (the
main one) runs on ranks ``0..f-1`` (``f``: its widest layer, rounded up to a power of two). The
others are packed longest first, each at the cap and place (an aligned group of GPUs: the
earliest free one, or ranks 0) where it ends first: on GPUs the main branch leaves idle, else
after a branch on the GPUs it frees; the transfer from the fork is recomputed for where it lands
and a place that breaks the limit is dropped. Every branch after the previous one on ranks
``0..`` is tried too (always feasible). The join starts when its slowest branch ends and
receives all inputs at once. Ranks stay below ``N``: no plan uses more than ``N`` GPUs (the
published planner's can). Exact per (fork width, join width) up to the packing, which is greedy.

Pure Python: no torch, no MPI.
"""
from __future__ import annotations

import math
from collections import namedtuple
from dataclasses import dataclass

from .costs import BoundCosts, CostModel
from .graph import DATA, BurstError, ModelGraph, ProfileTable, load_model, load_profile
from .plan import LayerPlan, Plan, Transfer, sample_ranges

_EPS = 1e-9


@dataclass(frozen=True, eq=False)
class Block:
    """A fork layer, its branches (tuples of items: layer ids and nested blocks) and their join."""

    fork: int
    branches: tuple
    join: int


def structure(model: ModelGraph) -> tuple:
    """The model as items in order: layer ids, a :class:`Block` between each fork and its join."""
    layers = model.layers

    def segment(lid):
        items = []
        while True:
            items.append(lid)
            nxt = layers[lid].next
            if not nxt:
                return items, None
            if len(nxt) == 1:
                if len(layers[nxt[0]].prev) > 1:
                    return items, nxt[0]
                lid = nxt[0]
                continue
            ends = [segment(n) if len(layers[n].prev) == 1 else ((), n) for n in nxt]   # () goes straight to the join
            branches, joins = [tuple(b) for b, _ in ends], {end for _, end in ends}
            join = joins.pop() if len(joins) == 1 else None
            if join is None or sorted(layers[join].prev) != sorted(b[-1] if b else lid for b in branches):
                raise BurstError(f"the branches of fork layer {lid} do not all end at one join layer; only "
                                 f"series-parallel graphs can be planned")
            items.append(Block(lid, tuple(branches), join))
            lid = join

    items, end = segment(0)
    if end is not None:
        raise BurstError(f"layer {end} joins branches that no fork opened; only series-parallel graphs can be planned")
    return tuple(items)   # every layer is in it: each but layer 0 has an earlier input (check_graph)


def _pow2_up(x: int) -> int:
    return 1 << (max(1, x) - 1).bit_length()


#: one branch planned alone: its items and DP tables, last width, time and GPU time (us) when on
#: ranks 0.. like its fork, first width and the transfer into it there, GPUs it needs (a power of 2)
_BranchPlan = namedtuple("_BranchPlan", "items tables last_w time gpu first_w first_tr footprint")
#: a block's branches placed: [(branch plan, rank offset, start, time, first transfer, GPU time)],
#: the slowest's end, the join's transfer, block time (to the join's end), GPU time, GPUs used
_Arrangement = namedtuple("_Arrangement", "placed makespan join_tr time gpu footprint")


class _Planner:
    def __init__(self, model: ModelGraph, costs: BoundCosts, widths: list[int], limit: float):
        self.model, self.c, self.W, self.limit = model, costs, widths, limit
        self._seg, self._blk = {}, {}

    @staticmethod
    def ranks(offset: int, w: int) -> tuple[int, ...]:
        return tuple(range(offset, offset + w))

    def own(self, lid: int, w: int) -> float:
        return self.c.compute(lid, w) + self.c.sync(lid, w)

    def ok(self, lid: int, w: int, time: float) -> bool:
        if self.limit == math.inf or self.c.exempt(lid):
            return True
        return self.c.amplification(lid, w, time) <= self.limit * (1 + _EPS)

    # -- dynamic program over one chain of items ------------------------------------------

    def segment(self, items, budget: int, entry) -> list:
        """Per item, a table width -> (time, gpu, prev width, transfer in, arrangement or None);
        ``entry``: None (the model's input) or ``(fork, s)``."""
        key = (id(items), budget, entry)
        if key in self._seg:
            return self._seg[key][1]
        widths = [w for w in self.W if w <= budget]
        tables, prev, block = [], None, None
        for it in items:
            if isinstance(it, Block):
                block = it
                tables.append(None)
                continue
            lid, tab = it, {}
            if block is not None:
                ptab = tables[-2]
                for j in widths:
                    best = None
                    for s, st in ptab.items():
                        arr = self.block(block, s, j, budget)
                        if arr is not None:
                            cand = (st[0] + arr.time, st[1] + arr.gpu)
                            if best is None or cand < best[:2]:
                                best = (cand[0], cand[1], s, arr.join_tr, arr)
                    if best is not None:
                        tab[j] = best
                block = None
            else:   # the model's input (no transfer), the fork (a branch's first layer) or the previous layer
                src = prev if prev is not None else entry and entry[0]
                ptab = tables[-1] if prev is not None else {None if entry is None else entry[1]: (0.0, 0.0)}
                for w in widths:
                    own, best = self.own(lid, w), None
                    for wp, st in ptab.items():
                        tr = 0.0 if wp is None or wp == w and prev is not None else \
                            self.c.act(src, self.ranks(0, wp), self.ranks(0, w))
                        t = tr + own
                        if self.ok(lid, w, t):
                            cand = (st[0] + t, st[1] + w * t)
                            if best is None or cand < best[:2]:
                                best = (cand[0], cand[1], wp if prev is not None else None, tr, None)
                    if best is not None:
                        tab[w] = best
            tables.append(tab)
            prev = lid
        self._seg[key] = (items, tables)   # items kept alive: the key holds their id
        return tables

    @staticmethod
    def backtrack(items, tables, w_last: int) -> dict:
        """Item index -> width (layers) along the best path ending at ``w_last``."""
        out, p, w = {}, len(items) - 1, w_last
        while p >= 0:
            out[p] = w
            step = 2 if p >= 1 and isinstance(items[p - 1], Block) else 1
            w = tables[p][w][2]
            p -= step
        return out

    def footprint(self, items, tables, w_last: int) -> int:
        widths = self.backtrack(items, tables, w_last)
        f = max(widths.values())
        for p, w in widths.items():
            arr = tables[p][w][4]
            if arr is not None:
                f = max(f, arr.footprint)
        return _pow2_up(f)

    # -- branches ----------------------------------------------------------------------------

    def branch(self, items, fork: int, s: int, cap: int, j: int) -> _BranchPlan | None:
        tables = self.segment(items, cap, (fork, s))
        last, best = items[-1], None
        for w, st in tables[-1].items():
            edge = self.c.act(last, self.ranks(0, w), self.ranks(0, j))
            cand = (st[0] + edge, st[1] + j * edge)
            if best is None or cand < best[0]:
                best = (cand, w, st)
        if best is None:
            return None
        _, w, st = best
        first_w = self.backtrack(items, tables, w)[0]
        return _BranchPlan(items, tables, w, st[0], st[1], first_w, tables[0][first_w][3],
                           self.footprint(items, tables, w))

    def at(self, bp: _BranchPlan, fork: int, s: int, offset: int):
        """(time, gpu, first transfer) of a branch plan placed at ``offset``, None if its first
        layer then breaks the limit."""
        if offset == 0:
            return bp.time, bp.gpu, bp.first_tr
        first = bp.items[0]
        tr = self.c.act(fork, self.ranks(0, s), self.ranks(offset, bp.first_w))
        if not self.ok(first, bp.first_w, tr + self.own(first, bp.first_w)):
            return None
        return bp.time - bp.first_tr + tr, bp.gpu + bp.first_w * (tr - bp.first_tr), tr

    def block(self, blk: Block, s: int, j: int, budget: int) -> _Arrangement | None:
        key = (id(blk), s, j, budget)
        if key in self._blk:
            return self._blk[key]
        widths = [w for w in self.W if w <= budget]
        full = [b for b in blk.branches if b]
        empties = len(blk.branches) - len(full)
        plans = [{c: self.branch(b, blk.fork, s, c, j) for c in widths} for b in full]
        longest = [max((p.time for p in ps.values() if p is not None), default=-1.0) for ps in plans]
        order = sorted(range(len(full)), key=lambda i: -longest[i])
        best = None
        for c0 in widths:
            if any(plans[i][c0] is None for i in order):
                continue
            serial, t = [], 0.0
            for i in order:
                bp = plans[i][c0]
                serial.append((bp, 0, t, bp.time, bp.first_tr, bp.gpu))
                t += bp.time
            for placed in (serial, self.greedy(blk, s, [plans[i] for i in order], c0, budget)):
                if placed is None:
                    continue
                arr = self.finish(blk, s, j, placed, empties)
                if arr is not None and (best is None or (arr.time, arr.gpu) < (best.time, best.gpu)):
                    best = arr
        self._blk[key] = best
        return best

    def greedy(self, blk: Block, s: int, plans: list, c0: int, budget: int):
        main = plans[0][c0]
        ready = [0.0] * budget
        for g in range(main.footprint):
            ready[g] = main.time
        placed = [(main, 0, 0.0, main.time, main.first_tr, main.gpu)]
        for ps in plans[1:]:
            best, seen, free = None, set(), {}
            for bp in ps.values():
                if bp is None or (bp.footprint, bp.first_w, bp.last_w, round(bp.time, 6)) in seen:
                    continue
                seen.add((bp.footprint, bp.first_w, bp.last_w, round(bp.time, 6)))
                f = bp.footprint
                if f not in free:   # ranks 0 and the earliest free aligned group of f GPUs
                    groups = [max(ready[o:o + f]) for o in range(0, budget, f)]
                    early = groups.index(min(groups))
                    free[f] = {0: groups[0], early * f: groups[early]}
                for o, r in free[f].items():
                    got = self.at(bp, blk.fork, s, o)
                    if got is not None:
                        cand = (r + got[0], got[1])
                        if best is None or cand < best[0]:
                            best = (cand, (bp, o, r, got[0], got[2], got[1]))
            if best is None:
                return None
            bp, o, r, t, _, _ = best[1]
            for g in range(o, o + bp.footprint):
                ready[g] = r + t
            placed.append(best[1])
        return placed

    def finish(self, blk: Block, s: int, j: int, placed: list, empties: int) -> _Arrangement | None:
        edges = [(bp.items[-1], self.ranks(o, bp.last_w), self.ranks(0, j)) for bp, o, *_ in placed]
        edges += [(blk.fork, self.ranks(0, s), self.ranks(0, j))] * empties
        join_tr = self.c.act_many(edges)
        own = join_tr + self.own(blk.join, j)
        if not self.ok(blk.join, j, own):
            return None
        makespan = max((start + t for _, _, start, t, _, _ in placed), default=0.0)
        gpu = sum(g for *_, g in placed) + j * own
        footprint = _pow2_up(max([j] + [o + bp.footprint for bp, o, *_ in placed]))
        return _Arrangement(placed, makespan, join_tr, makespan + own, gpu, footprint)

    # -- the plan ----------------------------------------------------------------------------

    def materialize(self, items, tables, w_last: int, base: int, t0: float, out: dict, fork=None) -> float:
        """Layer id -> (ranks, start us, transfer us) along the best path; returns the end time."""
        widths, t = self.backtrack(items, tables, w_last), t0
        prev = fork
        for p, it in enumerate(items):
            if isinstance(it, Block):
                continue
            w = widths[p]
            ranks = self.ranks(base, w)
            arr = tables[p][w][4]
            if arr is not None:   # a join: the block's branches, then the join
                block_start = t
                for bp, o, start, _, _, _ in arr.placed:
                    self.materialize(bp.items, bp.tables, bp.last_w, base + o, block_start + start, out,
                                     (items[p - 1].fork, out[items[p - 1].fork][0]))
                t = block_start + arr.makespan
                edges = [(q, out[q][0], ranks) for q in self.model.layers[it].prev]
                tr = self.c.act_many(edges)
            elif prev is None:
                tr = 0.0
            else:
                tr = self.c.act(prev[0], prev[1], ranks)
            out[it] = (ranks, t, tr)
            t += tr + self.own(it, w)
            prev = (it, ranks)
        return t


def _check(batch, gpus, amplification, data_parallel) -> tuple[list[int], float]:
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise BurstError(f"batch must be an integer >= 1 (the global batch); got {batch!r}")
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 1 or gpus & (gpus - 1):
        raise BurstError(f"gpus must be a power of two (1, 2, 4, ...); got {gpus!r}")
    if data_parallel:
        if batch % gpus:
            raise BurstError(f"batch {batch} must be divisible by {gpus} GPUs for data parallelism "
                             f"(every layer on every GPU, at least one sample each)")
        return [gpus], math.inf
    try:
        limit = float(amplification)
    except (TypeError, ValueError):
        limit = math.nan
    if not limit > 1:
        raise BurstError(f"amplification limit must be a number > 1 (or inf: no limit); got {amplification!r}")
    top = 1 << (min(gpus, batch).bit_length() - 1)
    if batch % top:
        raise BurstError(f"batch {batch} must be divisible by {top}, the widest layer width for {gpus} GPUs "
                         f"(widths are powers of two up to min(gpus, batch))")
    return [1 << k for k in range(top.bit_length())], limit


def default_cost(model: ModelGraph, table: ProfileTable) -> CostModel:
    """:meth:`CostModel.paper` (``missing="zero"``) for a shipped table, else the same constants
    with ``missing="error"``."""
    shipped = str(table.source).startswith(str(DATA))
    return CostModel.paper() if shipped else CostModel.paper(missing="error")


def plan(model, table, batch: int, gpus: int, amplification: float = math.inf, data_parallel: bool = False,
         cost: CostModel | None = None) -> Plan:
    """A burst-parallel :class:`~workbench.burst.plan.Plan` (see the module's text). ``model``: a
    :class:`ModelGraph`, a built-in name or a model JSON; ``table``: a :class:`ProfileTable`, a
    path, or None (the model's own); ``cost``: a :class:`CostModel` (default
    :func:`default_cost`)."""
    widths, limit = _check(batch, gpus, amplification, data_parallel)
    if not isinstance(model, ModelGraph):
        model = load_model(model)
    if table is None:
        if model.profile_path is None:
            raise BurstError(f"model {model.name} names no profile file; give a profile table")
        table = load_profile(model.profile_path)
    elif not isinstance(table, ProfileTable):
        table = load_profile(table)
    cost = cost or default_cost(model, table)
    items = structure(model)
    planner = _Planner(model, cost.bind(model, table, batch), widths, limit)
    tables = planner.segment(items, gpus, None)   # widths stop at min(N, B); concurrent branches may use all N
    final = tables[-1]
    if not final:
        raise BurstError("no plan meets the amplification limit")   # unreachable: width 1 always does
    w_last = min(final, key=lambda w: final[w][:2])
    out: dict = {}
    planner.materialize(items, tables, w_last, 0, 0.0, out)
    return _build(model, planner, out, batch, gpus, None if data_parallel else limit, data_parallel)


def _build(model, planner: _Planner, out: dict, batch, gpus, limit, data_parallel) -> Plan:
    c = planner.c
    layers, transfers = [], []
    for lid in sorted(out):
        ranks, start, tr = out[lid]
        w = len(ranks)
        comp, sync = c.compute(lid, w), c.sync(lid, w)
        time = tr + comp + sync
        layer = model.layers[lid]
        layers.append(LayerPlan(lid, layer.type, w, ranks, batch // w, comp / 1e3, sync / 1e3, tr / 1e3,
                                start / 1e3, (start + time) / 1e3, c.amplification(lid, w, time),
                                sample_ranges(batch, w)))
        for q in layer.prev:
            src = out[q][0]
            nbytes = c.moved_bytes(q, src, ranks)
            if nbytes:
                transfers.append(Transfer(q, lid, src, ranks, nbytes, c.act(q, src, ranks) / 1e3))
    used = {g for l in layers for g in l.ranks}
    gpu_ms = sum(l.time_ms * l.gpus for l in layers)
    return Plan(model.name, batch, gpus, "workbench", layers, max(l.end_ms for l in layers), gpu_ms, len(used),
                limit, data_parallel, transfers)
