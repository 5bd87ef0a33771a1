"""Nonblocking all-reduce: ``iallreduce(buf, comm, algorithm)`` returns a :class:`Handle` at once.

The foundation of the gradient-communication strategies: a tensor-fusion bucket is issued
while backward still runs, and the optimizer waits for it. ``native`` is the MPI library's
``MPI_Iallreduce``; a schedule runs as a per-handle state machine over the executor's compiled
plan (:func:`~workbench.comm.executor.compile_plan`): post one step's ``Irecv``/``Isend``
(:func:`~workbench.comm.executor.post_step`), and when ``Testall`` says they completed, apply
the step exactly as the blocking executor does (:func:`~workbench.comm.executor.finish_step`)
and post the next. Each handle owns its workspace, so handles in flight never share scratch.

Tags. Every handle of a communicator gets the next number of a per-communicator sequence
(state cached on the communicator, like the executor's private duplicate), mapped into
``1..MPI.TAG_UB``; ranks issue handles in the same order, so a handle has the same tag on
every rank and messages of different handles never match each other. The blocking executor
uses tag 0, so blocking and nonblocking runs share the private duplicate safely. (Tags wrap
after ``TAG_UB`` handles, 2**29-1 on MPICH: far more than are ever in flight at once.)

Progress is driven by the caller, never by a thread: :meth:`Handle.test`, :meth:`Handle.wait`
and :func:`progress` (which backward hooks call) advance *every* outstanding handle. That
avoids deadlock when ranks wait handles in different orders (rank 0 waits A while rank 1
waits B: each rank still moves both along), including handles on different communicators.
Why no progress thread: it would need ``MPI_THREAD_MULTIPLE`` (slower, and not granted by
every MPI build); it would contend for the GIL with the training thread, which costs most on
the few cores a rank has; and caller-driven progress is deterministic, so traces and bugs
reproduce.

Collective first uses: a communicator's first handle duplicates it (``private_comm``), and
``auto`` chooses with the same :func:`~workbench.comm.mpi_allreduce.choose` as the blocking
path, which times the candidates on a (dtype, size) bucket's first use. Those are blocking
collectives: every rank must reach them at the same point (issue in the same order, with the
same waits in between), or warm the size up with a blocking ``allreduce`` first.
"""
from __future__ import annotations

import time
import warnings
from typing import Any, Sequence

import numpy as np
from mpi4py import MPI

from .. import schedules, telemetry
from ..deadline import Deadline, poll
from .buffers import FlatBuffer
from .executor import (cached_on, compile_plan, finish_step, post_step, private_comm, state_key,
                       truncation_error)
from .implementations import buffer_wire_bytes, wire
from .mpi_allreduce import choose
from .names import AUTO, NATIVE, check_algorithm


class _CommState:
    """Per communicator: the tag sequence and its outstanding handles, in issue order."""

    def __init__(self, comm: MPI.Comm) -> None:
        ub = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)
        self.tag_ub: int = ub if isinstance(ub, int) and ub > 0 else 32767
        self.issued = 0
        self.active: list[Handle] = []

    def next_tag(self) -> int:
        """The next handle's tag, in ``1..tag_ub`` (0 is the blocking executor's)."""
        self.issued += 1
        return (self.issued - 1) % self.tag_ub + 1


_STATE = state_key()
_ACTIVE: list["Handle"] = []  # every outstanding handle of this process, in issue order


def _state(comm: MPI.Comm) -> _CommState:
    return cached_on(comm, _STATE, _CommState)


class Handle:
    """An all-reduce in flight (or one that needed no communication: ``done`` from the start).

    Attributes:
        buf: the caller's buffer, summed in place once :attr:`done`.
        algorithm: the algorithm that runs (``auto`` resolved).
        requested: the algorithm asked for.
        nbytes: message size in bytes (elements x element size).
        wire_bytes: bytes this rank sends (:func:`~workbench.comm.implementations.buffer_wire_bytes`).
        done: True once complete (or failed: :meth:`wait` then raises the error).
    """

    def __init__(self, buf: Any, flat: FlatBuffer, comm: MPI.Comm, algorithm: str, requested: str,
                 sent: int) -> None:
        self.buf, self.comm, self.algorithm, self.requested = buf, comm, algorithm, requested
        self.nbytes = flat.length * flat.itemsize
        self.wire_bytes = sent
        self.done = True
        self._flat = self._wide = flat  # _wide: what the messages carry (see implementations.wire)
        self._error: BaseException | None = None
        self._telemetry = None
        self._start_ns = 0

    @property
    def bytes_sent(self) -> int:
        """Deprecated (one release): :attr:`wire_bytes`."""
        warnings.warn("Handle.bytes_sent is now Handle.wire_bytes", DeprecationWarning, stacklevel=2)
        return self.wire_bytes

    def _issue(self) -> None:
        """Register as outstanding and make the first progress (posts the first messages)."""
        self.done = False
        self._telemetry = telemetry.current()
        self._start_ns = time.perf_counter_ns()
        _ACTIVE.append(self)
        _state(self.comm).active.append(self)
        self._progress()

    def _advance(self) -> bool:
        """Make progress without blocking; True when the reduction is complete."""
        return True

    def _release(self) -> None:
        """Drop pending MPI requests after a failure or a cancel (best effort)."""

    def _finish(self) -> None:
        """Write the result into the caller's buffer (bfloat16: rounded once, as ``wire`` does)."""
        if self._wide is not self._flat:
            self._flat.tensor.copy_(self._wide.tensor)
        self._flat.write_back()

    def _retire(self) -> None:
        self.done = True
        _ACTIVE.remove(self)
        _state(self.comm).active.remove(self)

    def _progress(self) -> None:
        if self.done:
            return
        try:
            if not self._advance():
                return
            self._finish()
        except Exception as exc:  # kept for this handle's wait(), not raised into another's
            self._error = exc
            self._release()
            self._retire()
            return
        self._retire()
        rec = self._telemetry
        if rec is not None:
            rec.record(f"iallreduce:{self.algorithm}", "comm", self._start_ns, time.perf_counter_ns(),
                       tid=telemetry.IN_FLIGHT_TID, bytes=self.nbytes, wire_bytes=self.wire_bytes,
                       algorithm=self.algorithm, requested=self.requested, dtype=self._flat.dtype_name)

    def test(self) -> bool:
        """Advance every outstanding handle; True when this one is complete.

        Raises the error this handle failed with (e.g. :class:`LengthMismatchError`)."""
        if not self.done:
            progress()
        if self._error is not None:
            raise self._error
        return self.done

    def wait(self, timeout: float | None = None) -> Any:
        """Complete this handle (advancing every outstanding one meanwhile) and return ``buf``.

        Args:
            timeout: seconds; ``None`` waits forever. On expiry raises :class:`TimeoutError`
                and the handle stays outstanding (wait again, or :meth:`cancel` it).
        """
        poll(self.test, timeout, lambda: TimeoutError(
            f"rank {self.comm.Get_rank()}: iallreduce:{self.algorithm} of {self.nbytes} bytes "
            f"({self._flat.dtype_name}, {self.wire_bytes} bytes to send) on a "
            f"{self.comm.Get_size()}-rank communicator did not complete within {timeout} s{self._where()}"))
        return self.buf

    def cancel(self) -> None:
        """Stop progressing this handle (after a timeout that will not be retried): its pending
        receives are cancelled and :meth:`wait` raises. The buffer holds partial sums. A
        ``native`` collective cannot be cancelled in MPI; it is only no longer waited for."""
        if not self.done:
            self._error = RuntimeError(f"iallreduce:{self.algorithm} of {self.nbytes} bytes was cancelled")
            self._release()
            self._retire()

    def _where(self) -> str:
        return ""

    def __repr__(self) -> str:
        state = "failed" if self._error is not None else "done" if self.done else "in flight"
        return f"<Handle iallreduce:{self.algorithm} {self.nbytes} bytes, {state}>"


class _NativeHandle(Handle):
    """``MPI_Iallreduce(IN_PLACE)`` on the private duplicate; bfloat16 in a float32 copy."""

    def __init__(self, buf: Any, flat: FlatBuffer, comm: MPI.Comm, requested: str, sent: int) -> None:
        super().__init__(buf, flat, comm, NATIVE, requested, sent)
        self._wide = wire(flat)
        self._request = private_comm(comm).Iallreduce(MPI.IN_PLACE, self._wide.array)
        self._issue()

    def _advance(self) -> bool:
        return self._request.Test()


class _ScheduleHandle(Handle):
    """One step of the compiled plan in flight at a time, on this handle's tag and workspace."""

    def __init__(self, buf: Any, flat: FlatBuffer, comm: MPI.Comm, algorithm: str, requested: str,
                 sent: int, narrow_bf16: bool = False) -> None:
        super().__init__(buf, flat, comm, algorithm, requested, sent)
        self._wide = flat if narrow_bf16 else wire(flat)
        self._pcomm = private_comm(comm)
        self._rank = comm.Get_rank()
        self._schedule = schedules.SCHEDULES[algorithm](comm.Get_size())
        self._plan = compile_plan(self._schedule, flat.length, self._rank)
        self._work = np.empty(self._plan.workspace_elems * self._wide.itemsize, dtype=np.uint8)
        self._tag = _state(comm).next_tag()
        self._index = 0  # the step in flight (or next to post)
        self._requests: list[MPI.Request] | None = None
        self._slots: list = []
        self._status: list[MPI.Status] = []
        self._issue()

    def _advance(self) -> bool:
        wide, steps = self._wide, self._plan.steps
        while True:
            if self._requests is None:
                if self._index == len(steps):
                    return True
                self._requests, self._slots = post_step(self._pcomm, steps[self._index], wide.bytes,
                                                        self._work, wide.itemsize, self._tag)
                self._status = [MPI.Status() for _ in self._requests]
            try:
                if not MPI.Request.Testall(self._requests, self._status):
                    return False
            except MPI.Exception as exc:
                mismatch = truncation_error(exc, self._rank, self._schedule.name, wide)
                if mismatch is None:
                    raise
                raise mismatch from exc
            self._requests = None
            finish_step(steps[self._index], self._status, self._slots, wide, self._work, self._rank,
                        self._schedule.name)
            self._index += 1

    def _release(self) -> None:
        for request in self._requests or ():
            try:
                if request:
                    request.Cancel()
                    request.Free()
            except MPI.Exception:
                pass
        self._requests = None

    def _where(self) -> str:
        return f" (step {self._index + 1} of {len(self._plan.steps)}, tag {self._tag})"


def iallreduce(buf: Any, comm: MPI.Comm | None = None, algorithm: str = AUTO, *,
               narrow_bf16: bool = False) -> Handle:
    """Start summing ``buf`` element-wise across the ranks of ``comm``, in place; return at once.

    Args:
        buf: a numpy array or torch tensor, as for :func:`~workbench.comm.allreduce`. Do not
            touch it until the handle is done. bfloat16 is summed in float32, rounded once.
        comm: an mpi4py communicator (default ``MPI.COMM_WORLD``).
        algorithm: a schedule name, ``"native"`` or ``"auto"`` (resolved now, as ``allreduce``
            does: collective on a size's first use, see the module docstring).

    ``narrow_bf16``: a bfloat16 buffer travels as bfloat16 (half the bytes; every step's partial
    sum is rounded to bfloat16: wire precision, :mod:`workbench.comm.strategies`). MPI has no
    bfloat16 sum, so ``native`` and ``auto`` then run ``ring``.

    Every rank issues the same handles in the same order. On one rank nothing runs: the handle
    is done at once (``algorithm`` is the requested one, ``native`` for ``auto``). When a
    :mod:`workbench.telemetry` recorder is active at issue, one ``comm`` span
    ``iallreduce:<algorithm>`` covers issue to completion.
    """
    check_algorithm(algorithm)
    flat = FlatBuffer(buf)
    comm = MPI.COMM_WORLD if comm is None else comm
    if comm.Get_size() == 1:
        return Handle(buf, flat, comm, NATIVE if algorithm == AUTO else algorithm, algorithm, 0)
    narrow = narrow_bf16 and flat.dtype_name == "bfloat16"
    if narrow and algorithm in (AUTO, NATIVE):
        chosen = "ring"
    else:
        chosen = choose(flat, comm) if algorithm == AUTO else algorithm
    sent = buffer_wire_bytes(flat, comm, chosen, narrow_bf16=narrow)
    if chosen == NATIVE:
        return _NativeHandle(buf, flat, comm, algorithm, sent)
    return _ScheduleHandle(buf, flat, comm, chosen, algorithm, sent, narrow_bf16=narrow)


def progress(comm: MPI.Comm | None = None) -> int:
    """Advance outstanding handles without blocking; return how many are still outstanding.

    ``comm=None`` advances every handle of this process (what :meth:`Handle.wait` does); a
    communicator advances only its handles. Cheap when nothing is outstanding: call it from
    backward hooks so buckets move along while gradients are computed.
    """
    handles = _ACTIVE if comm is None else _state(comm).active
    for handle in list(handles):
        handle._progress()
    return len(handles)


def waitall(handles: Sequence[Handle], timeout: float | None = None) -> list[Any]:
    """Wait for every handle (``timeout``: seconds for all of them together); return their buffers."""
    deadline = Deadline(timeout)
    for handle in handles:
        handle.wait(deadline.left())
    return [h.buf for h in handles]
