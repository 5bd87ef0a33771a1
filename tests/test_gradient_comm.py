"""GradientFlow's strategies in whole training runs under mpiexec: sync-sgd learns with each
of them, and summary.json counts what went on the wire (the strategies' unit cases are in
tests/mpi/strategy_cases.py)."""
from __future__ import annotations

import json

import pytest

from workbench.config import RunConfig
from workbench.runtime.launch.batch import train
from workbench.telemetry import IN_FLIGHT_TID

pytestmark = pytest.mark.mpi

MLP_TENSORS = 4  # digits MLP: two Linear layers, weight and bias each
RANKS = 4


@pytest.fixture(autouse=True)
def _isolated_tuning(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_TUNING_CACHE", str(tmp_path / "tuning.json"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory, engines):
    """One run per strategy (sync-sgd, digits MLP, 4 ranks, ring: exact byte counts), on the engines."""
    root = tmp_path_factory.mktemp("gradient-comm")
    options = {"dense": {}, "per-tensor": {"fusion_bytes": 0}, "fused": {"fusion_bytes": 1024, "overlap": True},
               "fp16": {"wire_dtype": "fp16"}, "bf16": {"wire_dtype": "bf16"},
               "csc": {"sparse_ratio": 0.1}, "gradientflow": {"communication": "gradientflow"}}
    out = {}
    for name, extra in options.items():
        cfg = RunConfig(algorithm="sync-sgd", ranks=RANKS, epochs=6, collective="ring", **extra)
        out[name] = (engines(cfg, root / name), root / name)
    return out


def test_every_strategy_learns(runs):
    accuracy = {name: summary["final_test_accuracy"] for name, (summary, _) in runs.items()}
    assert min(accuracy.values()) >= 0.85, accuracy


def test_dense_and_per_tensor_count_the_dense_bytes(runs):
    dense, per_tensor = runs["dense"][0], runs["per-tensor"][0]
    assert dense["wire_bytes"] == dense["dense_wire_bytes"] > 0 and dense["compression_ratio"] == 1
    assert dense["messages_per_step"] == 1 and per_tensor["messages_per_step"] == MLP_TENSORS
    # ring sends 2(n-1)/n of the buffer: per tensor the chunks round differently, never by more
    # than one element per chunk and step
    parameters = dense["parameters"]
    assert dense["wire_bytes_per_step"] == pytest.approx(2 * (RANKS - 1) / RANKS * parameters * 4, rel=1e-3)
    assert per_tensor["wire_bytes"] == per_tensor["dense_wire_bytes"]


def test_half_precision_halves_the_payload(runs):
    dense = runs["dense"][0]
    for name in ("fp16", "bf16"):
        half = runs[name][0]
        # the payload exactly halves; one float per step more decides together whether to skip
        flag = 2 * (RANKS - 1) / RANKS * 4  # native all-reduce of one float32 (ring formula)
        assert half["wire_bytes_per_step"] == pytest.approx(dense["wire_bytes_per_step"] / 2 + flag, abs=1)
        assert half["messages_per_step"] == 2 and half["skipped_steps"] <= 3
        assert half["dense_wire_bytes"] == dense["dense_wire_bytes"]


def test_sparse_communication_sends_a_fraction(runs):
    csc = runs["csc"][0]
    assert csc["compression_ratio"] > 5  # ratio 0.1 of the chunks, plus the chunks' norms
    assert csc["messages_per_step"] == 2  # the norms, then the selected chunks
    flow = runs["gradientflow"][0]
    assert flow["communication"]["wire_dtype"] == "fp16" and flow["communication"]["sparse_ratio"] == 0.1
    assert flow["config"]["communication"] == "gradientflow"  # the config keeps what was given
    assert flow["wire_bytes"] < runs["fp16"][0]["wire_bytes"]  # dense first epoch, then sparse


def test_buckets_overlap_backward_in_the_trace(runs):
    _, run_dir = runs["fused"]
    events = json.loads((run_dir / "trace.json").read_text())["traceEvents"]
    rank0 = [e for e in events if e.get("ph") == "X" and e["pid"] == 0]
    flights = [e for e in rank0 if e["name"].startswith("iallreduce:")]
    assert flights and {e["tid"] for e in flights} == {IN_FLIGHT_TID}
    backward = [e for e in rank0 if e["name"] == "forward_backward"]
    overlapped = sum(any(b["ts"] <= f["ts"] < b["ts"] + b["dur"] for b in backward) for f in flights)
    assert overlapped >= len(backward)  # at least one bucket per step starts while backward runs


def test_unequal_shards_take_the_same_steps_on_every_rank(engines, tmp_path):
    # batch 8 at 4 ranks: the first shard has one batch more per epoch than the others; a lock-step
    # run must not take it (the extra all-reduce would wait for ranks that have finished), and the
    # CSC warm-up must end at the same step everywhere
    cfg = RunConfig(algorithm="sync-sgd", ranks=RANKS, epochs=2, batch_size=8, sparse_ratio=0.1, warmup_epochs=1)
    summary = engines(cfg, tmp_path, timeout=180)
    assert summary["steps_per_worker"] * RANKS == summary["steps"] == 4 * 2 * 44


def test_csc_resumes_with_its_momentum_and_residual_bit_for_bit(tmp_path):
    """CSC's momentum and residual (its hook state) are checkpointed with the weights: a run
    that fails and resumes ends where the uninterrupted one does."""
    from workbench.runtime.launch.launcher import MPILaunchError
    base = dict(algorithm="sync-sgd", ranks=3, epochs=2, collective="ring", checkpoint_every=20,
                sparse_ratio=0.1, wire_dtype="fp16")
    whole = train(RunConfig(**base), tmp_path / "whole", timeout=240)
    with pytest.raises(MPILaunchError):
        train(RunConfig(**base, fail_rank=1, fail_step=50), tmp_path / "broken", timeout=240)
    resumed = train(RunConfig(**base), tmp_path / "resumed", resume=tmp_path / "broken", timeout=240)
    assert resumed["weights_checksum"] == whole["weights_checksum"]
