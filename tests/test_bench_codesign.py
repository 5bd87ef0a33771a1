"""benchmarks/codesign.py's own code paths (not its timings): the virtual-cluster arguments are
checked before any cluster comes up, and the training window leaves evaluations out."""
import importlib.util
from pathlib import Path

import pytest

from workbench.telemetry import comm_fraction

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "codesign.py"


@pytest.fixture(scope="module")
def codesign():
    spec = importlib.util.spec_from_file_location("codesign_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("argv, option", [
    (["--nodes", "1", "--bandwidth", "20mbit"], "--nodes"),
    (["--nodes", "0", "--bandwidth", "20mbit"], "--nodes"),
    (["--nodes", "4"], "--bandwidth"),
    (["--nodes", "4", "--bandwidth", "fast"], "--bandwidth"),
    (["--nodes", "4", "--bandwidth", "20mbit,,10mbit"], "--bandwidth"),
    (["--nodes", "4", "--bandwidth", "1bit"], "--bandwidth"),
    (["--bandwidth", "20mbit"], "--bandwidth"),
    (["--vcluster", "sx"], "--vcluster"),
    (["--nodes", "4", "--vcluster", "Bad-Name"], "--vcluster"),
    (["--nodes", "4", "--vcluster", "sx", "--bandwidth", "20mbit"], "--bandwidth"),
])
def test_cluster_arguments_refused_in_one_line(codesign, argv, option):
    with pytest.raises(codesign.BenchmarkArgumentError) as err:
        codesign.parse_args(argv)
    message = str(err.value)
    assert message.startswith(option + ":") and "\n" not in message


def test_cluster_arguments_accepted(codesign, tmp_path):
    args = codesign.parse_args(["--nodes", "4", "--bandwidth", "20mbit,10mbit"])
    assert args.rates == [20_000_000, 10_000_000]
    assert (args.model, args.dataset, args.batch, args.epochs) == ("lenet", "fashion-mnist", 128, 1)
    assert Path(args.json).name == "codesign_vcluster.json"
    attached = codesign.parse_args(["--nodes", "4", "--vcluster", "sx"])
    assert attached.rates == [None]  # the running cluster's own rate
    host = codesign.parse_args([])
    assert (host.rates, host.model, host.dataset, host.batch) == ([], "wide_mlp", "digits", 32)


def _span(rank, name, cat, start_s, dur_s):
    return {"name": name, "cat": cat, "ph": "X", "ts": start_s * 1e6, "dur": dur_s * 1e6, "pid": rank, "tid": 0}


def test_training_window_leaves_the_final_evaluation_out(codesign):
    # rank 0 trains 1 s (0.5 s of it waiting on the exchange), then evaluates for 3 s;
    # rank 1 trains for 1.2 s; rank 2 (a master) only communicates
    events = [_span(0, "forward_backward", "compute", 0.0, 0.5), _span(0, "exchange", "comm", 0.5, 0.5),
              _span(0, "evaluate", "compute", 1.0, 3.0),
              _span(1, "forward_backward", "compute", 0.0, 0.9), _span(1, "exchange", "comm", 0.9, 0.3),
              _span(2, "reply", "comm", 0.0, 1.1),
              {"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "rank 0"}}]
    window = codesign.training_window(events)
    assert window["seconds"] == pytest.approx(1.2)
    assert window["comm_fraction"] == pytest.approx({0: 0.5, 1: 0.25})
    # the run's own definition over the whole wall time would count the evaluation as compute
    assert comm_fraction([e for e in events if e.get("pid") == 0 and e["ph"] == "X"], 4.0) == pytest.approx(0.125)
    assert window["compute_step_seconds"] == pytest.approx(0.7)
