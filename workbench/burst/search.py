"""The search of the workbench's burst-parallel planner (:func:`workbench.burst.planner.plan`):
dynamic programming over (layer, width), the costs of :mod:`workbench.burst.costs` bound to one
model, table and batch (:class:`~workbench.burst.costs.BoundCosts`); :class:`Planner` runs it,
the named tuples are the entries of its tables.

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
transfer). ``A = inf``: no limit. The all-width-1 plan meets any limit, so a plan always exists.

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
from typing import NamedTuple

from .costs import BoundCosts
from .graph import Block, ModelGraph

_EPS = 1e-9


def _pow2_up(x: int) -> int:
    return 1 << (max(1, x) - 1).bit_length()


class Cell(NamedTuple):
    """One entry of the dynamic program: the best way to end an item at one width, in us."""

    time: float               #: from the chain's start to this layer's end
    gpu: float                #: GPU time (width x time, summed) to this layer's end
    prev_width: int | None    #: the previous layer's (or the fork's) width on this path; None: the chain's start
    transfer: float           #: the transfer into this layer
    arrangement: "Arrangement | None" = None   #: a join: how the block before it was run


class BranchPlan(NamedTuple):
    """One branch planned alone, as if on ranks 0.. like its fork (times in us)."""

    items: tuple
    tables: list              #: per item, width -> :class:`Cell` (None for a block)
    last_width: int
    time: float
    gpu: float
    first_width: int
    first_transfer: float     #: the transfer from the fork into its first layer
    footprint: int            #: the GPUs it needs, a power of two


class Placement(NamedTuple):
    """A branch on ranks ``offset..``: start, time, transfer from the fork (for this place), GPU time."""

    branch: BranchPlan
    offset: int
    start: float
    time: float
    first_transfer: float
    gpu: float


class Arrangement(NamedTuple):
    """A block's branches placed, the slowest's end, the join's transfer, time to the join's end, GPUs."""

    placed: list[Placement]
    makespan: float
    join_transfer: float
    time: float
    gpu: float
    footprint: int


class Planner:
    """The dynamic program over one model's items (layers and blocks, :func:`~.graph.structure`)
    at the given widths under the amplification ``limit`` (see the module's text): tables per
    chain (:meth:`segment`), arrangements per block (:meth:`block`), the chosen path laid out on
    ranks and times (:meth:`materialize`)."""

    def __init__(self, model: ModelGraph, costs: BoundCosts, widths: list[int], limit: float):
        self.model, self.costs, self.widths, self.limit = model, costs, widths, limit
        self._segments, self._blocks = {}, {}

    @staticmethod
    def ranks(offset: int, width: int) -> tuple[int, ...]:
        return tuple(range(offset, offset + width))

    def own(self, lid: int, width: int) -> float:
        return self.costs.compute(lid, width) + self.costs.sync(lid, width)

    def ok(self, lid: int, width: int, time: float) -> bool:
        if self.limit == math.inf or self.costs.exempt(lid):
            return True
        return self.costs.amplification(lid, width, time) <= self.limit * (1 + _EPS)

    # -- dynamic program over one chain of items ------------------------------------------

    def segment(self, items, budget: int, entry) -> list:
        """Per item, a table width -> :class:`Cell` (None for a block); ``entry``: None (the
        model's input) or ``(fork, fork width)``."""
        key = (id(items), budget, entry)
        if key in self._segments:
            return self._segments[key][1]
        widths = [w for w in self.widths if w <= budget]
        tables, prev = [], None
        for i, item in enumerate(items):
            if isinstance(item, Block):
                tables.append(None)
                continue
            if i and isinstance(items[i - 1], Block):   # a join: after the block, from the fork's table
                tables.append(self._join_cells(items[i - 1], tables[-2], widths, budget))
            else:
                tables.append(self._layer_cells(item, prev, tables[-1] if prev is not None else None, entry, widths))
            prev = item
        self._segments[key] = (items, tables)   # items kept alive: the key holds their id
        return tables

    def _join_cells(self, block: Block, fork_cells: dict, widths: list[int], budget: int) -> dict:
        """A join's table: per join width, the best fork width and arrangement of the block."""
        table = {}
        for j in widths:
            best = None
            for s, before in fork_cells.items():
                arrangement = self.block(block, s, j, budget)
                if arrangement is not None:
                    cell = Cell(before.time + arrangement.time, before.gpu + arrangement.gpu, s,
                                arrangement.join_transfer, arrangement)
                    if best is None or (cell.time, cell.gpu) < (best.time, best.gpu):
                        best = cell
            if best is not None:
                table[j] = best
        return table

    def _layer_cells(self, lid: int, prev: int | None, prev_cells: dict | None, entry, widths: list[int]) -> dict:
        """A layer's table after the previous layer (``prev``), the fork (``entry``) or the model's input."""
        src = prev if prev is not None else entry and entry[0]
        if prev_cells is None:   # no transfer from the model's input; the fork's width from ``entry``
            prev_cells = {None if entry is None else entry[1]: Cell(0.0, 0.0, None, 0.0)}
        table = {}
        for w in widths:
            own, best = self.own(lid, w), None
            for wp, before in prev_cells.items():
                transfer = 0.0 if wp is None or wp == w and prev is not None else \
                    self.costs.act(src, self.ranks(0, wp), self.ranks(0, w))
                t = transfer + own
                if self.ok(lid, w, t):
                    cell = Cell(before.time + t, before.gpu + w * t, wp if prev is not None else None, transfer)
                    if best is None or (cell.time, cell.gpu) < (best.time, best.gpu):
                        best = cell
            if best is not None:
                table[w] = best
        return table

    @staticmethod
    def backtrack(items, tables, w_last: int) -> dict:
        """Item index -> width (layers) along the best path ending at ``w_last``."""
        out, p, w = {}, len(items) - 1, w_last
        while p >= 0:
            out[p] = w
            step = 2 if p >= 1 and isinstance(items[p - 1], Block) else 1
            w = tables[p][w].prev_width
            p -= step
        return out

    def footprint(self, items, tables, w_last: int) -> int:
        widths = self.backtrack(items, tables, w_last)
        f = max(widths.values())
        for p, w in widths.items():
            arrangement = tables[p][w].arrangement
            if arrangement is not None:
                f = max(f, arrangement.footprint)
        return _pow2_up(f)

    # -- branches ----------------------------------------------------------------------------

    def branch(self, items, fork: int, s: int, cap: int, j: int) -> BranchPlan | None:
        tables = self.segment(items, cap, (fork, s))
        last, best = items[-1], None
        for w, cell in tables[-1].items():
            edge = self.costs.act(last, self.ranks(0, w), self.ranks(0, j))
            cand = (cell.time + edge, cell.gpu + j * edge)
            if best is None or cand < best[0]:
                best = (cand, w, cell)
        if best is None:
            return None
        _, w, cell = best
        first_w = self.backtrack(items, tables, w)[0]
        return BranchPlan(items, tables, w, cell.time, cell.gpu, first_w, tables[0][first_w].transfer,
                          self.footprint(items, tables, w))

    def at(self, bp: BranchPlan, fork: int, s: int, offset: int):
        """(time, gpu, first transfer) of a branch plan placed at ``offset``, None if its first
        layer then breaks the limit."""
        if offset == 0:
            return bp.time, bp.gpu, bp.first_transfer
        first = bp.items[0]
        tr = self.costs.act(fork, self.ranks(0, s), self.ranks(offset, bp.first_width))
        if not self.ok(first, bp.first_width, tr + self.own(first, bp.first_width)):
            return None
        return bp.time - bp.first_transfer + tr, bp.gpu + bp.first_width * (tr - bp.first_transfer), tr

    def block(self, blk: Block, s: int, j: int, budget: int) -> Arrangement | None:
        key = (id(blk), s, j, budget)
        if key in self._blocks:
            return self._blocks[key]
        widths = [w for w in self.widths if w <= budget]
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
                serial.append(Placement(bp, 0, t, bp.time, bp.first_transfer, bp.gpu))
                t += bp.time
            for placed in (serial, self.greedy(blk, s, [plans[i] for i in order], c0, budget)):
                if placed is None:
                    continue
                arr = self.finish(blk, s, j, placed, empties)
                if arr is not None and (best is None or (arr.time, arr.gpu) < (best.time, best.gpu)):
                    best = arr
        self._blocks[key] = best
        return best

    def greedy(self, blk: Block, s: int, plans: list, c0: int, budget: int) -> list[Placement] | None:
        main = plans[0][c0]
        ready = [0.0] * budget
        for g in range(main.footprint):
            ready[g] = main.time
        placed = [Placement(main, 0, 0.0, main.time, main.first_transfer, main.gpu)]
        for ps in plans[1:]:
            best, seen, free = None, set(), {}
            for bp in ps.values():
                if bp is None or (bp.footprint, bp.first_width, bp.last_width, round(bp.time, 6)) in seen:
                    continue
                seen.add((bp.footprint, bp.first_width, bp.last_width, round(bp.time, 6)))
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
                            best = (cand, Placement(bp, o, r, got[0], got[2], got[1]))
            if best is None:
                return None
            chosen = best[1]
            for g in range(chosen.offset, chosen.offset + chosen.branch.footprint):
                ready[g] = chosen.start + chosen.time
            placed.append(chosen)
        return placed

    def finish(self, blk: Block, s: int, j: int, placed: list[Placement], empties: int) -> Arrangement | None:
        edges = [(p.branch.items[-1], self.ranks(p.offset, p.branch.last_width), self.ranks(0, j)) for p in placed]
        edges += [(blk.fork, self.ranks(0, s), self.ranks(0, j))] * empties
        join_transfer = self.costs.act_many(edges)
        own = join_transfer + self.own(blk.join, j)
        if not self.ok(blk.join, j, own):
            return None
        makespan = max((p.start + p.time for p in placed), default=0.0)
        gpu = sum(p.gpu for p in placed) + j * own
        footprint = _pow2_up(max([j] + [p.offset + p.branch.footprint for p in placed]))
        return Arrangement(placed, makespan, join_transfer, makespan + own, gpu, footprint)

    # -- the plan ----------------------------------------------------------------------------

    def materialize(self, items, tables, w_last: int, base: int, t0: float, out: dict, fork=None) -> float:
        """Layer id -> (ranks, start us, transfer us) along the best path; returns the end time."""
        widths, t = self.backtrack(items, tables, w_last), t0
        prev = fork
        for p, item in enumerate(items):
            if isinstance(item, Block):
                continue
            ranks = self.ranks(base, widths[p])
            arrangement = tables[p][widths[p]].arrangement
            if arrangement is not None:   # a join: the block's branches, then the join
                fork_id = items[p - 1].fork
                for placement in arrangement.placed:
                    bp = placement.branch
                    self.materialize(bp.items, bp.tables, bp.last_width, base + placement.offset,
                                     t + placement.start, out, (fork_id, out[fork_id][0]))
                t += arrangement.makespan
                tr = self.costs.act_many([(q, out[q][0], ranks) for q in self.model.layers[item].prev])
            elif prev is None:
                tr = 0.0
            else:
                tr = self.costs.act(prev[0], prev[1], ranks)
            out[item] = (ranks, t, tr)
            t += tr + self.own(item, widths[p])
            prev = (item, ranks)
        return t
