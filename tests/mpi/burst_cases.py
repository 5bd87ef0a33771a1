"""Run on every rank under ``mpiexec -n 4`` by tests/test_burst_execute.py
(``python -m mpi4py -m pytest this_file``).

Burst-parallel plans executed for real (:func:`workbench.burst.execute.run_plan`): after a few
SGD steps the weights equal the single-process run on the whole global batch
(:func:`~workbench.burst.execute.reference`) for data parallel, everything on one rank, mixed
widths, the same width on other ranks, permuted ranks, idle ranks, momentum and float64. Named
without the ``test_`` prefix so the outer, single-process pytest does not collect it. Every rank
runs every case in the same order (the cases are collective); every wait has a timeout, so a bug
fails a case instead of hanging the job. Rank 0 compares the weights; the others check their own
record.

Tolerance: the distributed run adds the same per-sample gradient terms in another order (per-rank
partial sums, then the all-reduce), so its weights differ from the reference by rounding only.
Measured here (weights up to ~0.3): float32 <= 6e-8 after 4 steps at lr 0.1 (1.8e-7 after 20
with momentum 0.9), bitwise equal when every layer is on one rank; float64 <= 6e-17. ATOL
(1e-5, 1e-12) leaves >50x room for other BLAS/MPI summation orders yet is far below what a bug
moves: one sample fewer in each batch moves the weights by 1.1e-3 (``test_the_check_has_teeth``),
a missing all-reduce or a sum-instead-of-mean by far more.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from mpi4py import MPI

from workbench.burst.execute import reference, run_plan
from workbench.burst.graph import BurstError
from workbench.burst.plan import BurstPlan, LayerPlan

torch.set_num_threads(1)
WORLD = MPI.COMM_WORLD
STEPS, LR, BATCH, SEED = 4, 0.1, 64, 3
ATOL = {"float32": 1e-5, "float64": 1e-12}
WAIT = 30.0  # seconds any rank waits for a peer before its case fails

pytestmark = pytest.mark.skipif(WORLD.Get_size() != 4, reason="the plans are written for 4 ranks")


def make_plan(model: str, placement, batch: int = BATCH, samples: bool = True) -> BurstPlan:
    """A plan by hand: per layer a width (ranks ``0..w-1``) or a tuple of ranks; equal shares."""
    layers = []
    for i, p in enumerate(placement):
        ranks = tuple(range(p)) if isinstance(p, int) else tuple(p)
        share = batch // len(ranks)
        layers.append(LayerPlan(i, "layer", len(ranks), ranks, share, 0.0, 0.0, 0.0,
                                samples=[(r * share, (r + 1) * share) for r in range(len(ranks))] if samples else []))
    return BurstPlan(model, batch, 4, "workbench", layers, 0.0, 0.0, 4)


CASES = {  # name: (model, placement, options)
    "mlp-data-parallel": ("mlp", [4, 4, 4], {}),
    "mlp-all-at-1": ("mlp", [1, 1, 1], {}),
    "mlp-all-at-1-on-rank-3": ("mlp", [(3,), (3,), (3,)], {}),
    "mlp-4-1-2": ("mlp", [4, 1, 2], {}),
    "mlp-1-4-2-float64": ("mlp", [1, 4, 2], {"dtype": "float64"}),
    "mlp-same-width-other-ranks": ("mlp", [(0, 1), (2, 3), (1, 0)], {}),
    "mlp-ranks-0-and-3-idle": ("mlp", [(1, 2), (2,), (2, 1)], {}),
    "mlp-no-samples-listed": ("mlp", [2, 4, 1], {"samples": False}),
    "cnn-data-parallel": ("cnn", [4] * 8, {}),
    "cnn-all-at-1": ("cnn", [1] * 8, {}),
    "cnn-4-4-2-1-1-2-4-1": ("cnn", [4, 4, 2, 1, 1, 2, 4, 1], {}),
    "cnn-mixed-momentum": ("cnn", [2, 2, 4, 4, 1, 1, 2, 4], {"momentum": 0.9}),
    "cnn-permuted-ranks": ("cnn", [(0, 1, 2, 3), (3, 2, 1, 0), (2, 3), (1,), (0, 1), (0, 1, 2, 3), (3,), (1, 2)],
                           {}),
    "cnn-mixed-float64": ("cnn", [4, 2, 2, 1, 4, 4, 2, 1], {"dtype": "float64"}),
    "wide_mlp-2-4-1-4-2": ("wide_mlp", [2, 4, 1, 4, 2], {}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_weights_equal_the_single_process_run(name):
    model, placement, options = CASES[name]
    options = dict(options)
    plan = make_plan(model, placement, samples=options.pop("samples", True))
    dtype, momentum = options.get("dtype", "float32"), options.get("momentum", 0.0)
    result = run_plan(plan, model, STEPS, LR, SEED, WORLD, warmup=1, wait_timeout=WAIT, **options)
    me = WORLD.Get_rank()
    if me != 0:
        assert result["rank"] == me and len(result["times"]["step_ms"]) == STEPS
        return
    expected = reference(model, BATCH, STEPS, LR, SEED, momentum=momentum, dtype=dtype)
    weights = result["weights"]
    assert weights.dtype == np.dtype(dtype) and weights.shape == expected.shape
    error = float(np.max(np.abs(weights - expected)))
    assert error <= ATOL[dtype], f"{name}: largest weight difference {error:.3g} > {ATOL[dtype]:g}"
    assert result["replica_spread"] <= ATOL[dtype]
    used = sorted({r for layer in plan.layers for r in layer.ranks})
    assert sorted(result["phases"]) == used and result["iteration_ms"] > 0
    assert len(result["losses"]) == STEPS and all(math.isfinite(v) for v in result["losses"])
    assert 1.5 < result["losses"][0] < 3.0  # ~ln(10) at the start: the mean loss, not a sum


def test_the_check_has_teeth():
    """Rounding differences are far below ATOL; a different batch (one sample fewer) is far above."""
    a = reference("mlp", BATCH, STEPS, LR, SEED)
    b = reference("mlp", BATCH - 1, STEPS, LR, SEED)  # the same draws without their last sample
    assert float(np.max(np.abs(a - b))) > 100 * ATOL["float32"]


def test_unequal_shares_are_refused_on_every_rank_before_any_message():
    plan = make_plan("mlp", [4, 1, 2], batch=30, samples=False)  # 30 is not divisible by 4
    with pytest.raises(BurstError, match="layer 0: batch 30 must be divisible"):
        run_plan(plan, "mlp", STEPS, LR, SEED, WORLD, wait_timeout=WAIT)
