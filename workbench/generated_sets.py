"""The data sets made with scikit-learn, kept on disk: ``digits`` and ``synthetic`` (:mod:`workbench.data`)
are made once per machine and read back as ``.npz`` by every later process, which then never
imports scikit-learn (with the scipy.stats it pulls in, seconds of CPU a rank: longer than a whole digits
run trains). ``WORKBENCH_DATA_CACHE`` moves the folder (default ``~/.cache/workbench/datasets``) or,
set to ``none``, keeps nothing.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
from pathlib import Path

import numpy as np

from .files import atomic_path
from .paths import from_env

#: the arrays of a data set file, in this order (:func:`write_arrays`, ``dataset="FILE.npz"``)
SPLITS = ("X_train", "y_train", "X_test", "y_test")


def data_cache() -> Path | None:
    """Where generated sets are kept (``WORKBENCH_DATA_CACHE``; ``none`` keeps nothing): by default
    ``~/.cache/workbench/datasets``."""
    return from_env("WORKBENCH_DATA_CACHE", "datasets")


def write_arrays(path: str | os.PathLike, arrays) -> Path:
    """Write the four arrays (:data:`SPLITS`, in that order) to the ``.npz`` file ``path`` (that very
    name: numpy adds no suffix), whole or not at all (:class:`~workbench.files.atomic_path`): a reader
    starting meanwhile never reads half a file."""
    path = Path(path)
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.savez(f, **dict(zip(SPLITS, arrays)))
    return path


def generated(name: str, make, **params) -> tuple[np.ndarray, ...]:
    """``make()``'s four arrays, from the cache when an earlier process made them with the same
    ``params`` and the same scikit-learn (its version is part of the file name: another version
    may split or generate differently). A missing, unreadable or unwritable cache only costs the
    time of ``make()``; files are written whole (a temporary file renamed), so ranks that start
    together and all miss it never read half a file."""
    folder = data_cache()
    if folder is None:
        return make()
    key = json.dumps({"name": name, "sklearn": importlib.metadata.version("scikit-learn"), **params},
                     sort_keys=True)
    path = folder / f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.npz"
    try:
        with np.load(path, allow_pickle=False) as f:
            return tuple(f[k] for k in SPLITS)
    except (OSError, KeyError, ValueError):
        pass  # not made yet (or damaged): make it
    arrays = make()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        write_arrays(path, arrays)
    except OSError:
        pass  # a read-only home: every process makes the set itself, as before
    return arrays


def _make_digits() -> tuple[np.ndarray, ...]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    d = load_digits()
    X = d.data.astype(np.float32) / 16.0
    X_train, X_test, y_train, y_test = train_test_split(X, d.target, test_size=0.2,
                                                        random_state=0, stratify=d.target)
    return X_train, y_train, X_test, y_test


def digits_arrays() -> tuple[np.ndarray, ...]:
    """scikit-learn's digits split 80/20 (stratified, seed 0), pixels in [0, 1]."""
    return generated("digits", _make_digits)


def _make_synthetic(samples: int, features: int, classes: int, seed: int) -> tuple[np.ndarray, ...]:
    from sklearn.datasets import make_classification
    X, y = make_classification(n_samples=samples, n_features=features, n_informative=features // 2,
                               n_classes=classes, n_clusters_per_class=1, class_sep=2.0,
                               random_state=seed)
    X = (X - X.mean(0)) / (X.std(0) + 1e-8)
    split = int(samples * 0.8)
    return X[:split], y[:split], X[split:], y[split:]


def synthetic_arrays(samples: int, features: int, classes: int, seed: int) -> tuple[np.ndarray, ...]:
    """``make_classification``'s set, standardised, split 80/20."""
    params = {"samples": samples, "features": features, "classes": classes, "seed": seed}
    return generated("synthetic", lambda: _make_synthetic(**params), **params)
