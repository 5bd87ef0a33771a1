"""The workbench's burst-parallel planner (cost model ``workbench``): every layer its own
data-parallel width ``g = 2**k <= min(N, B)``, by dynamic programming over (layer, width) with
the costs of :mod:`workbench.burst.costs`.

    from workbench.burst.planner import plan
    p = plan("wrn101_2", None, 32, 64, amplification=2.0)   # None: the model's shipped A100 table
    p.iteration_ms, p.gpu_ms, p.gpus_used, p.widths(), p.timeline()

The search (chains, the amplification limit on every transition, a block's branches packed
onto GPUs) is :class:`workbench.burst.search.Planner`, whose text says what is exact and what is
greedy; :func:`plan` checks its inputs, runs it and turns its choice into a
:class:`~workbench.burst.plan.BurstPlan`.

**Options.** ``amplification`` ``A``: ``g (act_in + compute + sync) / compute(L, 1) <= A`` for
every layer, layers with ``compute(L, 1) <= CostModel.exempt_us`` (300 us) exempt; ``A = inf``:
no limit. ``data_parallel``: every layer at ``N`` (``N`` must divide ``B``). ``gpus`` ``N``: a
power of two; widths stop at ``min(N, B)`` (``B`` must divide by the widest), concurrent
branches may use all ``N`` GPUs and never more.

Pure Python: no torch, no MPI.
"""
from __future__ import annotations

import math

from .costs import CostModel
from .graph import DATA, BurstError, ModelGraph, ProfileTable, load_model, load_profile, structure
from .plan import ActivationTransfer, BurstPlan, LayerPlan, sample_ranges
from .search import Planner


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
         cost: CostModel | None = None) -> BurstPlan:
    """A burst-parallel :class:`~workbench.burst.plan.BurstPlan` (see the module's text). ``model``: a
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
    planner = Planner(model, cost.bind(model, table, batch), widths, limit)
    tables = planner.segment(items, gpus, None)   # widths stop at min(N, B); concurrent branches may use all N
    final = tables[-1]
    if not final:
        raise BurstError("no plan meets the amplification limit")   # unreachable: width 1 always does
    w_last = min(final, key=lambda w: (final[w].time, final[w].gpu))
    out: dict = {}
    planner.materialize(items, tables, w_last, 0, 0.0, out)
    return _build(model, planner, out, batch, gpus, None if data_parallel else limit, data_parallel)


def _build(model, planner: Planner, out: dict, batch, gpus, limit, data_parallel) -> BurstPlan:
    c = planner.costs
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
                transfers.append(ActivationTransfer(q, lid, src, ranks, nbytes, c.act(q, src, ranks) / 1e3))
    used = {g for l in layers for g in l.ranks}
    gpu_ms = sum(l.time_ms * l.gpus for l in layers)
    return BurstPlan(model.name, batch, gpus, "workbench", layers, max(l.end_ms for l in layers), gpu_ms,
                     len(used), limit, data_parallel, transfers)
