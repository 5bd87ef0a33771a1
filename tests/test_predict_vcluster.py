"""The predictor against the virtual cluster (``benchmarks/predict_check.py --vcluster``): its network
model (:func:`workbench.netsim.costs.tcp_link`), the latency probe, a run's steady step time from its
trace, and the benchmark's whole path at the smallest scale (no timing is asserted: the figures are
the benchmark's, in ``benchmarks/results/predict_check_vcluster.json``)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workbench import schedules
from workbench.netsim.costs import TCP_PAYLOAD_SHARE, CostError, tcp_link
from workbench.netsim.simulator import simulate
from workbench.network import topology
from workbench.telemetry import steady_step_seconds
from workbench.vcluster import VirtualCluster, VirtualClusterError
from workbench.vcluster.probe import one_way_latency

from vcluster_fixture import vcluster_name

ROOT = Path(__file__).resolve().parent.parent


def _span(rank: int, name: str, ts: float, dur: float = 1.0) -> dict:
    return {"ph": "X", "pid": rank, "name": name, "cat": "compute", "ts": ts, "dur": dur}


def test_the_steady_step_runs_from_step_skip_to_the_last_steps_start_averaged_over_ranks():
    # rank 0: steps 100 us apart after a slow first one; rank 1: 200 us apart; the last step's
    # evaluation (after its start) and other spans are not steps
    events = [_span(0, "forward_backward", t) for t in (0, 900, 1000, 1100, 1200)]
    events += [_span(1, "forward_backward", t) for t in (0, 800, 1000, 1200, 1400)]
    events += [_span(0, "evaluate", 1300, 5000), _span(1, "update", 50), {"ph": "M", "pid": 0, "name": "process_name"}]
    assert steady_step_seconds(events, skip=1) == pytest.approx((100 + 200) / 2 * 1e-6)
    assert steady_step_seconds(events, skip=0) == pytest.approx(((1200 / 4) + (1400 / 4)) / 2 * 1e-6)
    with pytest.raises(ValueError, match="rank 0 has 5 'forward_backward' spans; skip=4 needs at least 6"):
        steady_step_seconds(events, skip=4)
    with pytest.raises(ValueError, match="no 'forward_backward' span: was telemetry on"):
        steady_step_seconds([_span(0, "update", 0)])
    with pytest.raises(ValueError, match="skip must be an integer >= 0"):
        steady_step_seconds(events, skip=-1)


@pytest.mark.parametrize("nranks", [2, 4])
def test_a_tcp_link_is_the_switch_the_virtual_cluster_benchmark_simulates(nranks):
    # every rank its own shaped port: the closed-form ring equals the simulator on switch(n), where
    # a hop is two links (uplink, downlink) of half the one-way latency each
    link = tcp_link(200e6, 30e-6)
    assert link.bandwidth == pytest.approx(200e6 / 8 * 1448 / 1514) and TCP_PAYLOAD_SHARE == 1448 / 1514
    for nbytes in (4096, 1 << 20, 44 << 20):
        simulated = simulate(schedules.SCHEDULES["ring"](nranks), topology.switch(nranks), nbytes, link.bandwidth,
                             link.latency / 2).seconds
        assert link.allreduce(nbytes, nranks) == pytest.approx(simulated)
    with pytest.raises(CostError, match="rate_bits must be a number > 0"):
        tcp_link(0, 30e-6)


def test_the_shapers_burst_is_the_models():
    # the bucket the virtual cluster's HTB gets (2 ms at the rate, at least 64 KiB) is what tcp_link
    # is told, in payload bytes as its bandwidth is
    from workbench.vcluster.plan import Plan
    from workbench.vcluster.wiring import _shaping, burst_bytes
    assert burst_bytes(200 * 10**6) == 64 << 10 and burst_bytes(10**10) == 10**10 // 8 * 2 // 1000
    lines = _shaping(Plan("vc", 2, bandwidth="200mbit"), "veth0")
    assert f"burst {64 << 10} cburst {64 << 10}" in lines[1]
    link = tcp_link(200e6, 30e-6, burst_bytes=burst_bytes(200 * 10**6))
    assert link.burst == pytest.approx((64 << 10) * TCP_PAYLOAD_SHARE) and tcp_link(200e6, 30e-6).burst == 0
    with pytest.raises(CostError, match="burst_bytes must be a number >= 0"):
        tcp_link(200e6, 30e-6, burst_bytes=-1)


def test_the_one_way_latency_of_two_nodes(vc4):
    latency = one_way_latency(vc4, 0, 1, rounds=200)
    assert 0 < latency < 0.05   # the kernel's own: tens of microseconds, more on a busy machine
    with pytest.raises(VirtualClusterError, match="target must be another node than source"):
        one_way_latency(vc4, 2, 2)


def test_the_benchmarks_virtual_cluster_mode_end_to_end(tmp_path):
    """The smallest run of ``predict_check.py --vcluster``: mlp on 2 nodes, one profile + run pair; its
    JSON holds what the README's table reads, and the cluster is gone afterwards."""
    name = vcluster_name("p")[:6]
    out = tmp_path / "predict.json"
    proc = subprocess.run([sys.executable, "benchmarks/predict_check.py", "--vcluster", "1gbit", "--nodes", "2",
                           "--models", "mlp", "--quick", "--name", name, "--json", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=1500, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["rate"] == "1gbit" and report["machine"]["cpus"] and report["load_average"]["after"]
    cluster = report["clusters"]["2"]
    assert cluster["one_way_latency_s"] > 0 and cluster["bandwidth_Bps"] == pytest.approx(1e9 / 8 * TCP_PAYLOAD_SHARE)
    (row,) = cluster["rows"]
    for when in ("before", "after"):   # the inputs are measured on both sides of the run
        assert row[when]["profile"]["processes"] == 2 and row[when]["profile"]["lockstep"]
        assert row[when]["profile"]["pause_s"] > 0 and row[when]["latency_s"] >= 0
    assert row["predictions"]["lockstep"]["latency_s"] == pytest.approx(
        (row["before"]["latency_s"] + row["after"]["latency_s"]) / 2)
    assert row["predictions"]["before_only"]["latency_s"] == pytest.approx(row["before"]["latency_s"])
    assert row["run"]["steps_per_worker"] == report["plans"]["mlp"]["steps"]
    assert row["run"]["link_bytes"] >= row["run"]["wire_bytes_per_step"] * row["run"]["steps_per_worker"] > 0
    for variant, p in row["predictions"].items():
        assert p["step_s"] > p["compute_s"] > 0 and p["comm_s"] > 0, variant
        assert row["ratio"][variant] == pytest.approx(p["step_s"] / row["run"]["step_s"])
    # the links' burst only shortens a step (mlp's 204 kB fit 1 Gbit/s's 250 kB bucket: no transfer left)
    assert row["predictions"]["no_burst"]["step_s"] > row["predictions"]["lockstep"]["step_s"]
    (line,) = report["table"]
    assert line["lockstep_ratio"] == pytest.approx(line["lockstep_s"] / line["measured_s"])
    assert report["goals"][0]["met"] == (abs(line["lockstep_ratio"] - 1) <= 0.15)
    assert "predicted vs measured step time" in proc.stdout and not out.with_suffix(".partial.json").exists()
    with pytest.raises(VirtualClusterError, match="is not up"):
        VirtualCluster.attach(f"{name}n2")


def test_the_benchmarks_easgd_family_mode_end_to_end(tmp_path):
    """``--algorithms``: the original EASGD's master on a node of its own, Local SGD's run rounded to
    whole periods of H, each predicted as its own algorithm; the master's spans and the links' drops
    are recorded."""
    name = vcluster_name("e")[:6]
    out = tmp_path / "easgd.json"
    proc = subprocess.run([sys.executable, "benchmarks/predict_check.py", "--vcluster", "1gbit", "--nodes", "2",
                           "--models", "mlp", "--quick", "--algorithms", "easgd,local-sgd", "--queue", "1M",
                           "--name", name, "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=1500, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    cluster = report["clusters"]["2"]
    assert cluster["queue_bytes"] == 1 << 20
    easgd, local = cluster["rows"]
    assert (easgd["algorithm"], local["algorithm"]) == ("easgd", "local-sgd")
    master = easgd["run"]["spans"]["master"]   # rank 0 served every exchange of both workers
    assert master["receive"]["count"] == master["reply"]["count"] == 2 * easgd["steps"]
    assert easgd["run"]["spans"]["workers"]["exchange"]["count"] == 2 * easgd["steps"]
    assert easgd["run"]["link_drops"] >= 0 and easgd["socket_buffer_bytes"] > 0
    # without socket buffers a turn at the master is the whole exchange: never shorter (equal, to the
    # last bits, where the workers' compute sets the round)
    unbuffered, buffered = (easgd["predictions"][v]["step_s"] for v in ("no_socket_buffer", "lockstep"))
    assert unbuffered >= buffered * (1 - 1e-12)
    assert (local["steps"] - 3 - 1) % 10 == 0 and local["run"]["steps_per_worker"] == local["steps"]
    assert local["predictions"]["lockstep"]["wire_bytes"] < easgd["predictions"]["lockstep"]["wire_bytes"]
    assert {g["goal"].split(",")[0] for g in report["goals"]} == {"mlp easgd", "mlp local-sgd"}
    with pytest.raises(VirtualClusterError, match="is not up"):
        VirtualCluster.attach(f"{name}n2")
