"""The all-reduce implementations ``allreduce`` can run, each a function ``(flat, comm)``.

``native`` is the MPI library's ``MPI_Allreduce``; every schedule name runs that
:class:`~workbench.schedules.Schedule` on the executor. The tuning table
(:mod:`~workbench.comm.tuning`) times these same functions, and ``auto``'s ordered list
(:mod:`~workbench.comm.mpi_allreduce`) picks among them: this module imports neither.

bfloat16 is summed in float32 by every implementation and rounded once at the end (this MPICH has
no bfloat16 reduction, and a schedule that added in bfloat16 would round after every step), so
the result does not depend on which implementation ``auto`` picks for a size.
"""
from __future__ import annotations

from typing import Callable

from mpi4py import MPI

from .. import schedules
from .buffers import FlatBuffer
from .executor import compile_plan, execute, private_comm
from .names import NATIVE

Implementation = Callable[[FlatBuffer, MPI.Comm], None]


def native(flat: FlatBuffer, comm: MPI.Comm) -> None:
    """``MPI_Allreduce`` in place."""
    comm.Allreduce(MPI.IN_PLACE, flat.array)


def _schedule(name: str) -> Implementation:
    generator = schedules.SCHEDULES[name]

    def run(flat: FlatBuffer, comm: MPI.Comm) -> None:
        execute(generator(comm.Get_size()), flat, private_comm(comm))
    run.__name__ = name
    run.__doc__ = f"The {name} schedule on the executor."
    return run


#: name -> implementation: ``native`` first, then every schedule that takes only a rank count
IMPLEMENTATIONS: dict[str, Implementation] = {NATIVE: native,
                                              **{name: _schedule(name) for name in schedules.SCHEDULES}}


def wire(flat: FlatBuffer) -> FlatBuffer:
    """The buffer the implementations add in: ``flat`` itself, or a float32 copy of a bfloat16 one."""
    return FlatBuffer(flat.tensor.float()) if flat.dtype_name == "bfloat16" else flat


def run_algorithm(flat: FlatBuffer, comm: MPI.Comm, algorithm: str) -> None:
    """Run the named implementation (not ``auto``) on a prepared buffer, in place."""
    wide = wire(flat)
    IMPLEMENTATIONS[algorithm](wide, comm)
    if wide is not flat:
        flat.tensor.copy_(wide.tensor)  # round once


def buffer_wire_bytes(flat: FlatBuffer, comm: MPI.Comm, algorithm: str, narrow_bf16: bool = False) -> int:
    """:func:`message_wire_bytes` of the buffer in hand: bfloat16 travels as float32 (see
    :func:`wire`) unless ``narrow_bf16``."""
    itemsize = 4 if flat.dtype_name == "bfloat16" and not narrow_bf16 else flat.itemsize
    return message_wire_bytes(flat.length, itemsize, comm, algorithm)


def message_wire_bytes(length: int, itemsize: int, comm: MPI.Comm, algorithm: str) -> int:
    """Wire bytes: what this rank sends to all-reduce ``length`` elements of ``itemsize`` bytes
    with ``algorithm``: exact for schedules; for native, a ring's 2(n-1)/n share."""
    n = comm.Get_size()
    if algorithm == NATIVE:
        return round(2 * (n - 1) / n * length * itemsize)
    plan = compile_plan(schedules.SCHEDULES[algorithm](n), length, comm.Get_rank())
    return plan.sent_elems * itemsize
