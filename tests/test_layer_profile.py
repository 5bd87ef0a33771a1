"""The per-layer profiler (workbench.bench.layers, workbench.bench.step): one LayerProfile per parameterised layer in
forward order with the model's parameter counts, positive times, and a CSV that the predictor
(profile_from_table, `workbench predict --profile`) reads back. Single process, a few repetitions:
the times are only checked to be positive, never against a bound (this machine is noisy)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from workbench import models
from workbench.bench.layers import LayerProfileError, profile_builtin, profile_layers, write_profile_csv
from workbench.bench.step import StepProfile, profile_step, update_seconds, wire_cast_seconds
from workbench.netsim.predict import predict
from workbench.netsim.profile import LayerProfile, profile_from_table

FAST = dict(repeats=3, warmup=1)

#: (name, (parameters, tensors) of each parameterised layer in forward order) on digits (64 -> 10)
EXPECTED = {
    "mlp": [(64 * 64 + 64, (4096, 64)), (64 * 10 + 10, (640, 10))],
    "wide_mlp": [(64 * 1024 + 1024, (65536, 1024)), (1024 * 1024 + 1024, (1048576, 1024)),
                 (1024 * 10 + 10, (10240, 10))],
    "cnn": [(16 * 9 + 16, (144, 16)), (32 * 16 * 9 + 32, (4608, 32)), (32 * 16 * 10 + 10, (5120, 10))],
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_builtin_models_one_profile_per_parameterised_layer_in_forward_order(name):
    layers = profile_builtin(name, batch_size=8, **FAST)
    assert all(isinstance(layer, LayerProfile) for layer in layers)
    assert [(layer.parameters, layer.tensors) for layer in layers] == EXPECTED[name]
    torch.manual_seed(0)
    model = models.build(name, 64, 10)
    assert sum(layer.parameters for layer in layers) == sum(p.numel() for p in model.parameters())
    assert all(layer.forward_s > 0 and layer.backward_s > 0 for layer in layers)
    # the names say which module each row is (the Sequential's index and the type)
    kinds = [layer.name.split(":")[1] for layer in layers]
    assert kinds == (["Conv2d", "Conv2d", "Linear"] if name == "cnn" else ["Linear"] * len(layers))


def test_resnet18_nested_in_a_sequential_is_profiled_layer_by_layer_in_the_runtimes_tensor_order():
    # torchvision's resnet18 sits inside nn.Sequential(_Image, resnet): its 41 parameterised modules
    # (convolutions, batch norms, the 1x1 downsampling convolutions, fc) each get a row, named by
    # their path; the rows' tensors in forward order are the model's parameters in registration
    # order, i.e. the runtime's flat buffer, so the predictor's buckets are the runtime's
    torch.manual_seed(0)
    model = models.build("resnet18", 28 * 28, 10)
    layers = profile_layers(model, (28 * 28,), 2, repeats=1, warmup=0)
    assert len(layers) == 41 and sum(len(layer.tensors) for layer in layers) == 62
    assert [t for layer in layers for t in layer.tensors] == [p.numel() for p in model.parameters()]
    assert sum(layer.parameters for layer in layers) == 11_172_810
    names = [layer.name for layer in layers]
    assert names[:3] == ["1.conv1:Conv2d", "1.bn1:BatchNorm2d", "1.layer1.0.conv1:Conv2d"]
    assert "1.layer2.0.downsample.0:Conv2d" in names and names[-1] == "1.fc:Linear"
    assert all(layer.forward_s > 0 and layer.backward_s > 0 for layer in layers)
    assert predict(layers, 4, fusion_bytes=0).buckets == 62


def test_forward_order_is_the_call_order_not_the_registration_order():
    class Backwards(nn.Module):
        def __init__(self):
            super().__init__()
            self.second = nn.Linear(8, 3)
            self.first = nn.Linear(5, 8, bias=False)

        def forward(self, x):
            return self.second(torch.relu(self.first(x)))

    layers = profile_layers(Backwards(), (5,), 4, **FAST)
    assert [layer.name for layer in layers] == ["first:Linear", "second:Linear"]
    assert [layer.tensors for layer in layers] == [(40,), (24, 3)]


def test_a_batch_as_sample_and_the_model_left_untouched():
    model = models.build("mlp", 64, 10)
    before = [p.detach().clone() for p in model.parameters()]
    x, y = torch.rand(16, 64), torch.randint(0, 10, (16,))
    layers = profile_layers(model, x, target=y, **FAST)
    assert len(layers) == 2
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(p.grad is None for p in model.parameters())


def test_refusals():
    with pytest.raises(LayerProfileError, match="no trainable parameters"):
        profile_layers(nn.ReLU(), (4,), 2, **FAST)
    with pytest.raises(LayerProfileError, match="batch_size"):
        profile_layers(models.build("mlp", 64, 10), (64,), None, **FAST)
    with pytest.raises(LayerProfileError, match="statistic"):
        profile_layers(models.build("mlp", 64, 10), (64,), 4, statistic="mode")
    with pytest.raises(LayerProfileError, match="model must be one of"):
        profile_builtin("vgg19", 4, **FAST)
    with pytest.raises(LayerProfileError, match="'alexnet' needs square images of 1 or 3 channels and side >= 63"):
        profile_builtin("alexnet", 4, **FAST)  # on digits' 8x8

    shared = nn.Linear(4, 4)
    with pytest.raises(LayerProfileError, match="more than once"):
        profile_layers(nn.Sequential(shared, nn.ReLU(), shared), (4,), 2, **FAST)


def test_csv_round_trip_through_profile_from_table(tmp_path):
    layers = profile_builtin("cnn", batch_size=8, **FAST)
    path = write_profile_csv(layers, tmp_path / "cnn.csv")
    back = profile_from_table(path)
    assert [(l.name, l.parameters, l.tensors) for l in back] == [(l.name, l.parameters, l.tensors) for l in layers]
    for a, b in zip(back, layers):
        assert a.forward_s == pytest.approx(b.forward_s, rel=1e-6)
        assert a.backward_s == pytest.approx(b.backward_s, rel=1e-6)
    # and the predictor takes it: 3 layers x (weight, bias) = 6 messages per step with fusion 0
    assert predict(back, 4, fusion_bytes=0).messages == 6


def test_workbench_predict_reads_the_csv(tmp_path, capsys):
    from workbench.cli import main
    path = write_profile_csv(profile_builtin("mlp", batch_size=8, **FAST), tmp_path / "mlp.csv")
    assert main(["predict", "--profile", str(path), "--ranks", "1,4", "--fusion-bytes", "0"]) == 0
    assert "2 layers" in capsys.readouterr().out


def test_step_profile_in_this_process():
    step = profile_step("mlp", 8, **FAST)
    assert isinstance(step, StepProfile) and step.processes == 1 and step.statistic == "median"
    assert step.parameters == 4810 and len(step.layers) == 2
    assert step.update_s > 0 and step.wire_cast_s["fp16"] > 0 and step.evaluate_s > 0
    doubled = step.scaled(2.0)
    assert doubled.forward_s == pytest.approx(2 * step.forward_s)
    assert doubled.update_s == pytest.approx(2 * step.update_s)
    assert doubled.layers[0].tensors == step.layers[0].tensors
    assert update_seconds(1000, 4, **FAST) > 0
    with pytest.raises(LayerProfileError, match="fp16 or bf16"):
        wire_cast_seconds(1000, "fp32", **FAST)
    assert torch.get_num_threads() >= 1   # restored, whatever it was


def test_lockstep_profiles_measure_the_ranks_skew():
    # two processes on a shared machine, a spinning barrier before every repetition: the
    # slowest process's repetition is never shorter than the mean, so the skew is >= 0, and it is
    # exactly the formula over the repetitions each process reported
    from workbench.bench.concurrent import skew
    step = profile_step("mlp", 8, processes=2, lockstep=True, repeats=5, warmup=1, wire_dtypes=(), timeout=300)
    assert step.lockstep and step.processes == 2 and step.statistic == "mean"
    totals = [r["totals"] for r in step.per_process]
    assert [len(t) for t in totals] == [5, 5] and all(t > 0 for reps in totals for t in reps)
    assert step.skew_s == pytest.approx(skew(totals)) and step.skew_s >= 0
    assert step.scaled(2.0).skew_s == pytest.approx(2 * step.skew_s)
    assert skew([[1.0, 2.0], [3.0, 2.0]]) == pytest.approx(0.5)   # (1 + 0) / 2
    assert profile_step("mlp", 8, **FAST, wire_dtypes=()).skew_s == 0.0
    with pytest.raises(LayerProfileError, match="lockstep needs processes >= 2"):
        profile_step("mlp", 8, lockstep=True, **FAST)


def test_profiles_taken_before_and_after_a_run_average_every_time():
    def made(scale):
        layers = [LayerProfile("0:Linear", 10, 1e-3 * scale, 2e-3 * scale, (8, 2)),
                  LayerProfile("2:Linear", 3, 3e-3 * scale, 4e-3 * scale, (3,))]
        return StepProfile("mlp", "digits", 8, layers, 5e-4 * scale, {"fp16": 1e-4 * scale}, 0.1 * scale, 2,
                           "mean", 5, 2e-4 * scale, True, 0.01 * scale)
    mean = made(1).mean_with(made(3))
    assert [(l.forward_s, l.backward_s) for l in mean.layers] == [pytest.approx((2e-3, 4e-3)), pytest.approx((6e-3, 8e-3))]
    assert [l.tensors for l in mean.layers] == [(8, 2), (3,)] and mean.processes == 2 and mean.lockstep
    assert (mean.update_s, mean.wire_cast_s["fp16"], mean.evaluate_s, mean.skew_s, mean.pause_s) == pytest.approx(
        (1e-3, 2e-4, 0.2, 4e-4, 0.02))
    other = made(1)
    other.layers[1] = LayerProfile("2:Linear", 3, 1.0, 1.0, (2, 1))
    with pytest.raises(LayerProfileError, match="same model, batch_size and layers"):
        made(1).mean_with(other)


def test_profiling_processes_run_in_sessions_of_their_own_and_pause_like_waiting_ranks():
    # each process its own session, as each rank under mpiexec (the scheduler shares a busy
    # machine between sessions first); before every lock-step meeting (warm-up and timed
    # repetitions) each yields the CPU for pause_s, as a rank waits out its all-reduce
    import os
    step = profile_step("mlp", 8, processes=2, lockstep=True, pause_s=0.02, repeats=3, warmup=1, wire_dtypes=(),
                        timeout=300)
    assert step.pause_s == 0.02 and step.to_dict()["pause_s"] == 0.02
    sessions = [r["session"] for r in step.per_process]
    assert len(set(sessions)) == 2 and os.getsid(0) not in sessions
    assert all(r["paused_s"] >= 0.02 * (3 + 1) for r in step.per_process)
    assert all(r["paused_s"] == 0.0 for r in profile_step("mlp", 8, processes=2, lockstep=True, repeats=2, warmup=0,
                                                          wire_dtypes=(), timeout=300).per_process)
    with pytest.raises(LayerProfileError, match="pause_s needs lockstep=True"):
        profile_step("mlp", 8, pause_s=0.1, **FAST)
    with pytest.raises(LayerProfileError, match=r"pause_s must be seconds in \[0, 3600\)"):
        profile_step("mlp", 8, processes=2, lockstep=True, pause_s=-1, **FAST)
