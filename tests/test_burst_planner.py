"""The workbench's burst-parallel planner (``workbench.burst.costs``, ``.planner``, ``.pictures``,
``workbench plan``): the dynamic program against brute force, the amplification limit, data
parallelism as a special case, branches and the GPU budget, the plan's timeline and transfers,
bad input, and the CLI's JSON contract and one-line errors. Fast: no torch, no MPI."""
from __future__ import annotations

import itertools
import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.burst.costs import CostModel, moved_samples, traffic
from workbench.burst.graph import BurstError, Layer, ModelGraph, ProfileTable, load_model, load_profile
from workbench.burst.plan import BurstPlan
from workbench.burst.planner import plan, structure
from workbench.cli import main

#: the published constants, and the same with cheap messages (so branches spread over GPUs)
PAPER = CostModel.paper()
CHEAP = CostModel.paper(latency_us=5.0)
MODELS = {"vgg16": 32, "wrn101_2": 32, "inception_v3": 16}


@pytest.fixture(scope="module")
def shipped():
    out = {}
    for name in MODELS:
        model = load_model(name)
        out[name] = (model, load_profile(model.profile_path))
    return out


def _layer(i, kind, prev, nxt, elements, params, prefix=None):
    return Layer(i, kind, {}, tuple(prev), tuple(nxt), elements, elements, params, prefix or f"{kind}{{\"i\":{i}}}",
                 "[1]")


def random_chain(rng: random.Random, n: int, batch: int) -> tuple[ModelGraph, ProfileTable]:
    """A chain of ``n`` layers with random sizes and a random table; some layers miss an inner
    batch size (interpolated)."""
    kinds = ["conv2d", "ReLU2d", "linear", "maxPool2d"]
    layers = [_layer(i, rng.choice(kinds), [i - 1] if i else [], [i + 1] if i < n - 1 else [],
                     rng.choice([10, 1000, 50_000, 400_000]), rng.choice([0, 100, 30_000, 3_000_000]))
              for i in range(n)]
    table = ProfileTable(source="random")
    sizes = [batch >> k for k in range(batch.bit_length())]
    for layer in layers:
        fixed, slope = rng.uniform(5, 400), rng.uniform(1, 200)
        gap = rng.random() < 0.3
        for b in sizes:
            if gap and b == sizes[len(sizes) // 2]:
                continue
            total = fixed + slope * b * rng.uniform(0.7, 1.3)
            table.add(layer, b, total * 0.4, total * 0.6)
    return ModelGraph("random", layers, layers[0].input_dim), table


def brute_force(model, table, batch, gpus, limit, cost) -> float:
    """The best feasible iteration time (us) over every assignment of widths to a chain's layers."""
    bound = cost.bind(model, table, batch)
    widths = [1 << k for k in range(min(gpus, batch).bit_length())]
    best = math.inf
    for choice in itertools.product(widths, repeat=len(model.layers)):
        total, feasible = 0.0, True
        for i, w in enumerate(choice):
            tr = bound.act(i - 1, range(choice[i - 1]), range(w)) if i else 0.0
            t = tr + bound.compute(i, w) + bound.sync(i, w)
            if not bound.exempt(i) and bound.amplification(i, w, t) > limit * (1 + 1e-9):
                feasible = False
                break
            total += t
        if feasible:
            best = min(best, total)
    return best


def test_the_planner_equals_brute_force_on_random_chains():
    rng = random.Random(7)
    for case in range(60):
        n, batch, gpus = rng.randint(1, 6), rng.choice([8, 16]), rng.choice([1, 2, 4, 4, 8, 8])
        if n == 6 and gpus == 8:
            gpus = 4
        limit = rng.choice([1.2, 1.5, 2.0, 3.0, math.inf])
        cost = CostModel.paper(latency_us=rng.choice([0.0, 5.0, 240.0]), bandwidth=rng.choice([1e3, 2.66e5]),
                               exempt_us=rng.choice([0.0, 100.0, 300.0]), missing="error")
        model, table = random_chain(rng, n, batch)
        p = plan(model, table, batch, gpus, limit, cost=cost)
        best = brute_force(model, table, batch, gpus, limit, cost)
        assert p.iteration_ms * 1e3 == pytest.approx(best, rel=1e-9), case
        assert p.iteration_ms == pytest.approx(sum(l.time_ms for l in p.layers), rel=1e-12)
        bound = cost.bind(model, table, batch)
        assert all(l.amplification <= limit * (1 + 1e-9) for l in p.layers if not bound.exempt(l.id))


def _check_plan(p: BurstPlan, model: ModelGraph):
    """The invariants every plan keeps: ranks within the budget, sample shares partition the
    batch, a per-GPU timeline without overlaps, layers after their inputs, joins after their
    slowest branch, transfers matching their layers."""
    assert p.gpus_used <= p.gpus and all(0 <= g < p.gpus for l in p.layers for g in l.ranks)
    assert sorted(l.id for l in p.layers) == list(range(len(model.layers)))
    for l in p.layers:
        assert len(l.ranks) == l.gpus == len(set(l.ranks)) == len(l.samples) and l.batch_per_gpu * l.gpus == p.batch
        assert l.samples[0][0] == 0 and l.samples[-1][1] == p.batch
        assert all(a[1] == b[0] for a, b in zip(l.samples, l.samples[1:]))
        assert l.end_ms == pytest.approx(l.start_ms + l.time_ms, abs=1e-9)
        prev = model.layers[l.id].prev
        if prev:
            assert l.start_ms >= max(p.layer(q).end_ms for q in prev) - 1e-9
        if len(prev) > 1:   # a join starts when its slowest branch ends
            assert l.start_ms == pytest.approx(max(p.layer(q).end_ms for q in prev), abs=1e-9)
    by_gpu: dict = {}
    for b in p.timeline():
        by_gpu.setdefault(b.gpu, []).append(b)
    for spans in by_gpu.values():
        spans.sort(key=lambda b: b.start_ms)
        assert all(b.start_ms >= a.end_ms - 1e-9 for a, b in zip(spans, spans[1:]))
    assert p.iteration_ms == pytest.approx(max(l.end_ms for l in p.layers), abs=1e-9)
    assert p.gpu_ms == pytest.approx(sum(l.time_ms * l.gpus for l in p.layers), rel=1e-9)
    moved = {(t.src, t.dst) for t in p.transfers}
    for t in p.transfers:
        src, dst = p.layer(t.src), p.layer(t.dst)
        assert t.src in model.layers[t.dst].prev and t.src_ranks == src.ranks and t.dst_ranks == dst.ranks
        elements = model.layers[t.src].output_elements
        assert t.bytes == moved_samples(p.batch, src.ranks, dst.ranks) * elements * 4 > 0 and t.ms > 0
        assert dst.transfer_ms >= t.ms - 1e-12
    for l in p.layers:
        for q in model.layers[l.id].prev:
            assert ((q, l.id) in moved) == (moved_samples(p.batch, p.layer(q).ranks, l.ranks) > 0)


@pytest.mark.parametrize("cost", [PAPER, CHEAP], ids=["paper", "cheap"])
def test_shipped_models_keep_the_limit_and_beat_data_parallelism(shipped, cost):
    for name, batch in MODELS.items():
        model, table = shipped[name]
        bound = cost.bind(model, table, batch)
        for gpus in (4, 8):
            dp = plan(model, table, batch, gpus, data_parallel=True, cost=cost)
            assert [l.gpus for l in dp.layers] == [gpus] * len(model.layers) and dp.gpus_used == gpus
            _check_plan(dp, model)
            times = []
            for limit in (1.5, 2.0, math.inf):
                p = plan(model, table, batch, gpus, limit, cost=cost)
                _check_plan(p, model)
                for l in p.layers:
                    if not bound.exempt(l.id):
                        assert l.amplification <= limit * (1 + 1e-9), (name, gpus, limit, l.id)
                times.append(p.iteration_ms)
            assert times == sorted(times, reverse=True), (name, gpus, times)   # a looser limit never hurts
            assert times[-1] <= dp.iteration_ms + 1e-9, (name, gpus)


def test_raising_the_limit_never_raises_the_time_on_chains():
    rng = random.Random(3)
    limits = (1.1, 1.3, 1.5, 2.0, 2.5, 3.0, 5.0, math.inf)
    for _ in range(15):
        model, table = random_chain(rng, 8, 16)
        for cost in (PAPER, CHEAP):
            cost = CostModel.paper(latency_us=cost.latency_us, missing="error")
            times = [plan(model, table, 16, 16, a, cost=cost).iteration_ms for a in limits]
            assert all(b <= a + 1e-9 for a, b in zip(times, times[1:])), times
    for name in ("vgg16", "wrn101_2"):
        times = [plan(name, None, 32, 16, a, cost=CHEAP).iteration_ms for a in limits]
        assert all(b <= a + 1e-9 for a, b in zip(times, times[1:])), (name, times)


def test_one_gpu_is_the_serial_time(shipped):
    for name, batch in MODELS.items():
        model, table = shipped[name]
        bound = PAPER.bind(model, table, batch)
        serial = sum(bound.compute(l.id, 1) for l in model.layers) / 1e3
        for limit in (1.5, math.inf):
            p = plan(model, table, batch, 1, limit)
            assert p.iteration_ms == pytest.approx(serial, rel=1e-12) and p.gpu_ms == pytest.approx(serial)
            assert p.gpus_used == 1 and not p.transfers and all(l.sync_ms == 0 for l in p.layers)


def branchy() -> tuple[ModelGraph, ProfileTable]:
    """0 -> fork 1 -> branches (2, 3), (4), (5, 6, 7 nested fork -> 8, 9 -> join 10), (11), () -> join 12
    -> 13; branch times do not shrink with the batch (width 1 is best)."""
    edges = {0: [1], 1: [2, 4, 5, 11, 12], 2: [3], 3: [12], 4: [12], 5: [6], 6: [7], 7: [8, 9], 8: [10], 9: [10],
             10: [12], 11: [12], 12: [13], 13: []}
    prev = {i: [p for p, ns in edges.items() if i in ns] for i in edges}
    layers = [_layer(i, "conv2d", prev[i], edges[i], 1000, 10) for i in edges]
    table = ProfileTable(source="branchy")
    times = {2: 300, 3: 300, 4: 1000, 5: 200, 6: 200, 7: 100, 8: 400, 9: 50, 10: 10, 11: 10}
    for layer in layers:
        for b in (1, 2, 4, 8, 16):
            t = times.get(layer.id, 100 * b)
            table.add(layer, b, t / 2, t / 2)
    return ModelGraph("branchy", layers, 1000), table


def test_a_join_costs_its_slowest_branch_and_no_plan_exceeds_its_gpus(shipped):
    model, table = branchy()
    assert [type(x).__name__ for x in structure(model)] == ["int", "int", "Block", "int", "int"]
    free = CostModel.paper(latency_us=0.0, bandwidth=1e12, missing="error")
    serial = plan(model, table, 16, 1, cost=free)
    _check_plan(serial, model)   # one GPU: the branches one after another
    assert serial.layer(12).start_ms == pytest.approx(serial.layer(1).end_ms + (300 + 300 + 1000 + 200 + 200 + 100
                                                                                  + 400 + 50 + 10 + 10) / 1e3)
    wide = plan(model, table, 16, 8, cost=free)
    _check_plan(wide, model)
    # enough GPUs: the branches run side by side, the join waits for the slowest (layer 4, 1 ms)
    assert wide.layer(12).start_ms == pytest.approx(wide.layer(1).end_ms + 1.0)
    assert wide.layer(10).start_ms == pytest.approx(wide.layer(7).end_ms + 0.4)   # the nested join likewise
    assert wide.iteration_ms < serial.iteration_ms
    for gpus in (2, 4):
        p = plan(model, table, 16, gpus, cost=free)
        _check_plan(p, model)
        assert serial.iteration_ms >= p.iteration_ms >= wide.iteration_ms - 1e-9
    inception, itable = shipped["inception_v3"]
    for gpus, cost in ((2, PAPER), (8, PAPER), (2, CHEAP), (8, CHEAP), (32, CHEAP)):
        p = plan(inception, itable, 16, gpus, math.inf, cost=cost)
        _check_plan(p, inception)
        if cost is CHEAP and gpus == 8:   # side branches packed beside the main one: layers at the same time
            assert any(a.start_ms < b.end_ms - 1e-9 and b.start_ms < a.end_ms - 1e-9
                       for a, b in itertools.combinations(p.layers, 2))


def test_only_series_parallel_graphs():
    edges = {0: [1, 2], 1: [3], 2: [3, 4], 3: [4], 4: []}   # 2 feeds two joins
    prev = {i: [p for p, ns in edges.items() if i in ns] for i in edges}
    model = ModelGraph("crossed", [_layer(i, "conv2d", prev[i], edges[i], 10, 10) for i in edges], 10)
    with pytest.raises(BurstError, match="only series-parallel graphs can be planned"):
        structure(model)


def test_cost_terms():
    model, table = load_model("inception_v3"), load_profile("inception_v3")
    conv = model.layers[0]
    assert PAPER.param_bytes(model, conv) == (conv.param_count + 2 * 32) * 4   # its BatchNorm counted
    vgg = load_model("vgg16")
    assert PAPER.param_bytes(vgg, vgg.layers[0]) == vgg.layers[0].param_count * 4
    assert PAPER.sync_us(1e6, 1) == 0.0
    assert PAPER.sync_us(1e6, 8) == pytest.approx(2 * 7 * (5 + 1e6 / 8 / 2.66e5))   # ring at 5 us per step
    assert CostModel.paper(sync_latency_us=None).sync_us(1e6, 8) == pytest.approx(2 * 7 * (240 + 1e6 / 8 / 2.66e5))
    # 8 samples from 2 GPUs to 4: GPU 1 sends [4, 6) to GPU 2 and [6, 8) to GPU 3, GPU 0 [2, 4) to GPU 1
    assert traffic(8, (0, 1), (0, 1, 2, 3)) == ((0, 1, 2), (1, 2, 2), (1, 3, 2))
    assert PAPER.act_us(8, [((0, 1), (0, 1, 2, 3), 100)]) == pytest.approx(2 * (2 * 240 + 4 * 100 * 4 / 2.66e5))
    assert moved_samples(32, range(1), range(8)) == 28 and moved_samples(32, range(4), range(4)) == 0
    bound = PAPER.bind(model, table, 16)
    assert bound.compute(122, 4) == 0.0   # adAvgPool2d: no row of its type, missing="zero"
    with pytest.raises(BurstError, match="no layer of type concat has a row"):
        CostModel.paper(missing="error").bind(model, table, 16).compute(15, 1)


def test_interpolation_and_a_profile_missing_a_batch_size():
    model = load_model("vgg16")
    table = load_profile(model.profile_path)
    layer = model.layers[2]
    lo, hi = table.time(layer, 6).avg_us, table.time(layer, 16).avg_us
    del table.entries[layer.key(8)]   # measured: 1 2 3 4 6 8 16 32 64
    assert PAPER.bind(model, table, 32).compute(2, 4) == pytest.approx(lo + (hi - lo) * (8 - 6) / (16 - 6))
    del table.entries[layer.key(1)]
    with pytest.raises(BurstError, match=r"layer 2 \(conv2d\) at per-GPU batch 1, outside the measured batches "
                                         r"\[2, 3, 4, 6, 16, 32, 64\]"):
        plan(model, table, 32, 32, 2.0)
    plan(model, table, 32, 16, 2.0)   # per-GPU batches 2..32 are there


@pytest.mark.parametrize("kwargs,message", [
    (dict(batch=30, gpus=8), "batch 30 must be divisible by 8"),
    (dict(batch=30, gpus=8, data_parallel=True), "batch 30 must be divisible by 8 GPUs"),
    (dict(batch=32, gpus=64, data_parallel=True), "batch 32 must be divisible by 64 GPUs"),
    (dict(batch=32, gpus=6), "gpus must be a power of two"),
    (dict(batch=32, gpus=8, amplification=1.0), "amplification limit must be a number > 1"),
    (dict(batch=0, gpus=8), "batch must be an integer >= 1"),
    (dict(model="resnet9000"), "model must be one of vgg16, wrn101_2, inception_v3"),
])
def test_bad_input_is_a_clear_error(kwargs, message):
    args = dict(model="vgg16", batch=32, gpus=8, amplification=2.0) | kwargs
    with pytest.raises(BurstError, match=message):
        plan(args.pop("model"), None, **args)


def test_cli_writes_the_plan_json(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", "--model", "wrn101_2", "--batch", "32", "--gpus", "8", "--amplification", "2",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "ResnetBottleneck" in text and "iteration" in text and "GPU time" in text
    d = json.loads(out.read_text())
    assert {"iteration_ms", "gpu_ms", "gpus_used", "layers", "transfers"} <= set(d)
    assert [l["id"] for l in d["layers"]] == list(range(39)) and d["cost_model"] == "workbench"
    assert {"id", "gpus", "ranks", "compute_ms", "sync_ms", "transfer_ms", "start_ms", "end_ms"} <= set(d["layers"][0])
    assert d["iteration_ms"] == pytest.approx(plan("wrn101_2", None, 32, 8, 2.0).iteration_ms)
    assert BurstPlan.from_dict(d).to_dict() == d
    assert main(["plan", "--model", "inception_v3", "--batch", "16", "--gpus", "4", "--amplification", "inf",
                 "--json", str(out)]) == 0
    assert json.loads(out.read_text())["amplification"] == "inf"
    assert main(["plan", "--model-file", str(load_model("vgg16").profile_path.parent.parent / "models" / "vgg16.json"),
                 "--batch", "32", "--gpus", "4", "--data-parallel", "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["data_parallel"] and {l["gpus"] for l in d["layers"]} == {4}


def test_cli_deeppool_branch(tmp_path):
    from workbench.burst.deeppool import plan_deeppool
    out = tmp_path / "plan.json"
    assert main(["plan", "--model", "vgg16", "--batch", "32", "--gpus", "8", "--amplification", "2",
                 "--cost-model", "deeppool", "--json", str(out)]) == 0
    expected = plan_deeppool(load_model("vgg16"), load_profile("vgg16"), 32, 8, amplification=2.0)
    assert json.loads(out.read_text()) == json.loads(json.dumps(expected.to_dict()))


def _bench_file(path: Path, latency: float, bandwidth: float, ranks: int = 4) -> str:
    """A ``workbench bench allreduce --json`` file of all-reduces timed as links of ``latency`` s per
    hop and ``bandwidth`` bytes/s would time them: the simulator on ``bus:ranks``, the network
    ``workbench calibrate`` and ``plan --calibration`` fit by default."""
    from workbench import schedules
    from workbench.netsim.simulator import simulate
    from workbench.network.topology import bus
    rows = [{"algorithm": a, "bytes": n, "median_s": simulate(schedules.SCHEDULES[a](ranks), bus(ranks), n,
                                                              link_bandwidth=bandwidth, link_latency=latency).seconds}
            for a in ("ring", "recursive_doubling", "binary_tree") for n in (4 << 10, 64 << 10, 1 << 20, 8 << 20)]
    path.write_text(json.dumps({"ranks": ranks, "results": rows}))
    return str(path)


def test_cli_calibrated_network(tmp_path, capsys):
    from workbench.netsim.calibration import calibrate_file
    fast = _bench_file(tmp_path / "fast.json", 5e-6, 10e9)
    slow = _bench_file(tmp_path / "slow.json", 50e-6, 1e9)   # every message 10x slower
    assert main(["calibrate", "--json", fast]) == 0             # the real command fits back what made the file
    assert "latency 5.00 us/hop, bandwidth 10.000 GB/s; 100% of 12 measurements" in capsys.readouterr().out
    cal = calibrate_file(slow)
    assert (cal.link_latency, cal.link_bandwidth) == (pytest.approx(50e-6, rel=1e-6), pytest.approx(1e9, rel=1e-6))

    def planned(bench: str, *how: str) -> dict:
        out = tmp_path / "plan.json"
        assert main(["plan", "--model", "vgg16", "--batch", "32", "--gpus", "4", *how, "--calibration", bench,
                     "--json", str(out)]) == 0
        return json.loads(out.read_text())

    # data parallel: each layer's gradient sync takes 10x as long on the 10x slower links, its compute the same
    dp_fast, dp_slow = planned(fast, "--data-parallel"), planned(slow, "--data-parallel")
    assert sum(l["sync_ms"] for l in dp_fast["layers"]) > 100
    for f, s in zip(dp_fast["layers"], dp_slow["layers"]):
        assert s["compute_ms"] == f["compute_ms"] and s["sync_ms"] == pytest.approx(10 * f["sync_ms"], rel=1e-6)
    # no amplification limit: the fast links make spreading layers over the 4 GPUs pay, the slow ones do not
    burst_fast, burst_slow = planned(fast, "--amplification", "inf"), planned(slow, "--amplification", "inf")
    assert burst_fast["gpus_used"] == 4 and burst_fast["iteration_ms"] < burst_slow["iteration_ms"]
    assert burst_slow["gpus_used"] == 1
    assert burst_slow["iteration_ms"] == pytest.approx(sum(l["compute_ms"] for l in burst_slow["layers"]))


@pytest.mark.parametrize("argv,message", [
    (["--model", "vgg16", "--batch", "30", "--gpus", "8", "--amplification", "2"], "batch 30 must be divisible by 8"),
    (["--model", "vgg16", "--batch", "32", "--gpus", "6", "--amplification", "2"], "gpus must be a power of two"),
    (["--model", "nope", "--batch", "32", "--gpus", "8", "--data-parallel"], "model must be one of"),
    (["--model", "vgg16", "--profile", "missing.prof", "--batch", "32", "--gpus", "8", "--data-parallel"],
     "profile: no file at missing.prof"),
    (["--model", "inception_v3", "--batch", "16", "--gpus", "8", "--data-parallel", "--missing", "error"],
     "no layer of type concat has a row"),
])
def test_cli_planner_errors_are_one_line(argv, message, capsys):
    assert main(["plan", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("workbench plan: error: ") and message in err


@pytest.mark.parametrize("argv,message", [
    (["--model", "vgg16", "--batch", "32", "--gpus", "8", "--amplification", "1"], "must be a number > 1"),
    (["--model", "vgg16", "--batch", "32", "--gpus", "8"], "one of the arguments --amplification --data-parallel"),
    (["--model", "vgg16", "--batch", "32", "--gpus", "8", "--amplification", "2", "--data-parallel"], "not allowed"),
    (["--model", "vgg16", "--gpus", "8", "--data-parallel"], "required: --batch"),
    (["--model", "vgg16", "--batch", "32", "--gpus", "8", "--data-parallel", "--cost-model", "x"], "invalid choice"),
    (["--model", "vgg16", "--batch", "32", "--gpus", "8", "--data-parallel", "--bogus"], "unrecognized arguments"),
    (["--model", "vgg16", "--batch", "x", "--gpus", "8", "--data-parallel"], "argument --batch: invalid int"),
])
def test_cli_option_errors_are_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("workbench plan: error: ") and message in err


def test_pictures(shipped):
    from workbench.burst.pictures import plan_figure, widths_figure
    model, table = shipped["inception_v3"]
    p = plan(model, table, 16, 8, math.inf, cost=CHEAP)
    fig = plan_figure(p)
    names = [t.name for t in fig.data]
    assert names[:3] == ["transfer", "compute", "sync"] and names[-1] == "idle"
    assert {y for t in fig.data for y in t.y} == {f"GPU {g}" for g in range(8)}
    busy = sum(sum(t.x) for t in fig.data if t.name != "idle")
    idle = sum(fig.data[-1].x)
    assert busy + idle == pytest.approx(8 * p.iteration_ms)   # every GPU row covers the iteration
    plans = {f"A={a}": plan("vgg16", None, 32, 8, a, cost=CHEAP) for a in (1.5, 2.0, math.inf)}
    fig = widths_figure(plans)
    assert len(fig.data) == 3 and list(fig.data[0].y) == [l.gpus for l in plans["A=1.5"].layers]


def test_planning_imports_neither_torch_nor_mpi():
    code = ("import sys, math; from workbench.burst.planner import plan; import workbench.burst.pictures as pic; "
            "p = plan('vgg16', None, 32, 8, 2.0); pic.plan_figure(p); import workbench.cli.plan; "
            "bad = [m for m in ('torch', 'mpi4py') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_ranks_sharing_cores_compute_slower_when_wider_than_the_cores():
    model, table = load_model("vgg16"), load_profile("vgg16")
    own, shared = CostModel.paper(), CostModel.paper(cores=2)
    b_own, b_shared = own.bind(model, table, 32), shared.bind(model, table, 32)
    assert b_shared.compute(0, 2) == b_own.compute(0, 2)            # 2 ranks on 2 cores: no sharing
    assert b_shared.compute(0, 8) == pytest.approx(4 * b_own.compute(0, 8))
    assert b_shared.single(0) == b_own.single(0)
    with pytest.raises(BurstError, match="cores must be an integer >= 1 or None"):
        CostModel.paper(cores=0)
