"""Datasets, sharding, batches and models (single process)."""
import numpy as np
import pytest
import torch

from workbench import data, models


def test_digits_split_and_scale():
    d = data.digits()
    assert d.X_train.shape == (1437, 64) and d.X_test.shape == (360, 64)
    assert d.num_classes == 10 and float(d.X_train.max()) <= 1.0 and float(d.X_train.min()) >= 0.0
    assert torch.equal(data.digits().X_test, d.X_test)  # the same test set every time


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


@pytest.mark.parametrize("name", models.BUILTIN_MODELS)
def test_flat_params_are_views_and_gradients_land_in_the_flat_buffer(name):
    features = 784 if name == "lenet" else 64  # lenet: side >= 12
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


def test_user_model_by_module_function():
    m = models.build("torch.nn:Linear", 3, 4)  # any importable factory(num_features, num_classes)
    assert isinstance(m, torch.nn.Linear) and m.weight.shape == (4, 3)
    with pytest.raises(TypeError, match="not a torch.nn.Module"):
        models.build("math:hypot", 3, 4)
