"""The simulator's user-facing side: comparisons, calibration to measurements, pictures and the
`workbench simulate` / `workbench calibrate` commands."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench import cli
from workbench.collectives import schedules, study, topology
from workbench.netsim import CalibrationError, SimulationError
from workbench.netsim.calibration import calibrate, load_measurements
from workbench.dashboard.pictures import link_use_figure, speedup_figure, topology_figure, trees_figure
from workbench.netsim.simulator import simulate

# a frozen copy of a `make bench` table (2026-11-22, this machine): `make bench` rewrites
# benchmarks/results/, so the tests never read it
MEASURED = str(Path(__file__).parent / "fixtures" / "allreduce_4ranks.json")


def test_compare_torus_8x8_against_the_models_closed_forms():
    frame = study.compare(topology.torus(8, 8), sizes=[32 << 10, 64 << 20])
    assert set(frame["algorithm"]) == set(study.PAPER_ALGORITHMS) and len(frame) == 2 * len(study.PAPER_ALGORITHMS)
    big = frame[frame["bytes"] == 64 << 20].set_index("algorithm")
    tree_steps = schedules.multitree(topology.torus(8, 8), 2).params["tree_steps"]
    # contention-free MultiTree vs ring: (n-1)/T at large sizes, the paper's own formula
    assert big.loc["multitree", "speedup_vs_ring"] == pytest.approx(63 / tree_steps, rel=0.01)
    assert big.loc["ring_2d_bidir", "speedup_vs_ring"] == pytest.approx(2.0, rel=0.01)
    worst = big["speedup_vs_ring"].idxmin()
    assert worst in ("double_binary_tree", "halving_doubling") and big.loc["double_binary_tree", "speedup_vs_ring"] < 1
    table = study.speedups(frame)
    assert list(table.columns) == ["32K", "64M"] and table.loc["ring"].tolist() == [1.0, 1.0]


def test_compare_rejects_bad_input_before_simulating():
    with pytest.raises(SimulationError, match="unknown algorithm.*allowed: ring"):
        study.compare(topology.ring(4), ["ring", "nope"])
    with pytest.raises(SimulationError, match="sizes must be positive"):
        study.compare(topology.ring(4), ["ring"], sizes=[0])
    with pytest.raises(SimulationError, match="mode must be one of"):
        study.compare(topology.ring(4), ["ring"], mode="x")
    with pytest.raises(SimulationError, match="no ring rows"):
        study.speedups(study.compare(topology.ring(4), ["linear"], sizes=[1024]))


def test_calibration_recovers_known_parameters():
    """Measurements made by the model itself: the fit must give its parameters back."""
    topo, alpha, bandwidth = topology.bus(4), 7e-6, 3e9
    rows = [{"algorithm": name, "bytes": size,
             "median_s": simulate(schedules.SCHEDULES[name](4), topo, size, bandwidth, alpha).seconds}
            for name in ("ring", "halving_doubling", "double_binary_tree") for size in (4096, 1 << 20, 64 << 20)]
    rows.append({"algorithm": "native", "bytes": 4096, "median_s": 1.0})   # not a schedule: left out
    cal = calibrate({"ranks": 4, "results": rows}, topo)
    assert cal.link_latency == pytest.approx(alpha, rel=1e-6) and cal.link_bandwidth == pytest.approx(bandwidth, rel=1e-6)
    assert len(cal.table) == 9 and cal.within(1e-6) == 1.0


def test_calibration_on_this_machines_measurements():
    """A `make bench` table (frozen in tests/fixtures): one host's ranks share memory bandwidth,
    which the bus model captures better than a crossbar (the measured fit is in the issue note)."""
    bus = calibrate(MEASURED, topology.bus(4))
    crossbar = calibrate(MEASURED)
    assert crossbar.topology.kind == "fully_connected" and crossbar.nranks == 4
    assert bus.within(0.25) >= 0.8 and bus.within(0.25) >= crossbar.within(0.25)
    assert bus.link_bandwidth > 0 and bus.link_latency > 0
    prediction = bus.simulate(schedules.ring(4), topology.bus(4), 1 << 20).seconds
    measured = load_measurements(MEASURED).query("algorithm == 'ring' and bytes == 1048576")["seconds"].item()
    assert prediction == pytest.approx(measured, rel=0.5)


def test_calibration_errors(tmp_path):
    with pytest.raises(CalibrationError, match="no measurements at"):
        calibrate(tmp_path / "missing.json")
    only_native = tmp_path / "native.json"
    only_native.write_text(json.dumps({"ranks": 4, "results": [{"algorithm": "native", "bytes": 8, "median_s": 1}]}))
    with pytest.raises(CalibrationError, match="no measurements of a schedule algorithm"):
        calibrate(only_native)


def test_pictures():
    torus = topology.torus(4, 4)
    trees = trees_figure(torus, k=2, roots=[0, 5])
    edges = 2 * (torus.nodes - 1)
    wraps = sum(1 for a in trees.layout.annotations if a.showarrow and a.arrowhead == 0)  # stubs of wrap links
    assert len([a for a in trees.layout.annotations if a.showarrow]) == edges + wraps
    mt = schedules.multitree(torus, 2)
    use = link_use_figure(mt, torus)
    titles = [a.text for a in use.layout.annotations if not a.showarrow]
    assert len(titles) == mt.num_steps // 2 and all("max 1/link" in t for t in titles)
    assert len(topology_figure(topology.fat_tree(16, nodes_per_leaf=4)).data) >= 2
    frame = study.compare(torus, ["ring", "multitree"], sizes=[1 << 20, 8 << 20])
    over_ring = {t.name: list(t.y) for t in speedup_figure(frame).data}
    assert over_ring["ring"] == [1.0, 1.0]
    assert over_ring["multitree"] == pytest.approx(list(frame[frame["algorithm"] == "multitree"]["speedup_vs_ring"]))
    over_tree = {t.name: list(t.y) for t in speedup_figure(frame, baseline="multitree").data}
    assert over_tree["multitree"] == [1.0, 1.0]  # the baseline is computed, not just relabelled
    assert over_tree["ring"] == pytest.approx([1 / s for s in over_ring["multitree"]])
    with pytest.raises(ValueError, match="baseline 'linear' is not in the comparison"):
        speedup_figure(frame, baseline="linear")
    with pytest.raises(ValueError, match="roots must be ranks 0..15"):
        trees_figure(torus, roots=[16])
    with pytest.raises(ValueError, match="steps must be in 0..13"):
        link_use_figure(mt, torus, steps=[99])


def test_cli_simulate_and_calibrate(capsys, tmp_path):
    out = tmp_path / "sim.json"
    assert cli.main(["simulate", "--topology", "torus:4x4", "--algorithms", "ring,multitree",
                     "--sizes", "64K,64M", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "multitree" in text and "vs ring" in text and "lockstep model" in text
    rows = json.loads(out.read_text())
    assert {r["algorithm"] for r in rows} == {"ring", "multitree"} and len(rows) == 4
    assert cli.main(["simulate", "--topology", "fat_tree:16x4", "--algorithms", "ring,multitree", "--sizes", "1M",
                     "--calibration", MEASURED, "--mode", "flow"]) == 0
    assert "calibrated on" in capsys.readouterr().out
    assert cli.main(["calibrate", "--json", MEASURED]) == 0
    assert "Calibration(bus, 4 ranks" in capsys.readouterr().out
    limited = tmp_path / "limited.json"
    assert cli.main(["simulate", "--topology", "torus:4x4", "--algorithms", "ring,multitree", "--sizes", "64M",
                     "--node-bandwidth", "16e9", "--json", str(limited)]) == 0
    assert "16 GB/s per node" in capsys.readouterr().out
    speedup = {r["algorithm"]: r["speedup_vs_ring"] for r in json.loads(limited.read_text())}
    unlimited = {r["algorithm"]: r["speedup_vs_ring"] for r in rows if r["bytes"] == 64 << 20}
    assert 1.0 <= speedup["multitree"] < unlimited["multitree"]


@pytest.mark.parametrize("argv, message", [
    (["simulate", "--topology", "donut:4"], "--topology: topology: unknown kind 'donut'"),
    (["simulate", "--topology", "torus:4x4", "--algorithms", "ring,foo"], "--algorithms: unknown 'foo'"),
    (["simulate", "--topology", "torus:4x4", "--k", "0"], "--k: must be an integer >= 1"),
])
def test_cli_bad_input(capsys, argv, message):
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    assert stop.value.code == 2 and message in capsys.readouterr().err


def test_cli_errors_after_parsing(capsys, tmp_path):
    assert cli.main(["simulate", "--topology", "torus:4x4", "--k", "1"]) == 2
    assert "k must be an integer >= 2" in capsys.readouterr().err
    assert cli.main(["simulate", "--topology", "torus:4x4", "--node-bandwidth", "0"]) == 2
    assert "node_bandwidth must be a number > 0" in capsys.readouterr().err
    assert cli.main(["calibrate", "--json", str(tmp_path / "none.json")]) == 2
    assert "no measurements at" in capsys.readouterr().err
