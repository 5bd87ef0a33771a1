"""The tuning table behind ``allreduce(..., algorithm="auto")``.

Message sizes fall in power-of-two buckets. The first time a (dtype, bucket) is all-reduced
with ``auto`` on a communicator, every candidate (``native`` and each schedule) is timed on a
scratch buffer of that size (warm-up, ``Barrier`` before each repetition, median per rank,
slowest rank counts). Rank 0 decides and broadcasts, so all ranks always run the same
algorithm. Candidates are ordered as in Horovod's operation manager: ``native`` first, and a
schedule replaces it only when it is faster by more than :data:`MARGIN`, so ``auto`` is never
meaningfully slower than native.

Decisions persist in a JSON file keyed by MPI library, rank count and host set, so later
processes skip the measurement. Set ``WORKBENCH_TUNING_CACHE`` to another path, or to
``none`` to keep the table in memory only. ``WORKBENCH_TUNING_REPS`` sets the timed repetitions
per candidate (default 31 below 1 MiB, 11 below 8 MiB, else 5): fewer decide sooner, on noisier
medians (the test suite uses 3).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Callable

import numpy as np
from mpi4py import MPI

from ..files import atomic_write
from ..paths import from_env
from .buffers import FlatBuffer
from .executor import cached_on, state_key
from .implementations import IMPLEMENTATIONS, run_algorithm
from .names import NATIVE

#: A schedule must take less than MARGIN x native's time to be chosen over native.
MARGIN = 0.9


def time_interleaved(comm: MPI.Comm, ops: list[Callable[[], object]], reps: int,
                     warmup: int = 1) -> np.ndarray:
    """Seconds per (op, repetition), each the slowest rank's; collective over ``comm``.

    Ops run round-robin, one ``Barrier`` before each, after ``warmup`` untimed rounds:
    interleaving spreads noise over all ops instead of penalising whichever runs first. The
    order is shuffled every round (same seed on every rank) because an op's cost was measured
    to depend on the op before it (a fixed or rotated order biases one op consistently).
    """
    rng = np.random.default_rng(12345)
    for _ in range(warmup):
        for op in ops:
            op()
    rounds = np.empty((len(ops), reps))
    for rep in range(reps):
        for i in rng.permutation(len(ops)):
            op = ops[i]
            comm.Barrier()
            start = MPI.Wtime()
            op()
            rounds[i, rep] = MPI.Wtime() - start
    comm.Allreduce(MPI.IN_PLACE, rounds, op=MPI.MAX)
    return rounds


def cache_path() -> Path | None:
    """Where decisions persist (``WORKBENCH_TUNING_CACHE``; ``none`` disables): by default
    ``~/.cache/workbench/allreduce_tuning.json``."""
    return from_env("WORKBENCH_TUNING_CACHE", "allreduce_tuning.json")


def repetitions_from_env() -> int | None:
    """``WORKBENCH_TUNING_REPS`` as a positive integer, or None when unset."""
    value = os.environ.get("WORKBENCH_TUNING_REPS", "").strip()
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"WORKBENCH_TUNING_REPS must be an integer >= 1; got {value!r}")
    return int(value)


def bucket_of(nbytes: int) -> int:
    """The power-of-two size class of a message: ``2**(bucket-1) < nbytes <= 2**bucket``."""
    return max(nbytes - 1, 0).bit_length()


class Tuner:
    """Per-communicator table of the fastest all-reduce per (dtype, size bucket).

    Creating one is collective over ``comm`` (it gathers host names once).
    """

    def __init__(self, comm: MPI.Comm) -> None:
        self.comm = comm
        hosts = sorted(set(comm.allgather(MPI.Get_processor_name())))
        lib = MPI.Get_library_version().splitlines()[0].strip()
        digest = hashlib.sha1("|".join(hosts).encode()).hexdigest()[:12]
        self.signature = f"{lib} | ranks={comm.Get_size()} | hosts={digest}"
        self.table: dict[str, dict] = {}  # "float32:20" -> measurement, as persisted
        if comm.Get_rank() == 0:
            self.table = self._load().get(self.signature, {})
        self.table = comm.bcast(self.table, root=0)
        # the hot path: (dtype, bucket) -> algorithm name, no string formatting per call
        self._choice = {(k.split(":")[0], int(k.split(":")[1])): e["algorithm"]
                        for k, e in self.table.items()}

    def choose(self, nbytes: int, dtype_name: str) -> str:
        """The algorithm ``auto`` runs for this size and dtype (collective on a first use)."""
        bucket = bucket_of(nbytes)
        algorithm = self._choice.get((dtype_name, bucket))
        if algorithm is None:
            key = f"{dtype_name}:{bucket}"
            entry = self.table[key] = self.measure(nbytes, dtype_name)
            if self.comm.Get_rank() == 0:
                self._save(key, entry)
            algorithm = self._choice[(dtype_name, bucket)] = entry["algorithm"]
        return algorithm

    def measure(self, nbytes: int, dtype_name: str, repetitions: int | None = None) -> dict:
        """Time every candidate at ``nbytes``; returns ``{"algorithm", "nbytes", "seconds"}``.

        Collective. Candidates are interleaved round by round, so a burst of noise hits them
        all alike; a round's time is the slowest rank's (one ``MAX`` all-reduce at the end),
        and each candidate's score is its median round. Every rank sees the same numbers and
        so reaches the same decision.
        """
        scratch = _scratch(nbytes, dtype_name)  # zeros: repeated sums never overflow
        names = list(IMPLEMENTATIONS)  # native first
        reps = (repetitions or repetitions_from_env()
                or (5 if nbytes >= (8 << 20) else 11 if nbytes >= (1 << 20) else 31))
        ops = [lambda name=name: run_algorithm(scratch, self.comm, name) for name in names]
        rounds = time_interleaved(self.comm, ops, reps, warmup=1)
        seconds = {name: float(np.median(rounds[i])) for i, name in enumerate(names)}
        best = min(names[1:], key=seconds.get)
        pick = best if seconds[best] < MARGIN * seconds[NATIVE] else NATIVE
        return {"algorithm": pick, "nbytes": nbytes, "seconds": seconds}

    def _load(self) -> dict:
        path = cache_path()
        if path is None or not path.exists():
            return {}
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return {}  # a corrupt cache is only a lost measurement

    def _save(self, key: str, entry: dict) -> None:
        path = cache_path()
        if path is None:
            return
        data = self._load()
        data.setdefault(self.signature, {})[key] = entry
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(data, indent=1, sort_keys=True))


def _scratch(nbytes: int, dtype_name: str) -> FlatBuffer:
    if dtype_name == "bfloat16":
        import torch
        return FlatBuffer(torch.zeros(nbytes // 2, dtype=torch.bfloat16))
    dtype = np.dtype(dtype_name)
    return FlatBuffer(np.zeros(nbytes // dtype.itemsize, dtype=dtype))


_TUNER = state_key()


def tuner_for(comm: MPI.Comm) -> Tuner:
    """The :class:`Tuner` of ``comm``, created (collectively) on first use and dropped when
    ``comm`` is freed (an MPI attribute: see :func:`executor.state_key`)."""
    return cached_on(comm, _TUNER, Tuner)
