"""The burst-parallel executor (:mod:`workbench.burst.execute`) over real MPI.

The correctness matrix runs inside one ``mpiexec -n 4`` (``tests/mpi/burst_cases.py``); here:
the launcher end to end (plan as JSON, result back, weights equal to the single-process run),
bad plans refused before anything is launched, a rank that raises named with its exception, a
rank that hangs timing the others out with an error naming it, and no MPI in the launching
process.
"""
from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from workbench.burst.execute import ExecuteError, execute, reference
from workbench.burst.graph import BurstError
from workbench.burst.plan import BurstPlan, LayerPlan
from workbench.runtime.launch import launcher

pytestmark = pytest.mark.mpi
ROOT = Path(__file__).resolve().parent.parent


def make_plan(model: str, placement, batch: int = 64, gpus: int = 4, samples=True) -> BurstPlan:
    """Per layer a width (ranks ``0..w-1``) or a tuple of ranks; ``samples``: the equal shares
    (True), none listed (False) or a list per layer."""
    layers = []
    for i, p in enumerate(placement):
        ranks = tuple(range(p)) if isinstance(p, int) else tuple(p)
        share = batch // len(ranks)
        given = samples[i] if isinstance(samples, list) else (
            [(r * share, (r + 1) * share) for r in range(len(ranks))] if samples else [])
        layers.append(LayerPlan(i, "layer", len(ranks), ranks, share, 0.0, 0.0, 0.0, samples=given))
    return BurstPlan(model, batch, gpus, "workbench", layers, 0.0, 0.0, gpus)


def test_burst_cases_under_mpiexec(mpi):
    """Every plan of tests/mpi/burst_cases.py on 4 ranks: weights equal the single-process run."""
    result = mpi(4, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                 "tests/mpi/burst_cases.py", timeout=150)
    counts = []
    for rank in range(4):
        summary = [line for line in result.lines_of(rank) if re.search(r"\d+ passed", line)]
        assert summary, f"rank {rank} printed no pytest summary:\n{result.output[-3000:]}"
        assert not re.search(r"failed|error|skipped", summary[-1]), summary[-1]
        counts.append(int(re.search(r"(\d+) passed", summary[-1]).group(1)))
    assert len(set(counts)) == 1 and counts[0] >= 17, counts  # the whole matrix ran on every rank


def test_execute_runs_a_mixed_plan_and_matches_the_reference():
    plan = make_plan("cnn", [4, 4, 2, 1, 1, 2, 4, 1])
    result = execute(plan, "cnn", steps=4, timeout=90, lr=0.1, seed=5, warmup=1, momentum=0.5)
    expected = reference("cnn", 64, 4, 0.1, 5, momentum=0.5)
    assert result["weights"].shape == expected.shape
    assert np.max(np.abs(result["weights"] - expected)) <= 1e-5  # see tests/mpi/burst_cases.py
    assert result["replica_spread"] <= 1e-5
    assert result["segments"] == [[0, 1, [0, 1, 2, 3]], [2, 2, [0, 1]], [3, 4, [0]], [5, 5, [0, 1]],
                                  [6, 6, [0, 1, 2, 3]], [7, 7, [0]]]
    assert sorted(result["phases"]) == [0, 1, 2, 3] and result["iteration_ms"] == max(result["rank_ms"].values())
    for phases in result["phases"].values():
        assert set(phases) == {"step_ms", "compute_ms", "transfer_ms", "sync_ms"}
        assert all(0 <= phases[part] <= phases["step_ms"] for part in ("compute_ms", "transfer_ms", "sync_ms"))
    assert len(result["losses"]) == 4 and result["losses"][0] == pytest.approx(np.log(10), abs=0.3)


@pytest.mark.parametrize("plan, model, match", [
    (make_plan("mlp", [4, 1, 2], batch=30, samples=False), "mlp", r"layer 0: batch 30 must be divisible .* 4"),
    (make_plan("mlp", [2, 1, 1], samples=[[(0, 10), (10, 64)], [(0, 64)], [(0, 64)]]), "mlp",
     r"layer 0: samples \[\[0, 10\], \[10, 64\]\] are not the equal contiguous shares"),
    (make_plan("mlp", [4, (1, 5), 1]), "mlp", r"layer 1: ranks \[1, 5\] outside 0..3"),
    (make_plan("mlp", [4, (1, 1), 1]), "mlp", r"layer 1: 2 GPUs but ranks \[1, 1\]"),
    (make_plan("mlp", [4, 1]), "mlp", r"model 'mlp' has layers 0..2; the plan has \[0, 1\]"),
    (make_plan("mlp", [4, 1, 2]), "cnn", r"model 'cnn' has layers 0..7"),
])
def test_bad_plans_are_refused_before_launch(plan, model, match, monkeypatch):
    monkeypatch.setattr(launcher, "run_mpi", lambda *a, **k: pytest.fail("launched a bad plan"))
    with pytest.raises(BurstError, match=match):
        execute(plan, model, steps=2)


def test_bad_arguments_are_refused_before_launch(monkeypatch):
    monkeypatch.setattr(launcher, "run_mpi", lambda *a, **k: pytest.fail("launched"))
    plan = make_plan("mlp", [4, 1, 2])
    for kwargs, match in (({"steps": 0}, "steps must be an integer >= 1"), ({"ranks": 2}, "outside 0..1"),
                          ({"dtype": "float16"}, "dtype one of float32, float64"),
                          ({"learning_rate": 0.1}, "options are lr, seed")):
        with pytest.raises(BurstError, match=match):
            execute(plan, "mlp", **{"steps": 2, **kwargs})


def test_a_rank_that_raises_ends_every_rank_and_is_named():
    start = time.monotonic()
    with pytest.raises(ExecuteError) as info:
        execute(make_plan("mlp", [4, 1, 2]), "mlp", steps=4, timeout=60, fail=(2, 1, "raise"))
    assert time.monotonic() - start < 45
    assert info.value.rank == 2
    first = str(info.value).splitlines()[0]
    assert first == "burst plan on 4 ranks failed: rank 2: RuntimeError: injected failure on rank 2 at step 1"
    assert "Traceback" in str(info.value) or "in run_plan" in str(info.value)  # its traceback's tail follows


def test_a_hanging_rank_times_the_others_out_naming_it():
    """Rank 2 alone runs layer 0 and hangs at step 1: the others give up after wait_timeout."""
    start = time.monotonic()
    with pytest.raises(ExecuteError) as info:
        execute(make_plan("mlp", [(2,), 2, 1], gpus=3), "mlp", steps=4, timeout=60, wait_timeout=3,
                fail=(2, 1, "hang"))
    assert time.monotonic() - start < 45  # not the 60 s job timeout
    first = str(info.value).splitlines()[0]
    assert re.search(r"rank [01]: TimeoutError: rank [01]: forward transfer into layer 1 at step 1 did not "
                     r"complete within 3 s; still waiting on rank\(s\) 2$", first), first


def test_the_launching_process_never_imports_mpi4py():
    code = ("import sys; import workbench.burst.execute as e; from workbench.runtime.launch import mpiexec; "
            "from workbench.burst.plan import BurstPlan, LayerPlan; "
            "e.segments(BurstPlan('mlp', 8, 2, 'workbench', "
            "[LayerPlan(i, 'l', 2, (0, 1), 4, 0, 0, 0) for i in range(3)], 0, 0, 2), 'mlp', 2); "
            "assert 'mpi4py' not in sys.modules, 'imported'")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]


def test_the_reference_is_plain_torch_sgd_on_the_mean_loss():
    # the executed plans are checked against reference(); reference() itself against torch.optim.SGD
    # on F.cross_entropy's mean over the global batch, the same initial weights and batches
    import torch
    import torch.nn.functional as F

    from workbench.burst.execute import batches
    from workbench.models import build
    torch.manual_seed(3)
    model = build("mlp", 64, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for X, y in batches(16, 5, 3):
        opt.zero_grad()
        F.cross_entropy(model(X), y).backward()
        opt.step()
    expected = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    np.testing.assert_allclose(reference("mlp", 16, 5, 0.1, 3, momentum=0.9), expected, rtol=0, atol=1e-6)
