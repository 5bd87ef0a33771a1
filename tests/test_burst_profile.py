"""The burst profiler (workbench.burst.profiler, workbench.burst.layergraph): layer graphs read off
the project's chain models (layer i is model[i]) and off torchvision's VGG-16, WRN-101-2 and
Inception-v3 (built on the meta device: structure only, never timed here), per-layer times of
small models at a few batch sizes, the table + model JSON round trip, and the errors.
Times are only checked to be positive (this machine is noisy)."""
from __future__ import annotations

import collections

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from workbench import models
from workbench.burst.graph import BurstError, ProfileTable, load_model, load_profile
from workbench.burst.profiler import layer_graph, profile, torchvision_model, write_profile

FAST = dict(repeats=3, warmup=1)


def _trainable(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


class _Residual(nn.Module):
    """A traced model with a fork, an in-place residual add, a concat join, functional ops, a
    BatchNorm and a size-reading reshape."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.relu = nn.ReLU(inplace=True)
        self.a, self.b = nn.Conv2d(8, 8, 1), nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        x = self.relu(self.bn(self.conv(x.view(x.size(0), 1, 8, 8))))
        y = self.a(x)
        y += x
        y = F.relu(y, inplace=True)
        z = F.max_pool2d(torch.cat([y, self.b(x)], 1), 2)
        return self.fc(z.view(z.size(0), -1))


# -- graphs of the project's chain models ------------------------------------------------------

@pytest.mark.parametrize("name", ["mlp", "wide_mlp", "cnn", "lenet"])  # resnet18/alexnet wrap a torchvision module
def test_chain_models_layer_i_is_model_i(name):
    features = 784 if name == "lenet" else 64  # lenet: side >= 12
    model = models.build(name, features, 10)
    graph, fns = layer_graph(model, (features,), name)
    assert len(graph.layers) == len(fns) == len(model)
    assert all(fns[i] is model[i] for i in range(len(model)))
    assert graph.is_chain() and graph.input_dim == features
    for i, layer in enumerate(graph.layers):
        assert layer.id == i and layer.prev == ((i - 1,) if i else ())
        assert layer.next == ((i + 1,) if i < len(model) - 1 else ())
        assert layer.param_count == _trainable(model[i])
    assert graph.params == graph.total_params == _trainable(model)
    assert graph.layers[-1].output_dim == 10


def test_cnn_layers_types_shapes_and_keys():
    graph, _ = layer_graph(models.build("cnn", 64, 10), (64,), "cnn")
    assert [layer.type for layer in graph.layers] == ["image", "conv2d", "ReLU2d", "conv2d", "ReLU2d", "maxPool2d",
                                                      "flatten", "linear"]
    first, conv = graph.layers[0], graph.layers[1]
    assert (first.input_dim, first.output_dim, first.params) == (64, (1, 8, 8), {"side": 8, "channels": 1})
    assert conv.key(8) == 'conv2d{"in_channels":1,"kernel_size":3,"out_channels":16,"padding":1,"stride":1}[8][1,8,8]'
    assert graph.layers[6].key(4) == 'flatten{"kernel_size":1}[4][32,4,4]'
    assert graph.layers[7].key_prefix == 'linear{"bias":true,"in_features":512,"out_features":10}'
    assert graph.layers[7].key_suffix == "512"


def test_traced_model_forks_joins_and_callables():
    model = _Residual()
    graph, fns = layer_graph(model, (64,), "res")
    types = [layer.type for layer in graph.layers]
    assert types == ["view", "conv2d", "batchNorm2d", "ReLU2d", "conv2d", "add", "ReLU2d", "conv2d", "concat",
                     "maxPool2d", "view", "linear"]
    relu = graph.layers[3]
    assert set(relu.next) == {4, 5, 7}                        # one output, three users: a fork
    assert graph.layers[5].prev == (4, 3) and graph.layers[8].prev == (6, 7)   # add and concat joins
    assert graph.layers[8].input_dim == graph.layers[8].output_dim == (16, 8, 8)
    assert graph.params == _trainable(model)
    assert fns[1] is model.conv and fns[3] is model.relu        # one module call on one input: the module
    # running the callables along the graph gives the model's output
    x = torch.randn(3, 64)
    model.eval()
    outs = {}
    for layer, fn in zip(graph.layers, fns):
        outs[layer.id] = fn(*[outs[p] for p in layer.prev]) if layer.prev else fn(x)
    assert torch.allclose(outs[len(fns) - 1], model(x.clone()), atol=1e-6)


# -- torchvision's models, structure only --------------------------------------------------------

def _deeppool_keys(name):
    return {(layer.key_prefix, layer.key_suffix) for layer in load_model(name).layers}


def test_vgg16_graph_is_a_chain_with_deeppools_keys():
    model, shape = torchvision_model("vgg16", device="meta")
    graph, fns = layer_graph(model, shape, "vgg16")
    assert 37 <= len(graph.layers) <= 40 and graph.is_chain()
    counts = collections.Counter(layer.type for layer in graph.layers)
    assert [counts[t] for t in ("conv2d", "ReLU2d", "maxPool2d", "linear", "ReLU1d")] == [13, 13, 5, 3, 2]
    assert graph.params == _trainable(model) == 138_357_544
    assert graph.layers[-1].output_dim == 1000
    # every row DeepPool's A100 VGG table is keyed by names a layer of this graph
    assert _deeppool_keys("vgg16") <= {(layer.key_prefix, layer.key_suffix) for layer in graph.layers}


def test_wide_resnet_graph_has_residual_joins():
    model, shape = torchvision_model("wide_resnet101_2", device="meta")
    graph, _ = layer_graph(model, shape, "wrn")
    adds = [layer for layer in graph.layers if layer.type == "add"]
    assert len(adds) == 33 and all(len(layer.prev) == 2 for layer in adds)
    assert [layer.id for layer in graph.layers if len(layer.prev) > 1] == [layer.id for layer in adds]
    assert sum(len(layer.next) > 1 for layer in graph.layers) == 33     # each block's input forks
    assert graph.params == _trainable(model) == 126_886_696
    # whole blocks as layers: DeepPool's granularity (its conv1, ReLU, maxpool, 33 blocks, pool, flatten, fc)
    bottleneck = type(model.layer1[0])
    blocks, _ = layer_graph(model, shape, "wrn", leaf_modules=(bottleneck,))
    assert blocks.is_chain() and sum(layer.type == "bottleneck" for layer in blocks.layers) == 33
    assert blocks.params == graph.params


def test_inception_graph_has_forks_and_concat_joins():
    model, shape = torchvision_model("inception_v3", device="meta")
    graph, _ = layer_graph(model, shape, "inception_v3")
    joins = [layer for layer in graph.layers if len(layer.prev) > 1]
    forks = [layer for layer in graph.layers if len(layer.next) > 1]
    assert len(joins) == 15 and all(layer.type == "concat" for layer in joins)
    assert len(forks) >= 11 and max(len(layer.next) for layer in forks) >= 4
    assert collections.Counter(layer.type for layer in graph.layers)["conv2d"] == 94
    assert graph.params == _trainable(model) == 23_834_568
    assert _deeppool_keys("inception_v3") <= {(layer.key_prefix, layer.key_suffix) for layer in graph.layers}


# -- timing --------------------------------------------------------------------------------------

def test_profile_cnn_times_every_layer_at_every_batch():
    model = models.build("cnn", 64, 10)
    graph, table = profile(model, (64,), (1, 2, 4), name="cnn", **FAST)
    for layer in graph.layers:
        assert layer.profiled == (1, 2, 4) and table.batches(layer) == (1, 2, 4)
        for b in (1, 2, 4):
            t = table.time(layer, b)
            assert t.fw_us > 0 and t.bw_us >= 0 and t.avg_us == pytest.approx(t.fw_us + t.bw_us)
            # a layer with weights has a backward; the reshape at the input has none
            assert t.bw_us > 0 or not layer.param_count
    assert table.time(graph.layers[0], 4).bw_us == 0
    assert all(p.grad is None for p in model.parameters())          # autograd.grad: .grad untouched


def test_profile_traced_model_with_in_place_ops_leaves_the_model_as_it_was():
    model = _Residual().eval()
    stats = model.bn.running_mean.clone(), model.bn.num_batches_tracked.clone()
    threads = torch.get_num_threads()
    graph, table = profile(model, (64,), [4, 1, 2, 2], name="res", **FAST)
    assert all(layer.profiled == (1, 2, 4) for layer in graph.layers)
    assert all(table.time(layer, b).fw_us > 0 for layer in graph.layers for b in (1, 2, 4))
    # a layer's backward is floored at 0 after the autograd start-up is subtracted: this model's
    # smallest layers (8-channel BatchNorm and 1x1 convolutions on 8x8 images, 2 samples) can sit
    # under that estimate's noise on a loaded machine (seen once in a clean-clone run), so one
    # layer with weights above 0, none below
    assert any(table.time(layer, 2).bw_us > 0 for layer in graph.layers if layer.param_count)
    assert all(table.time(layer, 2).bw_us >= 0 for layer in graph.layers)
    assert not model.training and not model.bn.training
    assert torch.equal(model.bn.running_mean, stats[0]) and torch.equal(model.bn.num_batches_tracked, stats[1])
    assert torch.get_num_threads() == threads
    assert "overhead" in table.source


# -- files ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("apart", [False, True])
def test_write_profile_round_trip(tmp_path, apart):
    graph, table = profile(_Residual(), (64,), (1, 2), name="res", **FAST)
    prof = tmp_path / ("tables" if apart else "models") / "res.prof"
    json_path = tmp_path / "models" / "res.json"
    written = write_profile(graph, table, prof, json_path)
    assert written == (prof, json_path)
    back = load_model(json_path)
    assert back.layers == graph.layers and [l.params for l in back.layers] == [l.params for l in graph.layers]
    assert (back.name, back.input_dim, back.total_params) == ("res", 64, graph.total_params)
    assert back.profile_path.resolve() == prof.resolve()
    read = load_profile(back.profile_path)
    assert set(read.entries) == set(table.entries)
    for key, t in table.entries.items():
        assert read.entries[key].fw_us == pytest.approx(t.fw_us, abs=1e-3)
        assert read.entries[key].bw_us == pytest.approx(t.bw_us, abs=1e-3)
        assert read.entries[key].avg_us == pytest.approx(t.avg_us, abs=1e-3)
    assert all(read.time(layer, 2).fw_us > 0 for layer in back.layers)


# -- errors --------------------------------------------------------------------------------------

class _Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x) if x.sum() > 0 else -x


@pytest.mark.parametrize("batches", [(), [], [0], [1, -2], [1.5], [True], "abc", None])
def test_bad_batch_sizes(batches):
    with pytest.raises(BurstError, match="batch_sizes"):
        profile(models.build("mlp", 64, 10), (64,), batches, **FAST)


@pytest.mark.parametrize("device", ["tpu", "gpu0", "meta", 3.5])
def test_unknown_device(device):
    with pytest.raises(BurstError, match="device"):
        profile(models.build("mlp", 64, 10), (64,), (1,), device=device, **FAST)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_cuda_without_a_gpu():
    with pytest.raises(BurstError, match="no CUDA GPU"):
        profile(models.build("mlp", 64, 10), (64,), (1,), device="cuda", **FAST)


def test_untraceable_model_wrong_shapes_and_arguments():
    with pytest.raises(BurstError, match="cannot be traced by torch.fx"):
        layer_graph(_Branchy(), (4,))
    with pytest.raises(BurstError, match="cannot be traced"):
        profile(_Branchy(), (4,), (1,), **FAST)
    with pytest.raises(BurstError, match=r"layer 0 \(Linear\) fails"):
        layer_graph(models.build("mlp", 64, 10), (5,))
    with pytest.raises(BurstError, match="fails on a batch"):
        layer_graph(_Residual(), (3, 3))
    for shape in ((), (0,), (2.5,), "64", None):
        with pytest.raises(BurstError, match="input_shape"):
            layer_graph(models.build("mlp", 64, 10), shape)
    with pytest.raises(BurstError, match="torch.nn.Module"):
        layer_graph(lambda x: x, (4,))
    with pytest.raises(BurstError, match="repeats"):
        profile(models.build("mlp", 64, 10), (64,), (1,), repeats=0)
    with pytest.raises(BurstError, match="warmup"):
        profile(models.build("mlp", 64, 10), (64,), (1,), warmup=-1)
    with pytest.raises(BurstError, match="empty nn.Sequential"):
        layer_graph(nn.Sequential(), (4,))
    with pytest.raises(BurstError, match="meta device"):
        profile(torchvision_model("vgg16", device="meta")[0], (3, 224, 224), (1,), **FAST)
    with pytest.raises(BurstError, match="torchvision model must be"):
        torchvision_model("resnet50")
    with pytest.raises(BurstError, match="empty"):
        write_profile(layer_graph(models.build("mlp", 64, 10), (64,))[0], ProfileTable(), "x.prof", "x.json")
