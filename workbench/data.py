"""Datasets and per-rank sharding. Nothing is downloaded at run time.

- ``digits``: the 8x8 handwritten digits bundled with scikit-learn (1797 images), split 80/20
  (stratified, fixed split seed so every run sees the same test set), pixels scaled to [0, 1].
- ``synthetic``: a classification problem of any size (scikit-learn ``make_classification``).
- a path to an ``.npz`` file with ``X_train, y_train, X_test, y_test``: user-supplied arrays;
  :func:`save_arrays` writes one from numpy arrays.

Batches are a pure function of (seed, rank, epoch, step), so a resumed run sees exactly the
batches an uninterrupted one would.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

BUILTIN_DATASETS = ("digits", "synthetic")


@dataclass
class Dataset:
    """Train and test tensors (features float32, labels int64)."""

    name: str
    X_train: torch.Tensor
    y_train: torch.Tensor
    X_test: torch.Tensor
    y_test: torch.Tensor

    @property
    def num_features(self) -> int:
        return int(np.prod(self.X_train.shape[1:]))

    @property
    def num_classes(self) -> int:
        return int(max(self.y_train.max(), self.y_test.max()).item()) + 1


def _tensors(name, X_train, y_train, X_test, y_test) -> Dataset:
    f = lambda a: torch.as_tensor(np.asarray(a), dtype=torch.float32)  # noqa: E731
    i = lambda a: torch.as_tensor(np.asarray(a), dtype=torch.int64)  # noqa: E731
    return Dataset(name, f(X_train), i(y_train), f(X_test), i(y_test))


def digits() -> Dataset:
    """scikit-learn's bundled digits, 1437 train / 360 test, features in [0, 1]."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    d = load_digits()
    X = d.data.astype(np.float32) / 16.0
    X_train, X_test, y_train, y_test = train_test_split(X, d.target, test_size=0.2,
                                                        random_state=0, stratify=d.target)
    return _tensors("digits", X_train, y_train, X_test, y_test)


def synthetic(samples: int = 4000, features: int = 64, classes: int = 10, seed: int = 0) -> Dataset:
    """A separable-but-not-trivial classification set of any size (80/20 split)."""
    from sklearn.datasets import make_classification
    X, y = make_classification(n_samples=samples, n_features=features, n_informative=features // 2,
                               n_classes=classes, n_clusters_per_class=1, class_sep=2.0,
                               random_state=seed)
    X = (X - X.mean(0)) / (X.std(0) + 1e-8)
    cut = int(samples * 0.8)
    return _tensors("synthetic", X[:cut], y[:cut], X[cut:], y[cut:])


def save_arrays(path: str | os.PathLike, X_train, y_train, X_test, y_test) -> Path:
    """Write user arrays to an ``.npz`` that ``dataset=<path>`` loads on every rank."""
    path = Path(path)
    np.savez(path, X_train=X_train, y_train=y_train, X_test=X_test, y_test=y_test)
    return path


def from_npz(path: str | os.PathLike) -> Dataset:
    """Load user arrays saved by :func:`save_arrays` (or any npz with those four keys)."""
    with np.load(path) as z:
        missing = {"X_train", "y_train", "X_test", "y_test"} - set(z.files)
        if missing:
            raise ValueError(f"dataset file {path} lacks arrays {sorted(missing)}")
        return _tensors(Path(path).stem, z["X_train"], z["y_train"], z["X_test"], z["y_test"])


def load(name: str, *, samples: int = 4000, seed: int = 0) -> Dataset:
    """A dataset by name (``digits``, ``synthetic``) or ``.npz`` path."""
    if name == "digits":
        return digits()
    if name == "synthetic":
        return synthetic(samples=samples, seed=seed)
    if name.endswith(".npz"):
        return from_npz(name)
    raise ValueError(f"dataset must be one of {', '.join(BUILTIN_DATASETS)} or a path to an .npz "
                     f"file; got {name!r}")


def shard_indices(num_samples: int, shard: int, num_shards: int) -> np.ndarray:
    """The training-set indices of one worker: a strided slice, so shards differ by <= 1."""
    return np.arange(shard, num_samples, num_shards)


class Batches:
    """Mini-batches of one shard: reshuffled every epoch, as a pure function of the epoch."""

    def __init__(self, data: Dataset, shard: int, num_shards: int, batch_size: int, seed: int) -> None:
        self.X, self.y = data.X_train, data.y_train
        self.indices = torch.from_numpy(shard_indices(len(self.y), shard, num_shards))
        self.batch_size = batch_size
        self.seed, self.shard = seed, shard
        self.steps_per_epoch = len(self.indices) // batch_size

    def batch(self, global_step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch of this shard's ``global_step``-th step (epochs follow one another)."""
        epoch, step = divmod(global_step, self.steps_per_epoch)
        if step == 0 or getattr(self, "_epoch", None) != epoch:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.shard * 10_007 + epoch)
            self._order = self.indices[torch.randperm(len(self.indices), generator=g)]
            self._epoch = epoch
        idx = self._order[step * self.batch_size:(step + 1) * self.batch_size]
        return self.X[idx], self.y[idx]
