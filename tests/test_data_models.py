"""Datasets, sharding, batches and models (single process)."""
import os

import numpy as np
import pytest
import torch

from workbench import data, generated_sets, models


def test_digits_split_and_scale():
    d = data.digits()
    assert d.X_train.shape == (1437, 64) and d.X_test.shape == (360, 64)
    assert d.num_classes == 10 and float(d.X_train.max()) <= 1.0 and float(d.X_train.min()) >= 0.0
    assert torch.equal(data.digits().X_test, d.X_test)  # the same test set every time


def test_generated_sets_are_made_once_and_read_back_without_scikit_learn(tmp_path, monkeypatch):
    """digits and synthetic are made with scikit-learn once and kept as .npz: the same arrays come
    back, a later process never imports scikit-learn (2-3 s of CPU a rank), a damaged file is made
    again, and ``none`` keeps nothing."""
    import subprocess
    import sys
    monkeypatch.setenv("WORKBENCH_DATA_CACHE", str(tmp_path / "cache"))
    made = data.digits()
    (cached,) = (tmp_path / "cache").glob("digits-*.npz")
    again = data.digits()
    assert torch.equal(again.X_train, made.X_train) and torch.equal(again.y_test, made.y_test)
    fresh = generated_sets._make_digits()
    assert np.array_equal(fresh[0], made.X_train.numpy()) and np.array_equal(fresh[3], made.y_test.numpy())
    code = ("import sys, workbench.data as d; d.load('digits'); d.load('synthetic', samples=500); "
            "print('sklearn' in sys.modules)")
    env = {**os.environ, "WORKBENCH_DATA_CACHE": str(tmp_path / "cache")}
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    second = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert first.stdout.split() == ["True"] and second.stdout.split() == ["False"]  # synthetic made once
    assert len(list((tmp_path / "cache").glob("synthetic-*.npz"))) == 1
    cached.write_bytes(b"not an npz")
    assert torch.equal(data.digits().X_test, made.X_test) and cached.read_bytes()[:2] == b"PK"  # made again
    monkeypatch.setenv("WORKBENCH_DATA_CACHE", "none")
    assert torch.equal(data.synthetic(samples=300).y_train, data.synthetic(samples=300).y_train)
    assert len(list((tmp_path / "cache").glob("synthetic-*.npz"))) == 1  # nothing more kept


@pytest.mark.parametrize("workers", [1, 3, 4, 7])
def test_shards_are_disjoint_and_cover_the_training_set(workers):
    shards = [data.shard_indices(1437, w, workers) for w in range(workers)]
    together = np.concatenate(shards)
    assert len(together) == 1437 and len(set(together.tolist())) == 1437
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


def test_batches_are_a_pure_function_of_the_step():
    d = data.digits()
    a = data.Batches(d, 1, 3, 16, seed=5)
    b = data.Batches(d, 1, 3, 16, seed=5)
    later = [a.batch(s)[1] for s in range(a.steps_per_epoch * 2)]
    # b jumps straight to the second epoch, as a resumed run does
    assert torch.equal(b.batch(a.steps_per_epoch + 3)[1], later[a.steps_per_epoch + 3])
    assert not torch.equal(torch.cat(later[:a.steps_per_epoch]), torch.cat(later[a.steps_per_epoch:]))
    own = set(data.shard_indices(1437, 1, 3).tolist())
    X, _ = a.batch(0)
    rows = {int(i) for i in torch.nonzero((d.X_train[:, None, :] == X[None]).all(-1))[:, 0]}
    assert rows <= own  # batches come from this worker's shard only


def test_synthetic_of_any_size():
    d = data.synthetic(samples=500, seed=1)
    assert len(d.y_train) == 400 and len(d.y_test) == 100 and d.num_features == 64


def test_wide_mlp_has_over_a_million_parameters():
    m = models.build("wide_mlp", 64, 10)
    assert sum(p.numel() for p in m.parameters()) >= 1_000_000


#: the smallest inputs each image model takes here (lenet: side >= 12; alexnet: 3 channels of side >= 63)
FEATURES = {"lenet": 784, "resnet18": 784, "alexnet": 3 * 63 * 63}


@pytest.mark.parametrize("name", models.BUILTIN_MODELS)
def test_flat_params_are_views_and_gradients_land_in_the_flat_buffer(name):
    features = FEATURES.get(name, 64)
    m = models.build(name, features, 10)
    flat = models.FlatParams(m)
    assert flat.numel == sum(p.numel() for p in m.parameters())
    with torch.no_grad():
        flat.data.fill_(0.01)
    assert all(torch.all(p == 0.01) for p in m.parameters())  # views, not copies
    for _ in range(2):
        flat.zero_grad()
        torch.nn.functional.cross_entropy(m(torch.rand(4, features)), torch.tensor([0, 1, 2, 3])).backward()
        flat.check_grads_are_views()
    assert flat.grad.abs().sum() > 0
    assert sum(s.numel() for s in flat.segments(flat.data)) == flat.numel


@pytest.mark.parametrize("name, features, classes, tensors, parameters", [
    ("lenet", 784, 10, 10, 61_706),
    ("resnet18", 784, 10, 62, 11_172_810),       # GradientFlow's many-tensor case: 62 gradient tensors
    ("resnet18", 3 * 32 * 32, 10, 62, 11_173_962),  # three channels: the first convolution takes 3
    ("alexnet", 3 * 224 * 224, 1000, 16, 61_100_840),  # torchvision's AlexNet, as GradientFlow trains it
])
def test_torchvision_models_shapes_and_parameter_counts(name, features, classes, tensors, parameters):
    m = models.build(name, features, classes)
    params = [p for p in m.parameters() if p.requires_grad]
    assert (len(params), sum(p.numel() for p in params)) == (tensors, parameters)
    with torch.no_grad():
        assert m(torch.rand(2, features)).shape == (2, classes)


@pytest.mark.parametrize("name, features, message", [
    ("alexnet", 784, "side >= 63"), ("alexnet", 3 * 62 * 62, "side >= 63"), ("resnet18", 785, "square images of 1 or 3"),
    ("lenet", 3 * 28 * 28, "side >= 12"), ("resnet18", 2 * 28 * 28, "1 or 3 channels"),
])
def test_image_models_refuse_inputs_they_cannot_take_in_one_line(name, features, message):
    with pytest.raises(ValueError, match=message) as info:
        models.check_model(name, (features,), 10)
    assert "\n" not in str(info.value) and name in str(info.value)


def test_user_model_by_module_function():
    m = models.build("torch.nn:Linear", 3, 4)  # any importable factory(num_features, num_classes)
    assert isinstance(m, torch.nn.Linear) and m.weight.shape == (4, 3)
    with pytest.raises(TypeError, match="not a torch.nn.Module"):
        models.build("math:hypot", 3, 4)
