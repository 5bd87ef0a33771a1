"""``allreduce(buf, comm=None, algorithm="auto")``: sum a buffer in place across ranks.

``algorithm`` is a schedule name (:data:`schedules.ALGORITHMS`), ``"native"`` (the MPI
library's ``MPI_Allreduce``) or ``"auto"``. ``auto`` follows Horovod's ordered list of
implementations: native first, and a schedule only where the tuning table
(:mod:`workbench.collectives.tuning`) measured it clearly faster at that message size.
"""
from __future__ import annotations

import time
from typing import TypeVar

from mpi4py import MPI

from ..runtime import telemetry
from . import schedules
from .buffers import FlatBuffer
from .executor import compile_plan, execute, private_comm
from .names import AUTO, NATIVE, algorithm_names, check_algorithm  # noqa: F401 - re-exported
from .tuning import tuner_for

T = TypeVar("T")



def _native(flat: FlatBuffer, comm: MPI.Comm) -> None:
    if flat.array is not None:
        comm.Allreduce(MPI.IN_PLACE, flat.array)
    else:
        # This MPICH has no bfloat16 reduction: sum in float32 and round once at the end.
        wide = flat.tensor.float()
        comm.Allreduce(MPI.IN_PLACE, wide.numpy())
        flat.tensor.copy_(wide)


def run_algorithm(flat: FlatBuffer, comm: MPI.Comm, algorithm: str) -> None:
    """Run the named (non-``auto``) algorithm on a prepared buffer."""
    if algorithm == NATIVE:
        _native(flat, comm)
    else:
        execute(schedules.ALGORITHMS[algorithm](comm.Get_size()), flat, private_comm(comm))


def _bytes_sent(flat: FlatBuffer, comm: MPI.Comm, algorithm: str) -> int:
    """Bytes this rank sent: exact for schedules; for native, a ring's 2(n-1)/n share."""
    n = comm.Get_size()
    if algorithm == NATIVE:
        return round(2 * (n - 1) / n * flat.length * flat.itemsize)
    plan = compile_plan(schedules.ALGORITHMS[algorithm](n), flat.length, comm.Get_rank())
    return plan.sent_elems * flat.itemsize


def allreduce(buf: T, comm: MPI.Comm | None = None, algorithm: str = AUTO) -> T:
    """Sum ``buf`` element-wise across all ranks of ``comm``, in place, and return it.

    Args:
        buf: a numpy array or torch tensor of any shape and length; dtype one of
            :data:`workbench.collectives.buffers.SUPPORTED_DTYPES`. Every rank passes
            the same length and dtype. Non-contiguous and non-CPU tensors are reduced in a
            staging copy and written back.
        comm: an mpi4py communicator (default ``MPI.COMM_WORLD``).
        algorithm: a schedule name, ``"native"`` or ``"auto"``.

    When a :mod:`workbench.runtime.telemetry` recorder is active, one ``comm`` span is
    recorded with the message size in bytes and the algorithm that ran.
    """
    check_algorithm(algorithm)
    flat = FlatBuffer(buf)
    comm = MPI.COMM_WORLD if comm is None else comm
    if comm.Get_size() == 1:
        return buf
    nbytes = flat.length * flat.itemsize
    chosen = algorithm
    if algorithm == AUTO:
        chosen = tuner_for(comm).choose(nbytes, flat.dtype_name)
    rec = telemetry.current()
    start = time.perf_counter_ns() if rec is not None else 0
    run_algorithm(flat, comm, chosen)
    flat.write_back()
    if rec is not None:
        rec.record(f"allreduce:{chosen}", "comm", start, time.perf_counter_ns(),
                   bytes=nbytes, bytes_sent=_bytes_sent(flat, comm, chosen), algorithm=chosen,
                   requested=algorithm)
    return buf

