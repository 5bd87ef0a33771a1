"""Datasets and per-rank sharding. Nothing is downloaded at run time.

- ``digits``: the 8x8 handwritten digits bundled with scikit-learn (1797 images), split 80/20
  (stratified, fixed split seed so every run sees the same test set), pixels scaled to [0, 1].
- ``synthetic``: a classification problem of any size (scikit-learn ``make_classification``).
- ``fashion-mnist``: Zalando's Fashion-MNIST (60,000 + 10,000 28x28 grey images, 10 classes) from
  Debian's ``dataset-fashion-mnist`` package (IDX gzip files under :data:`FASHION_MNIST`; ``make
  test`` installs it); ``idx:FOLDER``: any MNIST-format folder (MNIST, KMNIST, EMNIST files a
  cluster already has: ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``, ``t10k-...``,
  each optionally ``.gz``). Pixels scaled to [0, 1], images flattened (784 features).
- a path to an ``.npz`` file with ``X_train, y_train, X_test, y_test``: user-supplied arrays;
  :func:`save_arrays` writes one from numpy arrays. :func:`check_arrays` refuses (ValueError,
  naming the array) what cannot train: an empty split, strings or objects, X and y of different
  lengths, labels that are not integers, negative or >= :data:`MAX_CLASSES`, NaN/inf features.

torch is imported only where tensors are made, so validating a configuration (``describe``)
needs numpy alone. ``digits`` and ``synthetic`` are made with scikit-learn once per machine and kept
as ``.npz`` files (:mod:`workbench.generated_sets`; ``WORKBENCH_DATA_CACHE``): importing scikit-learn (and the
scipy.stats it pulls in) cost every rank seconds of CPU, longer than a whole digits run trains.

Batches are a pure function of (seed, rank, epoch, step), so a resumed run sees exactly the
batches an uninterrupted one would.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from .syspkgs import advice
from .generated_sets import SPLITS as _ARRAYS, digits_arrays, synthetic_arrays, write_arrays
from .idx import read_idx  # noqa: F401 - data.read_idx, as before

BUILTIN_DATASETS = ("digits", "synthetic", "synthetic-imagenet", "fashion-mnist")
#: where Debian's dataset-fashion-mnist puts the four IDX files
FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
#: the four files of an MNIST-format folder (each may end in .gz)
IDX_FILES = {"X_train": "train-images-idx3-ubyte", "y_train": "train-labels-idx1-ubyte",
             "X_test": "t10k-images-idx3-ubyte", "y_test": "t10k-labels-idx1-ubyte"}
_KNOWN = "digits, synthetic, synthetic-imagenet, fashion-mnist, idx:FOLDER (an MNIST-format folder) or a path to an .npz file"
#: Labels are class indices 0 .. MAX_CLASSES - 1: the model's output layer has max label + 1
#: units, so one stray label of 1e9 would otherwise ask for gigabytes of weights.
MAX_CLASSES = 100_000


@dataclass(frozen=True)
class DataInfo:
    """What a configuration needs to know about a dataset before anything loads it on the ranks."""

    train_samples: int
    test_samples: int
    feature_shape: tuple[int, ...]  # one sample's shape: (64,) for digits
    num_classes: int


class Shard(NamedTuple):
    """Which rows of the training set a rank keeps: the strided slice ``index`` of ``count``
    (:func:`shard_indices`); ``index=None``: none of them (a master rank, which trains nothing)."""

    index: int | None
    count: int


@dataclass
class Dataset:
    """Train and test tensors (features float32, labels int64).

    ``X_train``/``y_train`` hold the whole training set, or with ``shard`` only that worker's rows;
    ``train_samples`` and ``num_classes`` are always the whole set's."""

    name: str
    X_train: torch.Tensor
    y_train: torch.Tensor
    X_test: torch.Tensor
    y_test: torch.Tensor
    train_samples: int
    num_classes: int
    shard: Shard | None = None

    @property
    def num_features(self) -> int:
        return int(np.prod(self.X_train.shape[1:]))

    @property
    def nbytes(self) -> int:
        """Bytes of the tensors this dataset holds (what one rank keeps in memory)."""
        return sum(t.element_size() * t.numel() for t in (self.X_train, self.y_train, self.X_test, self.y_test))


def _tensors(name, X_train, y_train, X_test, y_test, *, shard: Shard | None = None, test: bool = True,
             subset: int | None = None, scale: float = 1.0) -> Dataset:
    """A :class:`Dataset` of numpy arrays, keeping only the first ``subset`` rows of each split (all:
    None), of those only ``shard``'s training rows and, unless ``test``, no test rows; the rows kept
    are converted to float32 (times ``scale``) after the cut, so a rank never holds the whole set
    as float32. The class count is the whole set's (a subset keeps the model's output layer)."""
    import torch
    X_train, y_train, X_test, y_test = (np.asarray(a) for a in (X_train, y_train, X_test, y_test))
    num_classes = int(max(y_train.max(), y_test.max())) + 1
    if subset is not None:
        X_train, y_train, X_test, y_test = X_train[:subset], y_train[:subset], X_test[:subset], y_test[:subset]
    train_samples = len(y_train)
    if shard is not None:
        rows = shard_indices(train_samples, shard.index, shard.count) if shard.index is not None else []
        X_train, y_train = X_train[rows], y_train[rows]
    if not test:
        X_test, y_test = X_test[:0], y_test[:0]
    f = lambda a: torch.as_tensor(a.astype(np.float32) * np.float32(scale) if scale != 1.0 else a, dtype=torch.float32)  # noqa: E731
    i = lambda a: torch.as_tensor(a, dtype=torch.int64)  # noqa: E731
    return Dataset(name, f(X_train), i(y_train), f(X_test), i(y_test), train_samples, num_classes, shard)


def digits(**cut) -> Dataset:
    """scikit-learn's bundled digits, 1437 train / 360 test, features in [0, 1] (``cut``: the
    ``shard``/``test`` of :func:`load`)."""
    return _tensors("digits", *digits_arrays(), **cut)


def synthetic(samples: int = 4000, features: int = 64, classes: int = 10, seed: int = 0, **cut) -> Dataset:
    """A separable-but-not-trivial classification set of any size (80/20 split)."""
    return _tensors("synthetic", *synthetic_arrays(samples, features, classes, seed), **cut)


def save_arrays(path: str | os.PathLike, X_train, y_train, X_test, y_test) -> Path:
    """Write user arrays to the ``.npz`` file ``path`` (that very name), which ``dataset=<path>`` loads on
    every rank; written whole or not at all, so ranks starting meanwhile never read half a file."""
    return write_arrays(path, (X_train, y_train, X_test, y_test))


def _read_npz(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The four arrays of a dataset file (never unpickling anything), or ValueError saying why not."""
    try:
        with np.load(path, allow_pickle=False) as z:
            if not hasattr(z, "files"):
                raise ValueError("it holds one array, not an .npz archive of X_train, y_train, X_test, y_test")
            missing = set(_ARRAYS) - set(z.files)
            if missing:
                raise ValueError(f"it lacks arrays {sorted(missing)} (has {sorted(z.files) or 'none'})")
            return {name: z[name] for name in _ARRAYS}
    except ValueError as exc:
        if "allow_pickle" in str(exc):
            exc = ValueError("it holds Python objects (object arrays or a pickle), not numeric arrays")
        raise ValueError(f"cannot read {os.fspath(path)!r}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - OSError, BadZipFile, EOFError...: all one message
        raise ValueError(f"cannot read {os.fspath(path)!r}: {type(exc).__name__}: {exc}") from None


def check_arrays(X_train, y_train, X_test, y_test, where: str = "dataset") -> DataInfo:
    """Check user arrays with numpy alone; ValueError naming the array and what is wrong."""
    arrays = dict(zip(_ARRAYS, (np.asarray(a) for a in (X_train, y_train, X_test, y_test))))
    for name in ("X_train", "X_test"):
        X = arrays[name]
        if X.dtype.kind not in "biuf":
            raise ValueError(f"{where}: {name} must hold numbers; got dtype {X.dtype}")
        if X.ndim < 2 or int(np.prod(X.shape[1:])) == 0:
            raise ValueError(f"{where}: {name} must be (samples, features...) with at least one feature; "
                             f"got shape {X.shape}")
        if len(X) == 0:
            raise ValueError(f"{where}: {name} is empty (no samples)")
        if X.dtype.kind == "f" and not np.isfinite(X).all():
            raise ValueError(f"{where}: {name} holds NaN or infinite values "
                             f"({int((~np.isfinite(X)).sum())} of {X.size})")
    if arrays["X_train"].shape[1:] != arrays["X_test"].shape[1:]:
        raise ValueError(f"{where}: X_train samples have shape {arrays['X_train'].shape[1:]} but X_test "
                         f"samples {arrays['X_test'].shape[1:]}")
    for name in ("y_train", "y_test"):
        y, X = arrays[name], arrays["X" + name[1:]]
        if y.dtype.kind not in "iu":
            raise ValueError(f"{where}: {name} must hold integer class labels 0, 1, ...; got dtype {y.dtype}")
        if y.ndim != 1 or len(y) != len(X):
            raise ValueError(f"{where}: {name} must be one label per sample of X{name[1:]} ({len(X)}); got "
                             f"shape {y.shape}")
        low, high = int(y.min()), int(y.max())
        if low < 0 or high >= MAX_CLASSES:
            raise ValueError(f"{where}: {name} labels must be class indices in 0..{MAX_CLASSES - 1}; got "
                             f"{low if low < 0 else high}")
    num_classes = max(int(arrays["y_train"].max()), int(arrays["y_test"].max())) + 1
    return DataInfo(len(arrays["y_train"]), len(arrays["y_test"]), tuple(arrays["X_train"].shape[1:]),
                    num_classes)


def from_npz(path: str | os.PathLike, **cut) -> Dataset:
    """Load user arrays saved by :func:`save_arrays` (or any npz with those four keys), checked
    by :func:`check_arrays`."""
    arrays = _read_npz(path)
    check_arrays(**arrays, where=f"dataset {os.fspath(path)!r}")
    return _tensors(Path(path).stem, *(arrays[name] for name in _ARRAYS), **cut)


def _idx_folder(name: str) -> Path | None:
    """The folder of an IDX dataset name, or None when ``name`` is not one."""
    if name == "fashion-mnist":
        return FASHION_MNIST
    if name.startswith("idx:"):
        return Path(name[4:])
    return None


def _idx_path(name: str, folder: Path, key: str) -> Path:
    for path in (folder / IDX_FILES[key], folder / (IDX_FILES[key] + ".gz")):
        if path.is_file():
            return path
    if name == "fashion-mnist" and not folder.is_dir():
        raise ValueError(f"dataset 'fashion-mnist': {folder} is missing; install Debian's dataset-fashion-mnist "
                         f"({advice('dataset-fashion-mnist')})")
    raise ValueError(f"dataset {name!r}: {folder} has no {IDX_FILES[key]}[.gz] (an MNIST-format folder holds "
                     f"{', '.join(IDX_FILES.values())})")


def _describe_idx(name: str, folder: Path) -> DataInfo:
    shapes = {key: read_idx(_idx_path(name, folder, key), header_only=True) for key in IDX_FILES}
    for split in ("train", "test"):
        images, labels = shapes[f"X_{split}"], shapes[f"y_{split}"]
        if len(images) < 2 or len(labels) != 1 or images[0] != labels[0] or images[0] == 0:
            raise ValueError(f"dataset {name!r}: {split} images {images} and labels {labels} do not match")
    if shapes["X_train"][1:] != shapes["X_test"][1:]:
        raise ValueError(f"dataset {name!r}: train images {shapes['X_train'][1:]} vs test {shapes['X_test'][1:]}")
    classes = max(int(read_idx(_idx_path(name, folder, key)).max()) for key in ("y_train", "y_test")) + 1
    return DataInfo(shapes["X_train"][0], shapes["X_test"][0], (int(np.prod(shapes["X_train"][1:])),), classes)


def from_idx(name: str, **cut) -> Dataset:
    """An IDX dataset (``fashion-mnist`` or ``idx:FOLDER``): pixels / 255, images flattened; only the
    rows ``cut`` keeps become float32 (a worker of 4 holds 47 MB of Fashion-MNIST, not 188 MB)."""
    folder = _idx_folder(name)
    # images: only the rows a subset keeps are decompressed; labels whole (the class count is the set's)
    arrays = {key: read_idx(_idx_path(name, folder, key), rows=cut.get("subset") if key.startswith("X") else None)
              for key in IDX_FILES}
    X = {key: arrays[key].reshape(len(arrays[key]), -1) for key in ("X_train", "X_test")}
    return _tensors(name, X["X_train"], arrays["y_train"].astype(np.int64), X["X_test"],
                    arrays["y_test"].astype(np.int64), scale=1 / 255, **cut)


class GeneratedImages:
    """Images of random pixels made when indexed, never stored: global rows ``rows`` of a data set
    whose row r is a pure function of (seed, r), float32 in [0, 1) of ``sample_shape``. Indexing
    (a tensor, array or slice of positions 0..len-1) gives a float32 tensor. For throughput-only
    runs on ImageNet-shaped inputs: one batch in memory at a time, whatever the data set's size."""

    def __init__(self, sample_shape: tuple[int, ...], seed: int, rows: np.ndarray) -> None:
        self.sample_shape, self.seed, self.rows = tuple(sample_shape), seed, np.asarray(rows, dtype=np.int64)
        self.shape = (len(self.rows), *self.sample_shape)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index):
        import torch
        picked = self.rows[index] if isinstance(index, slice) else self.rows[np.asarray(index, dtype=np.int64)]
        out = np.empty((len(picked), *self.sample_shape), np.float32)
        for i, r in enumerate(picked):
            out[i] = np.random.default_rng((self.seed, int(r))).random(self.sample_shape, dtype=np.float32)
        return torch.from_numpy(out)

    def element_size(self) -> int:
        return 4

    def numel(self) -> int:
        return 0  # nothing held


#: ``synthetic-imagenet``: ImageNet-shaped random images (3 x 224 x 224, 1000 classes), rows
#: made on demand (:class:`GeneratedImages`); ``synthetic_samples`` training rows, this many test rows
IMAGENET_SHAPE, IMAGENET_CLASSES, IMAGENET_TEST_ROWS = (3, 224, 224), 1000, 64


def synthetic_imagenet(samples: int = 4000, seed: int = 0, shard: Shard | None = None, test: bool = True,
                       subset: int | None = None) -> Dataset:
    """ImageNet-shaped noise with random labels, for throughput only (nothing to learn): samples
    are flat rows of 150,528 features, as every data set here, that image models reshape
    (``subset``: at most that many rows of each split)."""
    import torch
    flat = (int(np.prod(IMAGENET_SHAPE)),)
    labels = np.random.default_rng((seed, 1)).integers(0, IMAGENET_CLASSES, samples + IMAGENET_TEST_ROWS)
    train, tests = _capped(samples, subset), _capped(IMAGENET_TEST_ROWS, subset)
    rows = np.arange(train)
    if shard is not None:
        rows = shard_indices(train, shard.index, shard.count) if shard.index is not None else rows[:0]
    test_rows = np.arange(samples, samples + (tests if test else 0))
    return Dataset("synthetic-imagenet", GeneratedImages(flat, seed, rows), torch.as_tensor(labels[rows]),
                   GeneratedImages(flat, seed, test_rows), torch.as_tensor(labels[test_rows]), train,
                   IMAGENET_CLASSES, shard)


def _capped(rows: int, subset: int | None) -> int:
    """Rows of a split that ``subset`` keeps (its first ``subset``; None: all)."""
    return rows if subset is None else min(rows, subset)


def describe(name: str, *, samples: int = 4000, subset: int | None = None) -> DataInfo:
    """Sizes, sample shape and class count of a dataset by name or ``.npz`` path, with numpy
    only (``subset``: as :func:`load` keeps it); ValueError for an unknown name or arrays
    :func:`check_arrays` refuses."""
    whole = _describe_whole(name, samples)
    return dataclasses.replace(whole, train_samples=_capped(whole.train_samples, subset),
                               test_samples=_capped(whole.test_samples, subset))


def _describe_whole(name: str, samples: int) -> DataInfo:
    if name == "digits":
        return DataInfo(1437, 360, (64,), 10)  # digits() split, known without loading it
    if name == "synthetic":
        cut = int(samples * 0.8)
        return DataInfo(cut, samples - cut, (64,), 10)  # synthetic()'s defaults
    if name == "synthetic-imagenet":
        return DataInfo(samples, IMAGENET_TEST_ROWS, (int(np.prod(IMAGENET_SHAPE)),), IMAGENET_CLASSES)
    if (folder := _idx_folder(name)) is not None:
        return _describe_idx(name, folder)
    if name.endswith(".npz"):
        if Path(name).is_dir():
            raise ValueError(f"cannot read {name!r}: it is a directory")
        return check_arrays(**_read_npz(name), where=f"{name!r}")
    raise ValueError(f"dataset must be one of {_KNOWN}; got {name!r}")


def load(name: str, *, samples: int = 4000, seed: int = 0, shard: Shard | tuple | None = None,
         test: bool = True, subset: int | None = None) -> Dataset:
    """A dataset by name (``digits``, ``synthetic``, ``synthetic-imagenet``, ``fashion-mnist``,
    ``idx:FOLDER``) or ``.npz`` path.

    ``subset=N`` keeps only the first N rows of each split (``RunConfig.subset``: a quick or
    throughput-only run on a real data set); ``shard=(index, count)`` then keeps only that worker's
    training rows (``index=None``: none, for a rank that trains nothing); ``test=False`` keeps no
    test rows (ranks that never evaluate)."""
    cut = {"shard": Shard(*shard) if shard is not None else None, "test": test, "subset": subset}
    if name == "digits":
        return digits(**cut)
    if name == "synthetic":
        return synthetic(samples=samples, seed=seed, **cut)
    if name == "synthetic-imagenet":
        return synthetic_imagenet(samples=samples, seed=seed, **cut)
    if _idx_folder(name) is not None:
        return from_idx(name, **cut)
    if name.endswith(".npz"):
        return from_npz(name, **cut)
    raise ValueError(f"dataset must be one of {_KNOWN}; got {name!r}")


def shard_indices(num_samples: int, shard: int, num_shards: int) -> np.ndarray:
    """The training-set indices of one worker: a strided slice, so shards differ by <= 1."""
    return np.arange(shard, num_samples, num_shards)


class Batches:
    """Mini-batches of one shard: reshuffled every epoch, as a pure function of the epoch.

    ``data`` holds the whole training set or (``load(..., shard=...)``) only this shard's rows;
    either way the batches are the same."""

    def __init__(self, data: Dataset, shard: int, num_shards: int, batch_size: int, seed: int) -> None:
        import torch
        self.X, self.y = data.X_train, data.y_train
        if data.shard is None:
            self.indices = torch.from_numpy(shard_indices(len(self.y), shard, num_shards))
        elif tuple(data.shard) == (shard, num_shards):
            self.indices = torch.arange(len(self.y))
        else:
            raise ValueError(f"Batches of shard {shard} of {num_shards}: the data holds shard "
                             f"{data.shard.index} of {data.shard.count}")
        self.batch_size = batch_size
        self.seed, self.shard = seed, shard
        self.steps_per_epoch = len(self.indices) // batch_size

    def batch(self, global_step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch of this shard's ``global_step``-th step (epochs follow one another)."""
        import torch
        epoch, step = divmod(global_step, self.steps_per_epoch)
        if step == 0 or getattr(self, "_epoch", None) != epoch:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.shard * 10_007 + epoch)
            self._order = self.indices[torch.randperm(len(self.indices), generator=g)]
            self._epoch = epoch
        idx = self._order[step * self.batch_size:(step + 1) * self.batch_size]
        return self.X[idx], self.y[idx]
