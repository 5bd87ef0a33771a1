"""EASGD's descendants (issue 25): Local SGD, DiLoCo and Streaming DiLoCo. The maths by hand, the
schedule of the fragments, the identities that tie them to sync-SGD and to each other under mpiexec,
their bytes, resume, and the one-line errors before launch."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from workbench.config import ConfigError, RunConfig
from workbench.optim import fragments, rules
from workbench.runtime.launch.batch import train
from workbench.runtime.launch.launcher import MPILaunchError
from workbench.runtime.rank import checkpoint


# -- the maths ---------------------------------------------------------------------------------------
def test_outer_nesterov_step_by_hand_two_steps():
    """theta 1, buf 0, lr 0.5, momentum 0.9, Nesterov; deltas 0.2 then -0.1:
    step 1: buf = 0.2, step = 0.2 + 0.9*0.2 = 0.38, theta = 1 - 0.19 = 0.81;
    step 2: buf = 0.9*0.2 - 0.1 = 0.08, step = -0.1 + 0.9*0.08 = -0.028, theta = 0.81 + 0.014 = 0.824."""
    theta, buf = torch.tensor([1.0], dtype=torch.float64), torch.zeros(1, dtype=torch.float64)
    theta, buf = rules.outer_sgd(theta, buf, torch.tensor([0.2], dtype=torch.float64), 0.5, 0.9, True)
    assert theta.item() == pytest.approx(0.81) and buf.item() == pytest.approx(0.2)
    theta, buf = rules.outer_sgd(theta, buf, torch.tensor([-0.1], dtype=torch.float64), 0.5, 0.9, True)
    assert theta.item() == pytest.approx(0.824) and buf.item() == pytest.approx(0.08)
    heavy, _ = rules.outer_sgd(torch.tensor([1.0]), torch.zeros(1), torch.tensor([0.2]), 0.5, 0.9, False)
    assert heavy.item() == pytest.approx(0.9)  # without Nesterov: theta - lr*buf


@pytest.mark.parametrize("nesterov", [True, False])
def test_outer_step_is_torch_sgd_on_the_outer_gradient(nesterov):
    torch.manual_seed(0)
    theta0, deltas = torch.randn(50), [torch.randn(50) for _ in range(4)]
    param = torch.nn.Parameter(theta0.clone())
    opt = torch.optim.SGD([param], lr=0.7, momentum=0.9, nesterov=nesterov)
    theta, buf = theta0.clone(), torch.zeros(50)
    for delta in deltas:
        param.grad = delta.clone()
        opt.step()
        theta, buf = rules.outer_sgd(theta, buf, delta, 0.7, 0.9, nesterov)
    torch.testing.assert_close(theta, param.detach(), rtol=1e-6, atol=1e-6)


def test_adamw_is_torch_adamw():
    torch.manual_seed(1)
    x0, grads = torch.randn(40), [torch.randn(40) for _ in range(5)]
    param = torch.nn.Parameter(x0.clone())
    opt = torch.optim.AdamW([param], lr=1e-2, weight_decay=0.1)
    x, m, v = x0.clone(), torch.zeros(40), torch.zeros(40)
    for t, g in enumerate(grads, start=1):
        param.grad = g.clone()
        opt.step()
        x, m, v = rules.adamw(x, m, v, g, t, 1e-2, 0.1)
    torch.testing.assert_close(x, param.detach(), rtol=1e-6, atol=1e-7)


def test_mix():
    local, outer = torch.tensor([1.0, 3.0]), torch.tensor([3.0, 1.0])
    assert rules.mix(local, outer, 0.5).tolist() == [2.0, 2.0]
    assert rules.mix(local, outer, 0.0).tolist() == outer.tolist()


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_the_inner_momentum_step_in_place_is_the_functional_one_bit_for_bit(weight_decay):
    """InnerOptimizer's momentum SGD updates x and its velocity in place with the bits of
    rules.momentum_sgd on grad + weight_decay * x, over steps with the velocity built up."""
    from workbench.optim.periodic import InnerOptimizer
    cfg = RunConfig(algorithm="local-sgd", weight_decay=weight_decay)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1000, generator=gen)
    inner, x_, v = InnerOptimizer(cfg, x), x.clone(), torch.zeros_like(x)
    for step in range(5):
        grad = torch.randn(1000, generator=gen)
        inner.step(x_, grad, 0.05)
        g = grad + weight_decay * x if weight_decay else grad
        x, v = rules.momentum_sgd(x, v, g, 0.05, cfg.hyper.momentum)
        assert torch.equal(x_, x) and torch.equal(inner.v, v), step
    assert cfg.hyper.momentum > 0 and v.abs().sum() > 0


# -- the fragments -------------------------------------------------------------------------------------
@pytest.mark.parametrize("sizes, count", [([10, 3, 500, 7, 200, 4], 3), ([5] * 8, 8), ([1, 1000], 2), ([9, 9], 1)])
def test_fragments_partition_the_tensors_in_order(sizes, count):
    bounds, start = [], 0
    for n in sizes:
        bounds.append((start, start + n))
        start += n
    parts = fragments.partition(bounds, count)
    assert len(parts) == count
    assert [i for _, _, tensors in parts for i in tensors] == list(range(len(sizes)))  # each once, in order
    assert parts[0][0] == 0 and parts[-1][1] == start
    assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))  # contiguous
    assert all(len(tensors) >= 1 for _, _, tensors in parts)


def test_fragments_balance_the_elements():
    bounds = [(i * 100, (i + 1) * 100) for i in range(12)]
    assert [stop - start for start, stop, _ in fragments.partition(bounds, 4)] == [300] * 4


@pytest.mark.parametrize("count, every, warmup", [(1, 10, 0), (4, 12, 0), (3, 10, 5), (5, 5, 2)])
def test_each_fragment_syncs_exactly_once_per_sync_every_steps(count, every, warmup):
    seen = {f: [] for f in range(count)}
    for done in range(1, warmup + 4 * every + 1):
        for f in fragments.due(done, count, every, warmup):
            seen[f].append(done)
    assert all(done > warmup for times in seen.values() for done in times)
    for times in seen.values():
        assert len(times) == 4 and all(b - a == every for a, b in zip(times, times[1:]))
    assert seen[count - 1][0] == warmup + every  # the last fragment where DiLoCo syncs
    starts = sorted(t[0] for t in seen.values())
    assert len(set(starts)) == count  # staggered: no two fragments start together


# -- bad input: one line before launch ---------------------------------------------------------------
@pytest.mark.parametrize("fields, message", [
    (dict(algorithm="diloco", sync_every=0), "sync_every must be an integer >= 1; got 0"),
    (dict(algorithm="streaming-diloco", fragments=5), "fragments must be <= the model's 4 parameter tensors"),
    (dict(algorithm="streaming-diloco", fragments=2, sync_every=10, sync_delay=5),
     "sync_delay must be < sync_every // fragments = 5"),
    (dict(algorithm="diloco", inner_optimizer="lion"), "inner_optimizer must be one of sgd, adamw; got 'lion'"),
    (dict(algorithm="local-sgd", outer_lr=0.5), "outer_lr: local-sgd has no outer optimizer"),
    (dict(algorithm="sync-sgd", sync_every=4), "sync_every: sync-sgd ignores sync_every=4"),
    (dict(algorithm="diloco", fragments=2), "fragments: diloco syncs all parameters at once"),
    (dict(algorithm="diloco", outer_wire_dtype="fp8"), "outer_wire_dtype must be one of fp32, bf16, fp16"),
])
def test_bad_options_are_one_line_errors(fields, message):
    with pytest.raises(ConfigError) as info:
        RunConfig(**fields)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_cli_refuses_a_bad_fragment_count_before_launch(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "workbench.cli", "train", "--algorithm", "streaming-diloco",
                           "--fragments", "9", "--sync-every", "20", "--out", str(tmp_path / "x")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "fragments must be <= the model's 4 parameter tensors" in proc.stderr
    assert not (tmp_path / "x").exists()


def test_adamw_takes_its_own_learning_rate():
    assert RunConfig(algorithm="diloco", inner_optimizer="adamw").hyper.lr == 1e-3
    assert RunConfig(algorithm="diloco").hyper.lr == 0.1


# -- whole runs: on warm engines (the ``engines`` fixture), the resume under mpiexec -------------------
BASE = dict(ranks=3, epochs=1, collective="ring", checkpoint_every=1, eval_every=1000)


def final_state(engines, tmp_path, name, **fields):
    """Run to the end with a checkpoint at every step; the last one's state on rank 0 and the summary."""
    summary = engines(RunConfig(**{**BASE, **fields}), tmp_path / name)
    return checkpoint.load(tmp_path / name, 0, BASE["ranks"]), summary


def relative(a, b):
    return float((a - b).norm() / b.norm())


@pytest.mark.mpi
def test_local_sgd_and_diloco_at_one_step_are_sync_sgd(engines, tmp_path):
    sync, sync_summary = final_state(engines, tmp_path, "sync", algorithm="sync-sgd")
    local, _ = final_state(engines, tmp_path, "local", algorithm="local-sgd", sync_every=1)
    diloco, _ = final_state(engines, tmp_path, "diloco", algorithm="diloco", sync_every=1, outer_lr=1.0, outer_momentum=0.0,
                            momentum=0.9)  # sync-sgd's momentum (diloco's inner SGD has none by default)
    assert relative(local["center"], sync["x"]) < 1e-6
    assert relative(diloco["center"], sync["x"]) < 1e-6
    assert relative(diloco["x"], sync["x"]) < 1e-6  # every worker restarts from the outer weights
    assert sync_summary["final_test_accuracy"] > 0.8  # they trained: not two untouched models
    # and at H = 5 Local SGD is no longer sync-SGD (the identity is not a tautology)
    local5, _ = final_state(engines, tmp_path, "local5", algorithm="local-sgd", sync_every=5)
    assert relative(local5["center"], sync["x"]) > 1e-4


@pytest.mark.mpi
def test_streaming_diloco_with_one_fragment_no_delay_no_mixing_is_diloco(engines, tmp_path):
    _, diloco = final_state(engines, tmp_path, "diloco", algorithm="diloco", sync_every=5)
    _, streaming = final_state(engines, tmp_path, "streaming", algorithm="streaming-diloco", sync_every=5, fragments=1,
                               sync_delay=0, fragment_alpha=0.0)
    assert streaming["weights_checksum"] == diloco["weights_checksum"]
    assert streaming["wire_bytes"] == diloco["wire_bytes"] > 0
    _, mixed = final_state(engines, tmp_path, "mixed", algorithm="streaming-diloco", sync_every=5, fragments=1)
    assert mixed["weights_checksum"] != diloco["weights_checksum"]  # alpha 0.5 mixes


@pytest.mark.mpi
def test_fragment_bytes_and_messages_follow_the_schedule_and_the_wire_dtype(engines, tmp_path):
    """One message per fragment sync (one bucket each); fp32's bytes are the dense equivalent, bf16's
    exactly half of them; the syncs are the schedule's plus every fragment once at the last step."""
    fields = dict(algorithm="streaming-diloco", sync_every=8, fragments=2, sync_delay=2, fusion_bytes=None)
    _, fp32 = final_state(engines, tmp_path, "fp32", **fields)
    _, bf16 = final_state(engines, tmp_path, "bf16", **fields, outer_wire_dtype="bf16")
    steps = fp32["steps_per_worker"]
    syncs = sum(len(fragments.due(done, 2, 8)) for done in range(1, steps)) + 2
    assert fp32["messages"] == bf16["messages"] == syncs  # per rank
    assert fp32["wire_bytes"] == fp32["dense_wire_bytes"] > 0
    assert bf16["wire_bytes"] * 2 == bf16["dense_wire_bytes"] == fp32["wire_bytes"]
    assert bf16["final_test_accuracy"] > 0.5 and fp32["final_test_accuracy"] > 0.5  # chance: 0.1
    # the exchanges overlapped with inner steps are comm spans on each rank's in-flight row (the dashboard's)
    import json

    from workbench.telemetry import IN_FLIGHT_TID
    events = json.loads((tmp_path / "fp32" / "trace.json").read_text())["traceEvents"]
    outer = [e for e in events if e.get("name") == "outer_exchange"]
    overlapped = [e for e in outer if e["tid"] == IN_FLIGHT_TID]
    assert {e["cat"] for e in outer} == {"comm"} and {e["pid"] for e in overlapped} == {0, 1, 2}
    assert len(overlapped) == (syncs - 2) * BASE["ranks"]  # all but the last step's, which is blocking


@pytest.mark.mpi
def test_streaming_diloco_resumes_bit_for_bit_with_a_fragment_in_flight(tmp_path):
    """Checkpoint at step 20: fragment 0 (offset 4 of 8) started its exchange at step 20 and is
    applied at 22, so the checkpoint holds it in flight; rank 1 fails at step 30."""
    base = dict(algorithm="streaming-diloco", ranks=3, epochs=2, sync_every=8, fragments=2, sync_delay=2,
                checkpoint_every=20, collective="ring", inner_optimizer="adamw")
    assert 0 in fragments.due(20, 2, 8)
    whole = train(RunConfig(**base), tmp_path / "whole", timeout=240)
    with pytest.raises(MPILaunchError) as info:
        train(RunConfig(**base, fail_rank=1, fail_step=30), tmp_path / "broken", timeout=240)
    assert info.value.failed_ranks == [1] and "injected failure on rank 1 at step 30" in str(info.value)
    assert checkpoint.latest_step(tmp_path / "broken") == 20
    state = checkpoint.load(tmp_path / "broken", 0, 3)
    assert state["pending_fragment"] == 0 and state["pending_apply_at"] == 22 and state["inner_t"] == 20
    resumed = train(RunConfig(**base), tmp_path / "resumed", resume=tmp_path / "broken", timeout=240)
    assert resumed["weights_checksum"] == whole["weights_checksum"]


# -- the predictor -------------------------------------------------------------------------------------
def test_predictor_bytes_and_step_time_for_each_descendant():
    from workbench.netsim.costs import AlphaBeta
    from workbench.netsim.predict import PredictError, predict
    from workbench.netsim.profile import alexnet_profile
    profile, net = alexnet_profile(), AlphaBeta(1.25e9, 5e-6, "ring")
    params = sum(layer.parameters for layer in profile)
    compute = sum(layer.forward_s + layer.backward_s for layer in profile)
    easgd = predict(profile, 8, net, algorithm="sync-easgd", tau=50, overlap=False)
    local = predict(profile, 8, net, algorithm="local-sgd", tau=50)
    diloco = predict(profile, 8, net, algorithm="diloco", tau=50)
    half = predict(profile, 8, net, algorithm="diloco", tau=50, outer_wire_dtype="bf16")
    assert local.wire_bytes == diloco.wire_bytes == easgd.wire_bytes == pytest.approx(2 * 7 / 8 * 4 * params / 50)
    assert half.wire_bytes == pytest.approx(diloco.wire_bytes / 2)
    exchange = net.allreduce(4 * params, 8)
    assert local.step_s == pytest.approx(compute + exchange / 50)
    assert half.step_s < diloco.step_s
    streamed = predict(profile, 8, net, algorithm="streaming-diloco", tau=50, fragments=5, sync_delay=9)
    assert streamed.wire_bytes == pytest.approx(diloco.wire_bytes) and streamed.messages == 5 / 50
    assert compute <= streamed.step_s < diloco.step_s  # the fragments hide behind 9 local steps each
    with pytest.raises(PredictError, match="sync_delay must be an integer in 0..9"):
        predict(profile, 8, net, algorithm="streaming-diloco", tau=50, fragments=5, sync_delay=10)
