"""Clusters of warm engines for the tests (``wb.Cluster``: ipyparallel engines that are MPI ranks).

``private_cluster(scratch)``: a 4-engine cluster whose engines inherit a state folder and an
all-reduce tuning table of their own under ``scratch`` (``auto`` measures afresh; no other cluster's
records are touched); the environment is restored when it stops.

``engines`` (one for the whole session, started by the first test that asks for it, stopped at the
end; the private state folder and tuning table stay in the environment while it is up):
``engines(cfg, run_dir, timeout=240)`` trains ``cfg`` on such a cluster and returns its summary, as
``batch.train`` does under mpiexec; the run directory gets the same files. For the tests whose point
is what a run computes (update rules, bytes, determinism), not how ranks start: a run on started
engines takes about 1 s here, a new ``mpiexec`` job 6-7 s, most of it ``import torch`` in every rank.
A run that fails raises :class:`~workbench.runtime.client.run.RunError`.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

import pytest

from workbench.runtime.client.cluster import Cluster

_PRIVATE = {"WORKBENCH_STATE_DIR": "state", "WORKBENCH_TUNING_CACHE": "tuning.json"}


@contextmanager
def private_cluster(scratch: Path, n: int = 4):
    saved = {k: os.environ.get(k) for k in _PRIVATE}
    os.environ.update({k: str(scratch / name) for k, name in _PRIVATE.items()})  # what the engines inherit
    try:
        with Cluster(n=n) as cluster:
            yield cluster
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def trainer(cluster):
    """``train(cfg, run_dir, timeout=240) -> summary`` on ``cluster`` (nothing recorded in the store)."""
    return lambda cfg, run_dir, timeout=240: cluster.train(cfg, run_dir, store=False).wait(timeout=timeout).summary


@pytest.fixture(scope="session")
def engines(tmp_path_factory):
    with private_cluster(tmp_path_factory.mktemp("engines")) as cluster:
        yield trainer(cluster)
