"""The published DeepPool planner reproduced (workbench.burst.deeppool, its cost terms in
workbench.burst.deeppool_costs): the worked numbers of data/PLANNER_COST_MODEL.md, each quirk of its cost model and
search, plans for the three shipped models, bad input and the JSON round trip. Pure Python, fast."""
from __future__ import annotations

import json
import math

import pytest

from workbench.burst import deeppool as dp
from workbench.burst import deeppool_costs
from workbench.burst.deeppool import plan_deeppool
from workbench.burst.deeppool_costs import (BANDWIDTH, EXEMPT_US, LATENCY_US, PENALTY, activation_bytes,
                                            activation_path, activation_us, amplification_of, candidates, compute_us,
                                            gpus_needed, initial_config, no_parallel_us, sync_us)
from workbench.burst.graph import BurstError, Layer, LayerTime, ModelGraph, ProfileTable, load_model, load_profile
from workbench.burst.plan import BurstPlan, sample_ranges

CONCATS = 15   # concat layers of Inception-v3, nested ones included


@pytest.fixture(scope="module")
def data():
    out = {}
    for name in ("vgg16", "wrn101_2", "inception_v3"):
        model = load_model(name)
        out[name] = (model, load_profile(model.profile_path))
    return out


def cfg(layer: Layer, plan_layer, batch: int) -> tuple:
    """The config the plan chose for ``layer`` (only the batch is split)."""
    return (plan_layer.batch_per_gpu, *initial_config(layer, batch)[1:])


# ---- synthetic models: general-path layers of one value per sample, times chosen per test ----

def synthetic(times: list[dict[int, float]], edges: list[tuple[int, int]]) -> tuple[ModelGraph, ProfileTable]:
    """Layers 0..n-1 of a made-up type (general activation path, 1 value per sample), edges
    ``(src, dst)`` in order, ``times[i][b]`` = layer i's us at per-GPU batch b."""
    prev = {i: tuple(s for s, d in edges if d == i) for i in range(len(times))}
    nxt = {i: tuple(d for s, d in edges if s == i) for i in range(len(times))}
    layers = [Layer(i, "block", {"n": i}, prev[i], nxt[i], (1, 1, 1), (1, 1, 1), 0, f'block{{"n":{i}}}', "[1,1,1]")
              for i in range(len(times))]
    table = ProfileTable(source="synthetic")
    for layer, row in zip(layers, times):
        for b, us in row.items():
            table.entries[layer.key(b)] = LayerTime(us, us, 0.0)
    return ModelGraph("synthetic", layers, (1, 1, 1)), table


def noverlap_us(per_gpu: int, latency: float) -> float:
    """A synthetic edge's transfer without GPU overlap (the backward pass's adjustment)."""
    return 2 * (4 * per_gpu / BANDWIDTH + latency)


# ---- constants and worked numbers ----

def test_constants():
    assert (BANDWIDTH, LATENCY_US, EXEMPT_US, PENALTY) == (2.66e5, 240.0, 300.0, 1000.0)


def test_vgg_flatten_to_fc1_activation_498_11_published_worked_example(data):
    """An independent figure: PLANNER_COST_MODEL.md section 5's worked example (VGG-16 B=32 G=8
    limit 2, flatten -> fc1), 498.11 us by the published code's formula; matched to 0.01 us."""
    model, table = data["vgg16"]
    flatten, fc1 = model.layers[31], model.layers[32]
    assert activation_path(flatten, fc1) == "linear"
    assert activation_bytes(flatten, fc1, (8, 7, 7, 512), (32, 25088, 4096)) == (0, 4 * 24 * 25088)
    assert round(activation_us(flatten, fc1, (8, 7, 7, 512), (32, 25088, 4096)), 2) == 498.11
    plan = plan_deeppool(model, table, 32, 8, 2.0)
    assert (plan.layer(31).gpus, plan.layer(32).gpus) == (4, 1)
    assert round(plan.layer(32).transfer_ms * 1000, 2) == 498.11
    (t,) = [t for t in plan.transfers if t.dst == 32]
    assert (t.src, t.bytes, t.src_ranks, t.dst_ranks) == (31, 2408448, (0, 1, 2, 3), (0,))
    assert t.ms == pytest.approx(0.49811, abs=1e-5)


def test_inception_g1_published_figures(data):
    """Independent figures: runs of the published planner (seojinpark/DeepPool@7922cac) quoted in
    PLANNER_COST_MODEL.md section 6 (Inception-v3, B=16, G=1: iterMs 22.817 burst and 23.035
    data parallel, gpuMs 23.050 both); matched to 1 us (3 decimals of ms)."""
    model, table = data["inception_v3"]
    burst = plan_deeppool(model, table, 16, 1)
    base = plan_deeppool(model, table, 16, 1, data_parallel=True)
    assert round(burst.gpu_ms, 3) == 23.050 and round(base.gpu_ms, 3) == 23.050
    assert round(base.iteration_ms, 3) == 23.035
    assert round(burst.iteration_ms, 3) == 22.817
    assert burst.gpus_used == base.gpus_used == 1
    # DP iterMs = the plain sum of layer times; gpuMs adds each join's time once more (1 us each)
    total = sum(l.time_ms for l in base.layers)
    assert base.iteration_ms == pytest.approx(total, abs=1e-9)
    assert burst.gpu_ms - total == pytest.approx(CONCATS * 0.001, abs=1e-9)
    # the gap is the two E-blocks' dropped inner overtime, 109 us each
    assert base.iteration_ms - burst.iteration_ms == pytest.approx(0.218, abs=0.002)


# ---- cost pieces, one by one ----

def test_conv_filter_is_output_height_and_int_kernel_height_is_1(data):
    model, _ = data["vgg16"]
    conv0 = model.layers[0]                      # 3 -> 64 channels, 224x224, kernel 3
    assert initial_config(conv0, 32) == (32, 224, 224, 3, 224)
    assert sync_us(conv0, (32, 224, 224, 3, 224), 32) == pytest.approx((3 * 1 * 224 + 3) * 4 / 2.66e5)
    assert sync_us(conv0, (32, 224, 224, 3, 224), 32) == pytest.approx(0.0102, abs=1e-4)
    assert sync_us(conv0, (4, 224, 224, 3, 224), 32) == sync_us(conv0, (32, 224, 224, 3, 224), 32)
    # the 2-D activation's channel count from a conv source is that "filter" (224), not 64
    relu = model.layers[1]
    e, i = activation_bytes(conv0, relu, (4, 224, 224, 3, 224), (8, 224, 224, 64))
    assert max(e, i) == 4 * (8 - 4) * 224 * 224 * 224


def test_conv_sync_tuple_kernel(data):
    model, _ = data["inception_v3"]
    conv = model.layers[42]                      # kernel (1, 7), 17x17 out
    assert conv.params["kernel_size"] == [1, 7]
    c = initial_config(conv, 16)
    assert sync_us(conv, c, 16) == pytest.approx((7 * 17 + 7) * 4 / 2.66e5)


def test_linear_sync_zero_when_unsplit(data):
    model, _ = data["vgg16"]
    fc1, fc2, fc3 = model.layers[32], model.layers[34], model.layers[36]
    assert sync_us(fc1, (32, 25088, 4096), 32) == 0
    assert round(sync_us(fc1, (16, 25088, 4096), 32), 1) == 1545.3
    assert sync_us(fc2, (1, 4096, 4096), 32) == pytest.approx(4 * (4096 * 4096 + 4096) / 2.66e5)   # 252.35
    assert round(sync_us(fc3, (8, 4096, 1000), 32), 1) == 61.6


def test_sync_zero_for_other_types_resnet_bottleneck_too(data):
    model, table = data["wrn101_2"]
    block = model.layers[3]
    assert block.type == "ResnetBottleneck" and initial_config(block, 32) == (32, 64, 56, 56)
    assert sync_us(block, (4, 64, 56, 56), 32) == 0
    plan = plan_deeppool(model, table, 32, 8, math.inf)
    synced = {l.id for l in plan.layers if l.sync_ms > 0}
    assert synced <= {0, 38}                     # conv1 always (tiny), fc only when split
    assert 0 in synced


def test_missing_rows_and_nonpositive_rows_cost_1us(data):
    model, table = data["inception_v3"]
    for i in (15, 122, 123, 124):                # concat, adAvgPool2d, flatten, linear: no rows
        assert table.get(model.layers[i], 16) is None
        assert compute_us(table, model.layers[i], 16) == 1
    assert compute_us(table, model.layers[0], 16) == table.get(model.layers[0], 16).avg_us > 1
    m, t = synthetic([{1: 0.0, 2: -5.0}], [])
    assert compute_us(t, m.layers[0], 1) == 1 and compute_us(t, m.layers[0], 2) == 1


def test_table_keeps_last_row_per_key(data):
    model, table = data["vgg16"]
    assert compute_us(table, model.layers[1], 64) == pytest.approx(15309.0)   # not 4936


def test_activation_paths(data):
    vgg, _ = data["vgg16"]
    wrn, _ = data["wrn101_2"]
    assert activation_path(vgg.layers[0], vgg.layers[1]) == "2d"
    assert activation_path(vgg.layers[30], vgg.layers[31]) == "2d"           # maxPool -> flatten
    assert activation_path(vgg.layers[33], vgg.layers[34]) == "linear"       # ReLU1d -> linear
    assert activation_path(wrn.layers[2], wrn.layers[3]) == "general"        # maxPool -> bottleneck
    assert activation_path(wrn.layers[3], wrn.layers[4]) == "general"
    assert activation_path(wrn.layers[35], wrn.layers[36]) == "general"      # bottleneck -> adAvgPool
    # general: output elements of src, input elements of dst, overlap subtracted on both sides
    pool, block = wrn.layers[2], wrn.layers[3]
    f = 64 * 56 * 56
    assert activation_bytes(pool, block, (8, 112, 112, 64), (32, 64, 56, 56)) == (0, 4 * 24 * f)
    assert activation_bytes(pool, block, (8, 112, 112, 64), (32, 64, 56, 56), True) == (4 * 8 * f, 4 * 32 * f)
    # 2-D with matching shapes: 4*|S-D|*W*H*C; without overlap: 4*max(S,D)*W*H*C
    conv, relu = vgg.layers[28], vgg.layers[29]
    e, i = activation_bytes(vgg.layers[29], vgg.layers[30], (2, 14, 14, 512), (8, 14, 14, 512))
    assert max(e, i) == 4 * 6 * 14 * 14 * 512
    e, i = activation_bytes(vgg.layers[29], vgg.layers[30], (2, 14, 14, 512), (8, 14, 14, 512), True)
    assert max(e, i) == 4 * 8 * 14 * 14 * 512
    # same width: nothing moves, no latency
    assert activation_us(conv, relu, (4, 14, 14, 512, 14), (4, 14, 14, 512)) == 0
    # linear from a 3-tuple source: out features of src, in features of dst
    assert activation_bytes(vgg.layers[33], vgg.layers[34], (4, 4096, 4096), (1, 4096, 4096)) == (4 * 3 * 4096, 0)


def test_activation_time_formula_and_penalty(data):
    vgg, _ = data["vgg16"]
    pool, conv = vgg.layers[23], vgg.layers[24]                 # maxPool -> conv: no penalty
    b = 4 * (8 - 1) * 14 * 14 * 512
    assert activation_us(pool, conv, (1, 28, 28, 512), (8, 14, 14, 512, 14)) == pytest.approx(2 * (b / 2.66e5 + 240))
    assert activation_us(pool, conv, (1, 28, 28, 512), (8, 14, 14, 512, 14), bandwidth=1e5, latency_us=40) == \
        pytest.approx(2 * (b / 1e5 + 40))
    conv, relu = vgg.layers[26], vgg.layers[27]                 # conv -> ReLU2d: x1000
    b = 4 * (8 - 1) * 14 * 14 * 14                              # channels = the conv's output H
    assert activation_us(conv, relu, (1, 14, 14, 512, 14), (8, 14, 14, 512)) == \
        pytest.approx(PENALTY * 2 * (b / 2.66e5 + 240))
    pool, flatten = vgg.layers[30], vgg.layers[31]              # -> flatten: x1000
    b = 4 * (8 - 1) * 7 * 7 * 512
    assert activation_us(pool, flatten, (1, 14, 14, 512), (8, 7, 7, 512)) == \
        pytest.approx(1000 * 2 * (b / 2.66e5 + 240))
    fc, relu1 = vgg.layers[32], vgg.layers[33]                  # linear -> ReLU1d: x1000
    assert activation_us(fc, relu1, (1, 25088, 4096), (2, 4096, 4096)) == \
        pytest.approx(1000 * 2 * (4 * 4096 / 2.66e5 + 240))


def test_no_width_change_before_relu_or_flatten_in_plans(data):
    for name in ("vgg16", "wrn101_2"):
        model, table = data[name]
        for lim in (1.5, 2.0, math.inf):
            plan = plan_deeppool(model, table, 32, 8, lim)
            for l in plan.layers[1:]:
                if l.type in ("ReLU2d", "ReLU1d", "flatten"):
                    assert l.gpus == plan.layer(l.id - 1).gpus, (name, lim, l.id)


def test_amplification_formula_and_300us_exemption():
    assert amplification_of(400.0, 4, 1000.0) == pytest.approx(1.6)
    assert amplification_of(250.0, 2, 300.0) == 1          # unsplit time not above 300 us: exempt
    assert amplification_of(250.0, 2, 300.5) == pytest.approx(500 / 300.5)
    assert amplification_of(0.0, 8, 1000.0) == 1


def test_candidates_and_gpu_counts(data):
    model, _ = data["vgg16"]
    conv = model.layers[0]
    assert [c[0] for c in candidates(conv, 32, 8)] == [32, 16, 8, 4]
    assert [c[0] for c in candidates(conv, 16, 64)] == [16, 8, 4, 2, 1]      # b < 1 dropped
    assert candidates(conv, 32, 8, data_parallel=True) == [(4, 224, 224, 3, 224)]
    assert [gpus_needed(conv, c, 32) for c in candidates(conv, 32, 8)] == [1, 2, 4, 8]
    assert no_parallel_us(load_profile(model.profile_path), model.layers[32], 32) == \
        compute_us(load_profile(model.profile_path), model.layers[32], 32)   # unsplit linear: no sync


# ---- the search rules, on synthetic models ----

def amp_chain(x_b1: float, a_b2: float, a_b1: float):
    """X -> A -> B, batch 2 on up to 2 GPUs; transfers between widths cost ~2*200 us."""
    return synthetic([{2: 10000.0, 1: x_b1}, {2: a_b2, 1: a_b1}, {2: 1000.0, 1: 1000.0}], [(0, 1), (1, 2)])


def test_amplification_judges_the_predecessor_with_best_amp_rule():
    model, table = amp_chain(100.0, 1000.0, 600.0)
    # A on 2 GPUs: amp 600*2/1000 = 1.2; A on 1 GPU (fed from X on 2): amp (400+1000)/1000 = 1.4.
    # limit 1.1: A@1 is visited first and kept (bestAmp 1.4); A@2 exceeds the limit but is below
    # bestAmp, so it still wins. B, the last layer, is never judged (its amp is 2.0).
    plan = plan_deeppool(model, table, 2, 2, 1.1, latency_us=200.0)
    assert [l.gpus for l in plan.layers] == [2, 2, 2]
    assert plan.layer(1).amplification == pytest.approx(1.2)
    assert plan.layer(2).amplification == pytest.approx(2.0)
    assert plan.iteration_ms == pytest.approx((100 + 600 + 1000) / 1000)


def test_amplification_limit_rejects_predecessor():
    model, table = amp_chain(100.0, 1000.0, 1000.0)
    # A on 2 GPUs: amp 2.0, A on 1 GPU: amp 1.4 (kept first). Limit 1.5 rejects A@2 for B's choice.
    limited = plan_deeppool(model, table, 2, 2, 1.5, latency_us=200.0)
    free = plan_deeppool(model, table, 2, 2, math.inf, latency_us=200.0)
    assert [l.gpus for l in free.layers] == [2, 2, 2]
    assert free.iteration_ms == pytest.approx(2.1)
    assert [l.gpus for l in limited.layers] == [2, 1, 1]
    assert limited.layer(1).transfer_ms == pytest.approx(2 * (4 / BANDWIDTH + 200) / 1000)   # 2 -> 1 GPU
    assert limited.iteration_ms == pytest.approx((100 + limited.layer(1).transfer_ms * 1000 + 1000 + 1000) / 1000)
    (t,) = limited.transfers
    assert (t.src, t.dst, t.src_ranks, t.dst_ranks, t.bytes) == (0, 1, (0, 1), (0,), 4)
    # exemption: A's unsplit time at most 300 us -> never judged, so the limit does not bite;
    # at 301 us, A@2 (amp 720/301) is above both the limit and A@1's amp (701/301): rejected
    model, table = amp_chain(100.0, 300.0, 360.0)
    assert [l.gpus for l in plan_deeppool(model, table, 2, 2, 1.5, latency_us=200.0).layers] == [2, 2, 2]
    model, table = amp_chain(100.0, 301.0, 360.0)
    assert [l.gpus for l in plan_deeppool(model, table, 2, 2, 1.5, latency_us=200.0).layers] == [2, 1, 1]


def test_ties_keep_the_first_visited_config():
    # equal times at 1 and 2 GPUs and (near-)free transfers: strict < keeps the fewer-GPU config,
    # for the predecessor choice and for the last layer's pick
    model, table = synthetic([{2: 100.0, 1: 100.0}, {2: 50.0, 1: 50.0}], [(0, 1)])
    plan = plan_deeppool(model, table, 2, 2, math.inf, bandwidth=1e30, latency_us=0.0)
    assert [l.gpus for l in plan.layers] == [1, 1] and plan.iteration_ms == pytest.approx(0.150)


def fork(p: float, q: float, r: float | None = None):
    """X -> P, Q (, R) -> J on batch 2; split rows 10x slower so every layer stays on 1 GPU."""
    rows = [100.0, p, q] + ([r] if r is not None else []) + [50.0]
    n = len(rows)
    edges = [(0, i) for i in range(1, n - 1)] + [(i, n - 1) for i in range(1, n - 1)]
    return synthetic([{2: us, 1: 10 * us} for us in rows], edges)


def test_side_branch_serial_at_one_gpu_and_join_counted_twice():
    model, table = fork(1000.0, 500.0)
    plan = plan_deeppool(model, table, 2, 1)
    assert plan.gpus_used == 1 and all(l.ranks == (0,) for l in plan.layers)
    assert plan.iteration_ms == pytest.approx(1.650)          # 1150 critical path + 500 serial
    assert plan.gpu_ms == pytest.approx(1.700)                # the join's 50 us twice
    assert plan.layer(3).end_ms == pytest.approx(1.150) and plan.layer(2).start_ms == pytest.approx(0.1)


def test_side_branch_on_new_gpus_or_serial_by_the_limit():
    model, table = fork(1000.0, 500.0)
    adj = 2 * noverlap_us(2, 10.0)                            # start + end, no overlap
    new = plan_deeppool(model, table, 2, 2, math.inf, latency_us=10.0)
    assert new.gpus_used == 2 and new.layer(1).ranks == (0,) and new.layer(2).ranks == (1,)
    assert new.iteration_ms == pytest.approx(1.150) and new.gpu_ms == pytest.approx(1.700)
    assert new.transfers == []                                # same width, other rank: booked 0
    # (adj + 500) / 500 = 1.08 > 1.05: run Q after P on P's GPU
    serial = plan_deeppool(model, table, 2, 2, 1.05, latency_us=10.0)
    assert serial.gpus_used == 1 and serial.layer(2).ranks == (0,)
    assert serial.iteration_ms == pytest.approx(1.650)
    # Q plus the adjustment outlasts P: the excess is overtime, adj*gpus goes into gpuMs
    model, table = fork(1000.0, 990.0)
    over = plan_deeppool(model, table, 2, 2, math.inf, latency_us=10.0)
    assert over.gpus_used == 2
    assert over.iteration_ms == pytest.approx((1150 + 990 + adj - 1000) / 1000)
    assert over.gpu_ms == pytest.approx((100 + 1000 + 990 + 2 * 50 + adj) / 1000)
    # the main branch shorter than the adjustment: serial
    model, table = fork(30.0, 20.0)
    assert plan_deeppool(model, table, 2, 2, math.inf, latency_us=10.0).gpus_used == 1
    # data-parallel baseline: side branches always serial
    model, table = fork(1000.0, 500.0)
    assert plan_deeppool(model, table, 2, 2, data_parallel=True, latency_us=10.0).layer(2).ranks == (0, 1)


def test_gpu_packing_reuses_a_free_gpu():
    model, table = fork(1000.0, 400.0, 400.0)
    plan = plan_deeppool(model, table, 2, 2, math.inf, latency_us=10.0)
    assert plan.gpus_used == 2                                # Q and R share one new GPU
    assert (plan.layer(1).ranks, plan.layer(2).ranks, plan.layer(3).ranks) == ((0,), (1,), (1,))


def test_nested_block_overtime_dropped_for_the_longest_branch():
    # X -> [N -> (N1, N2) -> NJ] and [Q] -> J, one GPU
    times = [100.0, 100.0, 1000.0, 300.0, 10.0, 50.0, 10.0]
    edges = [(0, 1), (0, 5), (1, 2), (1, 3), (2, 4), (3, 4), (4, 6), (5, 6)]
    model, table = synthetic([{1: us} for us in times], edges)
    plan = plan_deeppool(model, table, 1, 1)
    assert plan.layer(6).end_ms == pytest.approx(1.220)
    # Q (50 us) serial is counted; N2's 300 us inside the longest branch is not
    assert plan.iteration_ms == pytest.approx(1.270)
    assert plan_deeppool(model, table, 1, 1, data_parallel=True).iteration_ms == pytest.approx(1.570)
    assert plan.gpu_ms == pytest.approx(1.590)                # both joins twice
    # the nested block in the shorter branch: its overtime is counted through that branch
    times = [100.0, 100.0, 400.0, 300.0, 10.0, 2000.0, 10.0]
    model, table = synthetic([{1: us} for us in times], edges)
    assert plan_deeppool(model, table, 1, 1).iteration_ms == pytest.approx(sum(times) / 1000)


# ---- the shipped models ----

def check_plan(plan: BurstPlan, model, table, batch: int, gpus: int, chain: bool) -> None:
    assert plan.cost_model == "deeppool" and len(plan.layers) == len(model.layers)
    for l, layer in zip(plan.layers, model.layers):
        assert l.id == layer.id and l.type == layer.type
        assert l.gpus * l.batch_per_gpu == batch and l.gpus & (l.gpus - 1) == 0
        assert l.samples == sample_ranges(batch, l.gpus) and len(l.ranks) == l.gpus
        assert all(0 <= r < plan.gpus_used for r in l.ranks)
        assert l.compute_ms == pytest.approx(compute_us(table, layer, l.batch_per_gpu) / 1000)
        assert l.end_ms - l.start_ms == pytest.approx(l.time_ms, abs=1e-9)
        if len(layer.prev) == 1:
            assert l.start_ms == pytest.approx(plan.layer(layer.prev[0]).end_ms, abs=1e-9)
        if chain:
            assert l.gpus <= gpus and l.ranks == tuple(range(l.gpus))
    widths = plan.widths()
    assert {(t.src, t.dst) for t in plan.transfers} == \
        {(p, l.id) for l in model.layers for p in l.prev if widths[p] != widths[l.id]}
    if chain:
        assert plan.gpus_used <= gpus
        assert plan.iteration_ms == pytest.approx(plan.layers[-1].end_ms, abs=1e-9)
        assert plan.gpu_ms == pytest.approx(sum(l.time_ms * l.gpus for l in plan.layers), abs=1e-9)
        for t in plan.transfers:
            assert t.ms == pytest.approx(plan.layer(t.dst).transfer_ms)


@pytest.mark.parametrize("name", ["vgg16", "wrn101_2"])
def test_chain_plans(data, name):
    model, table = data[name]
    plans = {lim: plan_deeppool(model, table, 32, 8, lim) for lim in (1.5, 2.0, math.inf)}
    base = plan_deeppool(model, table, 32, 8, data_parallel=True)
    for plan in list(plans.values()) + [base]:
        check_plan(plan, model, table, 32, 8, chain=True)
    assert all(l.gpus == 8 and l.batch_per_gpu == 4 for l in base.layers) and base.gpus_used == 8
    assert base.transfers == [] and base.data_parallel
    # no limit: a true shortest path, no worse than any other plan (the DP one included)
    best = plans[math.inf].iteration_ms
    assert all(best <= p.iteration_ms + 1e-9 for p in list(plans.values()) + [base])
    assert plans[math.inf].gpus_used == 8


def test_regression_snapshot_of_our_own_plans(data):
    """A regression snapshot of this implementation's own output, not a check against DeepPool:
    iteration ms, GPU ms and GPUs used as ``plan_deeppool`` computed them when it was written
    (compared once then with a line-by-line port of the published planner, which is not kept).
    No independent source exists for these five plans: DeepPool's published data
    (``workbench/burst/data``, the same files as ``/work/shared/data/deeppool``) holds the planner's
    inputs (A100 tables, layer lists) and ``PLANNER_COST_MODEL.md``, whose only figures (Inception-v3
    at G=1 from runs of the published code, the VGG-16 flatten -> fc1 transfer worked from its
    formula) are checked by the two ``*_published_*`` tests above; the paper reports measured
    throughput, not these plans.
    A change here means our planner's output changed: find out why before updating the numbers."""
    expect = {("vgg16", 2.0): (11.564, 74.461, 8), ("vgg16", math.inf): (10.727, 74.847, 8),
              ("wrn101_2", 1.5): (45.139, 123.955, 8), ("wrn101_2", 2.0): (34.528, 146.163, 8),
              ("wrn101_2", math.inf): (26.655, 213.239, 8)}
    for (name, lim), (it, gm, gu) in expect.items():
        model, table = data[name]
        plan = plan_deeppool(model, table, 32, 8, lim)
        assert (round(plan.iteration_ms, 3), round(plan.gpu_ms, 3), plan.gpus_used) == (it, gm, gu)


@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
def test_inception_plans(data, gpus):
    model, table = data["inception_v3"]
    plan = plan_deeppool(model, table, 16, gpus, 2.0)
    check_plan(plan, model, table, 16, gpus, chain=False)
    assert all(l.gpus <= gpus for l in plan.layers)
    base = plan_deeppool(model, table, 16, gpus, data_parallel=True)
    assert all(l.gpus == gpus for l in base.layers) and base.gpus_used == gpus
    assert base.iteration_ms == pytest.approx(sum(l.time_ms for l in base.layers))
    # a join books the sum of its inputs' activation times
    for layer in model.layers:
        if len(layer.prev) > 1:
            j = plan.layer(layer.id)
            acts = sum(activation_us(model.layers[p], layer, cfg(model.layers[p], plan.layer(p), 16),
                                     cfg(layer, j, 16)) for p in layer.prev)
            assert j.transfer_ms == pytest.approx(acts / 1000)
            assert j.end_ms >= max(plan.layer(p).end_ms for p in layer.prev)


def test_inception_branches_can_use_more_gpus_than_g(data):
    model, table = data["inception_v3"]
    plan = plan_deeppool(model, table, 16, 2, math.inf)
    assert max(l.gpus for l in plan.layers) <= 2
    assert plan.gpus_used == 4                   # concurrent branches are not limited to G


# ---- bad input ----

@pytest.mark.parametrize("kwargs, word", [
    (dict(batch=0, gpus=8), "batch"), (dict(batch=32, gpus=6), "gpus"), (dict(batch=32, gpus=0), "gpus"),
    (dict(batch=32, gpus=8, amplification=1.0), "amplification"),
    (dict(batch=32, gpus=8, amplification=float("nan")), "amplification"),
    (dict(batch=24, gpus=16), "divisible"), (dict(batch=12, gpus=8), "divisible"),
    (dict(batch=16, gpus=32, data_parallel=True), "data-parallel"),
    (dict(batch=32, gpus=8, bandwidth=0), "bandwidth"),
])
def test_bad_input(data, kwargs, word):
    model, table = data["vgg16"]
    with pytest.raises(BurstError, match=word) as err:
        plan_deeppool(model, table, **kwargs)
    assert "\n" not in str(err.value)


def test_batch_below_gpus_caps_the_width(data):
    model, table = data["vgg16"]
    plan = plan_deeppool(model, table, 16, 32, math.inf)
    assert max(l.gpus for l in plan.layers) <= 16
    assert plan_deeppool(model, table, 24, 8, 2.0).gpus == 8           # 24 divisible by 1, 2, 4, 8


def test_json_round_trip(data):
    for name, batch, gpus, lim in (("vgg16", 32, 8, math.inf), ("inception_v3", 16, 4, 2.0)):
        model, table = data[name]
        plan = plan_deeppool(model, table, batch, gpus, lim)
        back = BurstPlan.from_dict(json.loads(json.dumps(plan.to_dict())))
        assert back == plan and back.to_dict() == plan.to_dict()
        assert back.cost_model == "deeppool" and back.amplification == lim


def test_module_is_pure_python():
    import sys
    for module in (dp, deeppool_costs):
        assert module.__name__ in sys.modules
        text = open(module.__file__).read()
        assert "import torch" not in text and "mpi4py" not in text and "numpy" not in text.replace("no numpy", "")
    assert dp.activation_us is deeppool_costs.activation_us   # the old names still work
