"""Shared fixtures. MPI tests launch ``mpiexec`` from here (see :func:`mpi`)."""
from __future__ import annotations

from pathlib import Path

import atexit
import os
import shutil
import tempfile

import pytest

from workbench.runtime.launch.launcher import MPILaunchError, run_mpi

from engines_fixture import engines  # noqa: F401  (session fixture: runs on warm engines)
from slurm_fixture import local_slurm  # noqa: F401  (session fixture: a private Slurm)
from vcluster_fixture import vc4  # noqa: F401  (session fixture: a virtual cluster of 4 nodes)

ROOT = Path(__file__).resolve().parent.parent
MPI_DIR = Path(__file__).resolve().parent / "mpi"

# runs, the results store, cluster records and generated data sets of the test session go to a
# scratch directory, never into the working tree or the user's ~/.cache; removed when the process that
# made it exits (every MPI case rank's pytest loads this file too, and made one more each time)
_SCRATCH = tempfile.mkdtemp(prefix="workbench-tests-")
_MAKER = os.getpid()


@atexit.register
def _remove_scratch() -> None:
    if os.getpid() == _MAKER:  # not in a forked child that exits normally
        shutil.rmtree(_SCRATCH, ignore_errors=True)
for _name, _sub in (("WORKBENCH_STORE", "store.sqlite"), ("WORKBENCH_RUNS", "runs"),
                    ("WORKBENCH_STATE_DIR", "state"), ("WORKBENCH_DATA_CACHE", "datasets")):
    os.environ.setdefault(_name, str(Path(_SCRATCH) / _sub))
# ``auto``'s first use of a size times every candidate; 3 repetitions instead of 31 decide the same
# way for the tests (which check that every rank agrees and that the table persists, not the pick)
os.environ.setdefault("WORKBENCH_TUNING_REPS", "3")
# a virtual cluster's node counts as lost after 5 s of silence instead of 10: the tests that lose one wait half
# as long (the guards beat every second from a process of their own, so a busy machine does not silence them)
os.environ.setdefault("WORKBENCH_HEARTBEAT_TIMEOUT", "5")


@pytest.fixture
def mpi(tmp_path, monkeypatch):
    """``mpi(nranks, *python_args, timeout=...)`` runs ``python -m mpi4py <args>`` under mpiexec.

    Each test gets its own all-reduce tuning cache. A failing job fails the test with the
    failed ranks and their tracebacks (:class:`MPILaunchError`); a hang is killed at the timeout.
    """
    monkeypatch.setenv("WORKBENCH_TUNING_CACHE", str(tmp_path / "tuning.json"))

    def launch(nranks: int, *args: str, timeout: float = 240):
        try:
            return run_mpi(nranks, list(args), timeout=timeout, cwd=ROOT)
        except MPILaunchError as exc:
            pytest.fail(str(exc), pytrace=False)

    return launch
