"""``allreduce(buf, comm=None, algorithm="auto")``: sum a buffer in place across ranks.

``algorithm`` is a schedule name (:data:`workbench.schedules.SCHEDULES`), ``"native"`` (the MPI
library's ``MPI_Allreduce``) or ``"auto"``. ``auto`` follows Horovod's operation manager: an
ordered list of implementations (:data:`AUTO_ORDER`), and the first one enabled for this
buffer runs.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, TypeVar

from mpi4py import MPI

from .. import telemetry
from .buffers import FlatBuffer
from .implementations import buffer_wire_bytes, run_algorithm
from .names import AUTO, NATIVE, algorithm_names, check_algorithm  # noqa: F401 - re-exported
from .tuning import tuner_for

T = TypeVar("T")


@dataclass(frozen=True)
class Choice:
    """One entry of ``auto``'s list: ``pick(flat, comm)`` returns the algorithm to run, or None
    when this entry is not enabled for the buffer (the next entry is asked)."""
    name: str
    pick: Callable[[FlatBuffer, MPI.Comm], str | None]


def _tuned(flat: FlatBuffer, comm: MPI.Comm) -> str | None:
    choice = tuner_for(comm).choose(flat.length * flat.itemsize, flat.dtype_name)
    return None if choice == NATIVE else choice


#: ``auto``: a schedule where the tuning table measured it clearly faster than native at this
#: message size (:mod:`~workbench.comm.tuning`), else native, which is always enabled.
AUTO_ORDER: tuple[Choice, ...] = (Choice("tuned schedule", _tuned), Choice(NATIVE, lambda flat, comm: NATIVE))


def choose(flat: FlatBuffer, comm: MPI.Comm) -> str:
    """The algorithm ``auto`` runs for ``flat`` on ``comm`` (collective on a size's first use)."""
    for entry in AUTO_ORDER:
        algorithm = entry.pick(flat, comm)
        if algorithm is not None:
            return algorithm
    raise RuntimeError("no implementation of auto is enabled")  # native always is


def allreduce(buf: T, comm: MPI.Comm | None = None, algorithm: str = AUTO) -> T:
    """Sum ``buf`` element-wise across all ranks of ``comm``, in place, and return it.

    Args:
        buf: a numpy array or torch tensor of any shape and length; dtype one of
            :data:`workbench.comm.names.SUPPORTED_DTYPES`. Every rank passes
            the same length and dtype. Non-contiguous and non-CPU tensors are reduced in a
            staging copy and written back. bfloat16 is summed in float32 by every algorithm.
        comm: an mpi4py communicator (default ``MPI.COMM_WORLD``).
        algorithm: a schedule name, ``"native"`` or ``"auto"``.

    When a :mod:`workbench.telemetry` recorder is active, one ``comm`` span is
    recorded with the message size in bytes and the algorithm that ran.
    """
    check_algorithm(algorithm)
    flat = FlatBuffer(buf)
    comm = MPI.COMM_WORLD if comm is None else comm
    if comm.Get_size() == 1:
        return buf
    chosen = choose(flat, comm) if algorithm == AUTO else algorithm
    rec = telemetry.current()
    start = time.perf_counter_ns() if rec is not None else 0
    run_algorithm(flat, comm, chosen)
    flat.write_back()
    if rec is not None:
        rec.record(f"allreduce:{chosen}", "comm", start, time.perf_counter_ns(),
                   bytes=flat.length * flat.itemsize, wire_bytes=buffer_wire_bytes(flat, comm, chosen),
                   algorithm=chosen, requested=algorithm)
    return buf
