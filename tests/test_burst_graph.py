"""The planner's inputs and output (workbench.burst.graph, workbench.burst.plan): DeepPool's
shipped tables and layer lists read as published, the table format written and read back, and
the BurstPlan's samples, timeline, idle windows and JSON."""
from __future__ import annotations

import json
import math

import pytest

from workbench.burst.graph import (DATA, BurstError, Layer, ModelGraph, ProfileTable, check_graph, load_model,
                                   load_profile, model_path)
from workbench.burst.plan import ActivationTransfer, Busy, BurstPlan, LayerPlan, sample_ranges

#: (layers, listed parameters, measured per-GPU batches of layer 0) as the data README states
SHIPPED = {"vgg16": (37, 138_357_544, (1, 2, 3, 4, 6, 8, 16, 32, 64)),
           "wrn101_2": (39, 126_886_568, (1, 2, 3, 4, 6, 8, 16, 32)),
           "inception_v3": (125, 23_800_136, tuple(range(1, 17)) + (32, 59, 60, 61, 62, 63, 64))}


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_the_shipped_models_and_tables_agree(name):
    model = load_model(name)
    table = load_profile(model.profile_path)
    layers, params, batches = SHIPPED[name]
    assert len(model.layers) == layers and model.params == params
    assert table.batches(model.layers[0]) == batches
    # every layer's listed batches are exactly the table's rows for its key
    assert all(set(layer.profiled) == set(table.batches(layer)) for layer in model.layers)
    assert model.is_chain() == (name != "inception_v3")


def test_the_last_line_of_a_repeated_key_wins_as_in_the_published_planner():
    model, table = load_model("vgg16"), load_profile("vgg16")
    relu = model.layers[3]
    assert relu.key(64) == 'ReLU2d{"inplace":true,"kernel_size":1,"padding":0,"stride":1}[64][64,224,224]'
    # the file lists this key first with 4.936 ms, later with 15.309 ms
    assert table.time(relu, 64).avg_us == 15_309.0
    assert table.time(model.layers[0], 64).fw_us == 2157.0


def test_inception_has_forks_joins_and_unprofiled_concats():
    model, table = load_model("inception_v3"), load_profile("inception_v3")
    forks = [l for l in model.layers if len(l.next) > 1]
    joins = [l for l in model.layers if len(l.prev) > 1]
    assert forks and joins and all(l.type == "concat" for l in joins)
    assert all(table.batches(l) == () for l in joins)     # the A100 table has no concat rows


def test_a_table_written_reads_back_identically(tmp_path):
    model, table = load_model("wrn101_2"), load_profile("wrn101_2")
    path = table.write(tmp_path / "wrn.prof", model.layers)
    back = load_profile(path)
    assert back.entries.keys() == table.entries.keys()
    for key, t in table.entries.items():
        assert back.entries[key].avg_us == pytest.approx(t.avg_us, abs=1e-3)
        assert (back.entries[key].fw_us, back.entries[key].bw_us) == pytest.approx((t.fw_us, t.bw_us), abs=1e-3)
    graph = model.write(tmp_path / "wrn.json")
    again = load_model(graph)
    assert [l.to_dict() for l in again.layers] == [l.to_dict() for l in model.layers]


def test_bad_inputs_are_one_line_errors(tmp_path):
    with pytest.raises(BurstError, match="model must be one of vgg16, wrn101_2, inception_v3"):
        load_model("alexnet")
    with pytest.raises(BurstError, match="no file at"):
        load_profile(tmp_path / "missing.prof")
    bad = tmp_path / "bad.prof"
    bad.write_text("conv2d{}[1][3]  x  1  2\n")
    with pytest.raises(BurstError, match="times must be numbers"):
        load_profile(bad)
    model, table = load_model("vgg16"), load_profile("vgg16")
    with pytest.raises(BurstError, match=r"no row for layer 0 \(conv2d\) at per-GPU batch 5; measured batches"):
        table.time(model.layers[0], 5)
    a = Layer(0, "linear", {}, (), (1,), 4, 4, 20, "a", "4")
    b = Layer(1, "linear", {}, (), (), 4, 2, 10, "b", "4")     # does not list 0 as prev
    with pytest.raises(BurstError, match="layer 0: next 1 is not a later layer listing 0 as prev"):
        check_graph([a, b])
    assert model_path("wide_resnet101_2") == DATA / "models" / "wrn101_2.json"


def _toy_plan() -> BurstPlan:
    """4 GPUs: layer 0 on all four for 2 ms, layer 1 on GPU 0 for 3 ms (after a 1 ms transfer)."""
    l0 = LayerPlan(0, "conv2d", 4, (0, 1, 2, 3), 2, 2.0, 0.0, 0.0, 0.0, 2.0, samples=sample_ranges(8, 4))
    l1 = LayerPlan(1, "linear", 1, (0,), 8, 3.0, 0.0, 1.0, 2.0, 6.0, samples=sample_ranges(8, 1))
    return BurstPlan("toy", 8, 4, "workbench", [l0, l1], 6.0, 2.0 * 4 + 4.0, 4, 2.0,
                transfers=[ActivationTransfer(0, 1, (0, 1, 2, 3), (0,), 96.0, 1.0)])


def test_plan_samples_timeline_idle_windows_and_json(tmp_path):
    assert sample_ranges(8, 4) == [(0, 2), (2, 4), (4, 6), (6, 8)]
    with pytest.raises(BurstError, match="batch 6 must be divisible by the layer's GPU count 4"):
        sample_ranges(6, 4)
    plan = _toy_plan()
    assert Busy(0, 2.0, 3.0, 1, "transfer") in plan.timeline()
    assert plan.busy_ms() == {0: 6.0, 1: 2.0, 2: 2.0, 3: 2.0}
    idle = plan.idle_windows()
    assert idle[0] == [] and idle[1] == [(2.0, 6.0)] == idle[3]
    assert plan.idle_windows(min_ms=5.0)[1] == []
    back = BurstPlan.from_dict(json.loads(plan.write_json(tmp_path / "p.json").read_text()))
    assert back.to_dict() == plan.to_dict()
    unlimited = BurstPlan("toy", 8, 4, "deeppool", plan.layers, 6.0, 12.0, 4, math.inf)
    assert unlimited.to_dict()["amplification"] == "inf"
    assert BurstPlan.from_dict(unlimited.to_dict()).amplification == math.inf
    with pytest.raises(BurstError, match="cost_model must be one of workbench, deeppool"):
        BurstPlan("toy", 8, 4, "mine", [], 0.0, 0.0, 0)


@pytest.mark.parametrize("where", ["workbench.burst", "workbench.burst.plan"])
def test_the_old_class_names_still_import_with_a_deprecation_warning(where):
    import importlib
    module = importlib.import_module(where)
    for old, new in (("Plan", BurstPlan), ("Transfer", ActivationTransfer)):
        with pytest.warns(DeprecationWarning, match=rf"^{where}\.{old} is deprecated: it is {new.__name__} now"):
            assert getattr(module, old) is new
    with pytest.raises(AttributeError, match="has no attribute 'Plans'"):
        module.Plans


def test_a_graph_built_in_code():
    layers = [Layer(0, "linear", {}, (), (1,), 4, 8, 40, "l0", "4"), Layer(1, "linear", {}, (0,), (), 8, 2, 18, "l1", "8")]
    graph = ModelGraph("two", layers, 4)
    assert graph.params == 58 and graph.is_chain()
    table = ProfileTable()
    table.add(layers[1], 2, 10.0, 30.0)
    assert table.time(layers[1], 2).avg_us == 40.0 and table.batches(layers[1]) == (2,)
