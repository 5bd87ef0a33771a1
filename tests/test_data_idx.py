"""IDX datasets (issue 24, first part): Fashion-MNIST from Debian's dataset-fashion-mnist and any
MNIST-format folder (``idx:FOLDER``), read with numpy, never downloaded."""
from __future__ import annotations

import gzip
import subprocess
import sys

import numpy as np
import torch
import pytest

from workbench import data
from workbench.config import ConfigError, RunConfig


def _write_idx(path, array: np.ndarray, gz: bool) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    payload = header + array.astype(np.uint8).tobytes()
    (gzip.open if gz else open)(f"{path}.gz" if gz else path, "wb").write(payload)


@pytest.fixture
def tiny(tmp_path):
    """An MNIST-format folder of 6x6 images: 40 train, 12 test, 3 classes; the training images raw,
    the rest gzipped (both spellings are read)."""
    rng = np.random.default_rng(0)
    arrays = {"X_train": rng.integers(0, 256, (40, 6, 6)), "y_train": rng.integers(0, 3, 40),
              "X_test": rng.integers(0, 256, (12, 6, 6)), "y_test": np.arange(12) % 3}
    for key, name in data.IDX_FILES.items():
        _write_idx(tmp_path / name, arrays[key], gz=key != "X_train")
    return tmp_path, arrays


def test_an_mnist_format_folder_is_described_from_its_headers_and_loaded_as_pixels_over_255(tiny):
    folder, arrays = tiny
    info = data.describe(f"idx:{folder}")
    assert info == data.DataInfo(40, 12, (36,), 3)
    d = data.load(f"idx:{folder}")
    assert d.X_train.shape == (40, 36) and d.X_test.shape == (12, 36)
    np.testing.assert_allclose(d.X_train.numpy(), arrays["X_train"].reshape(40, 36) / 255.0, rtol=1e-6)
    assert d.y_test.tolist() == arrays["y_test"].tolist() and d.num_classes == 3


def test_bad_idx_folders_are_one_line_errors_naming_the_file(tiny, tmp_path):
    folder, _ = tiny
    (folder / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(ValueError, match=r"has no t10k-labels-idx1-ubyte\[\.gz\] \(an MNIST-format folder"):
        data.describe(f"idx:{folder}")
    _write_idx(folder / "t10k-labels-idx1-ubyte", np.zeros(11), gz=False)  # 11 labels for 12 images
    with pytest.raises(ValueError, match=r"test images \(12, 6, 6\) and labels \(11,\) do not match"):
        data.describe(f"idx:{folder}")
    (folder / "t10k-labels-idx1-ubyte").write_bytes(b"PK\x03\x04 not idx")
    with pytest.raises(ValueError, match="is not an IDX file of unsigned bytes"):
        data.describe(f"idx:{folder}")
    with pytest.raises(ConfigError, match=r"^dataset 'idx:/nonexistent': /nonexistent has no train-images"):
        RunConfig(dataset="idx:/nonexistent")


def test_a_missing_fashion_mnist_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setattr(data, "FASHION_MNIST", tmp_path / "absent")
    with pytest.raises(ValueError, match=r"install Debian's dataset-fashion-mnist \(apt-get install "
                                         r"dataset-fashion-mnist; `make demo` and `make test` install"):
        data.describe("fashion-mnist")


def test_the_cli_refuses_a_missing_dataset_before_launch(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "workbench.cli", "train", "--algorithm", "sync-sgd",
                           "--dataset", f"idx:{tmp_path}", "--out", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and not (tmp_path / "run").exists()
    assert proc.stderr.startswith("workbench train: error: --dataset 'idx:") and len(proc.stderr.splitlines()) == 1


def test_the_debian_package_is_fashion_mnist(tmp_path):
    """`make test` installs dataset-fashion-mnist (Makefile `datasets`)."""
    assert data.describe("fashion-mnist") == data.DataInfo(60000, 10000, (784,), 10)
    d = data.load("fashion-mnist")
    assert np.bincount(d.y_train.numpy()).tolist() == [6000] * 10  # the published split: 6,000 per class
    assert np.bincount(d.y_test.numpy()).tolist() == [1000] * 10
    assert 0.0 <= float(d.X_train.min()) and float(d.X_train.max()) == 1.0


def test_sync_sgd_learns_fashion_mnist_in_one_epoch(tmp_path):
    """A real run on the real data: 2 ranks, the digits MLP widened to 784 inputs, one epoch."""
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "workbench.cli", "train", "--algorithm", "sync-sgd", "--ranks", "2",
                           "--dataset", "fashion-mnist", "--epochs", "1", "--batch-size", "64", "--eval-every", "200",
                           "--out", str(out), "--store", str(tmp_path / "s.sqlite")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json
    summary = json.loads((out / "summary.json").read_text())
    assert summary["final_test_accuracy"] >= 0.75, summary["final_test_accuracy"]  # MLPClassifier's published 0.87
    # each rank holds its half of the 60,000 training images as float32 (+ int64 labels), the test set on rank 0 only
    half = 30_000 * (784 * 4 + 8)
    memory = {r["rank"]: r for r in summary["memory_per_rank"]}
    assert memory[0]["data_bytes"] == half + 10_000 * (784 * 4 + 8) and memory[1]["data_bytes"] == half
    assert all(r["max_rss_bytes"] > r["data_bytes"] for r in memory.values())


@pytest.mark.parametrize("name", ["digits", "fashion-mnist"])
def test_a_shard_holds_exactly_its_rows_of_the_whole_set(name):
    whole = data.load(name)
    for index in range(3):
        shard = data.load(name, shard=(index, 3), test=False)
        assert torch.equal(shard.X_train, whole.X_train[index::3]) and torch.equal(shard.y_train, whole.y_train[index::3])
        assert (shard.train_samples, shard.num_classes, len(shard.y_test)) == (whole.train_samples, 10, 0)
        # the batches are the same whether the rank holds the whole set or its shard
        mine, full = data.Batches(shard, index, 3, 32, seed=4), data.Batches(whole, index, 3, 32, seed=4)
        for step in (0, 5, mine.steps_per_epoch + 1):
            assert all(torch.equal(a, b) for a, b in zip(mine.batch(step), full.batch(step)))
    master = data.load(name, shard=(None, 3))
    assert len(master.y_train) == 0 and master.num_features == whole.num_features and torch.equal(master.y_test, whole.y_test)
    with pytest.raises(ValueError, match="holds shard 0 of 3"):
        data.Batches(data.load(name, shard=(0, 3)), 1, 3, 32, seed=0)


def test_synthetic_imagenet_makes_rows_on_demand_the_same_on_every_rank():
    info = data.describe("synthetic-imagenet", samples=40)
    assert info == data.DataInfo(40, 64, (3 * 224 * 224,), 1000)
    whole = data.load("synthetic-imagenet", samples=40, seed=3)
    shard = data.load("synthetic-imagenet", samples=40, seed=3, shard=(1, 4))
    rows = torch.tensor([0, 2])
    assert torch.equal(shard.X_train[rows], whole.X_train[torch.tensor([1, 9])])  # rows 1, 5, 9, ... of the whole
    assert shard.X_train[rows].shape == (2, 150_528) and shard.nbytes < 10_000  # labels only: pixels are made on demand
    assert not torch.equal(whole.X_train[rows], data.load("synthetic-imagenet", samples=40, seed=4).X_train[rows])


def test_lenet_takes_28x28_images_with_lenet5s_parameter_count():
    import torch

    from workbench import models
    model = models.build("lenet", 784, 10)
    assert sum(p.numel() for p in model.parameters()) == 61_706  # 156 + 2,416 + 48,120 + 10,164 + 850
    assert model(torch.zeros(3, 784)).shape == (3, 10)
    RunConfig(model="lenet", dataset="fashion-mnist")  # validated without torch: by arithmetic
    with pytest.raises(ConfigError, match=r"model 'lenet' needs square images of side >= 12 \(28x28: "
                                          r"fashion-mnist\); 64 features is not one"):
        RunConfig(model="lenet", dataset="digits")


def test_a_subset_keeps_the_first_rows_of_each_split_and_the_whole_sets_classes(tiny):
    folder, arrays = tiny
    name = f"idx:{folder}"
    assert data.describe(name, subset=10) == data.DataInfo(10, 10, (36,), 3)
    assert data.describe(name, subset=1000) == data.describe(name)  # at most N: a split smaller than N stays whole
    whole, cut = data.load(name), data.load(name, subset=10)
    assert torch.equal(cut.X_train, whole.X_train[:10]) and torch.equal(cut.y_test, whole.y_test[:10])
    assert (cut.train_samples, cut.num_classes) == (10, 3)
    arrays["y_test"][:] = 0  # a subset that misses a class keeps the whole set's output layer
    data.save_arrays(folder / "one.npz", arrays["X_train"].reshape(40, 36), np.zeros(40, int),
                     arrays["X_test"].reshape(12, 36), np.arange(12) % 3)
    assert data.load(str(folder / "one.npz"), subset=4).num_classes == 3
    shard = data.load(name, subset=10, shard=(1, 3), test=False)  # the shard is cut from the subset
    assert torch.equal(shard.X_train, whole.X_train[1:10:3]) and shard.train_samples == 10
    images = data.load("synthetic-imagenet", samples=40, subset=8, shard=(0, 4))
    assert (images.train_samples, len(images.y_train), len(images.y_test)) == (8, 2, 8)


def test_a_subset_decompresses_only_its_rows_of_images(tiny):
    folder, arrays = tiny
    path = folder / (data.IDX_FILES["X_test"] + ".gz")
    assert np.array_equal(data.read_idx(path, rows=5), arrays["X_test"][:5])
    assert np.array_equal(data.read_idx(path, rows=99), arrays["X_test"])  # at most N
    whole = gzip.decompress(path.read_bytes())
    path.write_bytes(gzip.compress(whole)[:-40])  # the file cut short: its last rows are gone
    assert np.array_equal(data.read_idx(path, rows=5), arrays["X_test"][:5])  # the rest is never read
    with pytest.raises((EOFError, ValueError)):
        data.read_idx(path)
    cut = data.load(f"idx:{folder}", subset=2)  # labels 0 and 1 only: the set's 3 classes kept
    assert cut.num_classes == 3 and cut.y_test.tolist() == [0, 1]


def test_the_subset_option_sizes_the_run(tmp_path):
    """RunConfig(subset=N): checked, counted in the planned steps, and honoured by the ranks."""
    from workbench.runtime.client.run import expected_steps
    from workbench.runtime.launch.batch import train
    with pytest.raises(ConfigError, match=r"^subset must be an integer >= 1; got 0$"):
        RunConfig(subset=0)
    with pytest.raises(ConfigError, match=r"batch_size 32 is larger than a worker's shard \(25 samples: 100 training"):
        RunConfig(algorithm="sync-sgd", dataset="digits", subset=100, batch_size=32)
    cfg = RunConfig(algorithm="sync-sgd", ranks=2, dataset="digits", subset=200, epochs=1, batch_size=10,
                    eval_every=1000, telemetry=False)
    assert expected_steps(cfg) == 20  # 100 rows per rank, 10 steps each
    summary = train(cfg, tmp_path / "run", timeout=300)
    assert summary["steps_per_worker"] == 10 and summary["config"]["subset"] == 200
    assert summary["memory_per_rank"][1]["data_bytes"] == 100 * (64 * 4 + 8)  # 100 rows of the 200, no test rows
