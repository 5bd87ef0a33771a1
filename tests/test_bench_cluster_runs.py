"""The training benchmarks' virtual-cluster code paths (not their timings): the cluster arguments are
checked before any cluster comes up (workbench/bench/cluster_runs.py, benchmarks/codesign.py), the
placement gives a master its own node, and the training window leaves evaluations out."""
import argparse
import importlib.util
from pathlib import Path

import pytest

from workbench.bench import cluster_runs
from workbench.telemetry import comm_fraction

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _parse(argv, several_rates=True):
    parser = argparse.ArgumentParser()
    cluster_runs.add_cluster_arguments(parser, several_rates)
    args = parser.parse_args(argv)
    cluster_runs.check_cluster_args(args, several_rates)
    return args


@pytest.mark.parametrize("argv, option", [
    (["--nodes", "1", "--bandwidth", "20mbit"], "--nodes"),
    (["--nodes", "0", "--bandwidth", "20mbit"], "--nodes"),
    (["--nodes", "253", "--bandwidth", "20mbit"], "--nodes"),
    (["--nodes", "4"], "--bandwidth"),
    (["--nodes", "4", "--bandwidth", "fast"], "--bandwidth"),
    (["--nodes", "4", "--bandwidth", "20mbit,,10mbit"], "--bandwidth"),
    (["--nodes", "4", "--bandwidth", "1bit"], "--bandwidth"),
    (["--bandwidth", "20mbit"], "--bandwidth"),
    (["--vcluster", "sx"], "--vcluster"),
    (["--nodes", "4", "--vcluster", "Bad-Name"], "--vcluster"),
    (["--nodes", "4", "--vcluster", "sx", "--bandwidth", "20mbit"], "--bandwidth"),
])
def test_cluster_arguments_refused_in_one_line(argv, option):
    with pytest.raises(cluster_runs.ClusterArgumentError) as err:
        _parse(argv)
    message = str(err.value)
    assert message.startswith(option + ":") and "\n" not in message


def test_one_rate_where_only_one_is_used():
    assert _parse(["--nodes", "4", "--bandwidth", "20mbit"], several_rates=False).rates == [20_000_000]
    with pytest.raises(cluster_runs.ClusterArgumentError, match="^--bandwidth: one rate"):
        _parse(["--nodes", "4", "--bandwidth", "20mbit,10mbit"], several_rates=False)


def test_cluster_arguments_accepted():
    assert _parse(["--nodes", "4", "--bandwidth", "20mbit,10mbit"]).rates == [20_000_000, 10_000_000]
    assert _parse(["--nodes", "4", "--vcluster", "sx"]).rates == [None]  # the running cluster's own rate
    assert _parse([]).rates == []


def _script(name):
    spec = importlib.util.spec_from_file_location(f"{name}_benchmark", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_codesign_defaults_per_mode():
    codesign = _script("codesign")
    on_cluster = codesign.parse_args(["--nodes", "4", "--bandwidth", "20mbit,10mbit"])
    assert (on_cluster.model, on_cluster.dataset, on_cluster.batch, on_cluster.epochs) == ("lenet", "fashion-mnist", 128, 1)
    assert Path(on_cluster.json).name == "codesign_vcluster.json"
    host = codesign.parse_args([])
    assert (host.rates, host.model, host.dataset, host.batch) == ([], "wide_mlp", "digits", 32)
    with pytest.raises(cluster_runs.ClusterArgumentError, match="^--nodes"):
        codesign.parse_args(["--nodes", "1", "--bandwidth", "20mbit"])


def test_ordering_takes_one_rate():
    ordering = _script("ordering")
    args = ordering.parse_args(["--nodes", "4", "--bandwidth", "100mbit", "--dataset", "fashion-mnist"])
    assert args.rates == [100_000_000] and Path(args.json).name == "ordering_vcluster.json"
    assert Path(ordering.parse_args([]).json).name == "ordering_4ranks.json"
    with pytest.raises(cluster_runs.ClusterArgumentError, match="^--bandwidth: one rate"):
        ordering.parse_args(["--nodes", "4", "--bandwidth", "100mbit,10mbit"])


def test_a_master_gets_a_node_of_its_own():
    assert cluster_runs.training_ranks("sync-easgd", 4) == 4
    assert cluster_runs.training_ranks("easgd", 4) == 5
    assert cluster_runs.training_ranks("hogwild-sgd", 4) == 5


def _span(rank, name, cat, start_s, dur_s):
    return {"name": name, "cat": cat, "ph": "X", "ts": start_s * 1e6, "dur": dur_s * 1e6, "pid": rank, "tid": 0}


def test_training_window_leaves_the_final_evaluation_out():
    # rank 0 trains 1 s (0.5 s of it waiting on the exchange), then evaluates for 3 s;
    # rank 1 trains for 1.2 s; rank 2 (a master) only communicates
    events = [_span(0, "forward_backward", "compute", 0.0, 0.5), _span(0, "exchange", "comm", 0.5, 0.5),
              _span(0, "evaluate", "compute", 1.0, 3.0),
              _span(1, "forward_backward", "compute", 0.0, 0.9), _span(1, "exchange", "comm", 0.9, 0.3),
              _span(2, "reply", "comm", 0.0, 1.1),
              {"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "rank 0"}}]
    window = cluster_runs.training_window(events)
    assert window["seconds"] == pytest.approx(1.2)
    assert window["comm_fraction"] == pytest.approx({0: 0.5, 1: 0.25})
    # the run's own definition over the whole wall time would count the evaluation as compute
    assert comm_fraction([e for e in events if e.get("pid") == 0 and e["ph"] == "X"], 4.0) == pytest.approx(0.125)
    assert window["compute_step_seconds"] == pytest.approx(0.7)
