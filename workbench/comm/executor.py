"""Run any :class:`Schedule` over MPI, in place, on numpy arrays and CPU torch tensors.

Per step each rank posts all its receives (``Irecv``) and sends (``Isend``) on views of the
buffer as raw bytes, waits for all of them, then applies what arrived: that is the
pre-step read semantics of a Schedule. Reductions land in a reusable workspace first and are
added afterwards; copies go straight into the buffer when no send of the same step reads
that region. Transfers of adjacent chunks between the same pair in one step travel as one
message. Nothing is pickled on this path. Posting a step (:func:`post_step`) and applying
it (:func:`finish_step`) are shared with the nonblocking all-reduce's per-handle state machine
(:mod:`~workbench.comm.nonblocking`).

A plan (per rank: byte ranges per step) is compiled once per (schedule, length, item size,
rank) and cached.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from itertools import groupby

import numpy as np
from mpi4py import MPI

from .buffers import FlatBuffer
from ..schedules.schedule import Schedule, chunk_bounds

def _free_inner(comm: MPI.Comm, keyval: int, inner) -> None:
    """MPI calls this when a communicator carrying state is freed: free an inner communicator
    (the executor's duplicate); other state (a Tuner) is only dropped."""
    if isinstance(inner, MPI.Comm):
        try:
            inner.Free()
        except MPI.Exception:  # MPI_Finalize may already be tearing things down
            pass


def state_key() -> int:
    """A new MPI attribute key whose values are freed with their communicator.

    Per-communicator state (the executor's private duplicate, the ``auto`` tuning table) is cached
    *on* the communicator with ``Set_attr`` rather than in a dict keyed by its handle: MPI reuses
    a freed communicator's handle for the next ``Split``/``Dup``, so a dict would hand a later
    run the earlier run's (freed, differently sized) state. Attributes die with their
    communicator; MPI calls :func:`_free_inner` then.
    """
    return MPI.Comm.Create_keyval(delete_fn=_free_inner)


def cached_on(comm: MPI.Comm, key: int, create):
    """The state cached on ``comm`` under ``key``, made by ``create(comm)`` on first use."""
    value = comm.Get_attr(key)
    if value is None:
        value = create(comm)
        comm.Set_attr(key, value)
    return value


_PRIVATE = state_key()


def private_comm(comm: MPI.Comm) -> MPI.Comm:
    """A duplicate of ``comm`` reserved for the executor (collective on first use).

    Our point-to-point messages then never match a user's messages on ``comm``. The duplicate
    lives as long as ``comm`` and is freed with it (an MPI attribute, see :func:`state_key`).
    """
    return cached_on(comm, _PRIVATE, MPI.Comm.Dup)


@dataclass(frozen=True)
class _Run:
    peer: int
    start: int  # element offsets into the flat buffer
    stop: int
    reduce: bool


@dataclass(frozen=True)
class _Step:
    sends: tuple[_Run, ...]
    recvs: tuple[_Run, ...]
    direct: tuple[bool, ...]  # per recv: copy straight into the buffer (no workspace)


@dataclass(frozen=True)
class Plan:
    """One rank's part of a schedule for one buffer length, in elements."""

    steps: tuple[_Step, ...]
    workspace_elems: int  # the most elements that arrive into the workspace in one step

    @property
    def sent_elems(self) -> int:
        """Elements this rank sends over the whole schedule."""
        return sum(r.stop - r.start for s in self.steps for r in s.sends)


def _runs(transfers, bounds, peer_of) -> list[_Run]:
    """Group transfers by (peer, reduce) and merge adjacent chunks into single messages.

    Sender and receiver run this on the same transfer list, so both sides post matching
    messages in the same order (MPI keeps messages between a pair in order).
    """
    out = []
    key = lambda t: (peer_of(t), t.reduce)  # noqa: E731
    for (peer, reduce), group in groupby(sorted(transfers, key=lambda t: (*key(t), t.chunk)), key):
        group = list(group)
        start, stop = bounds[group[0].chunk]
        prev = group[0].chunk
        for t in group[1:]:
            if t.chunk == prev + 1:
                stop = bounds[t.chunk][1]
            else:
                out.append(_Run(peer, start, stop, reduce))
                start, stop = bounds[t.chunk]
            prev = t.chunk
        out.append(_Run(peer, start, stop, reduce))
    return out


@lru_cache(maxsize=256)
def compile_plan(schedule: Schedule, length: int, rank: int) -> Plan:
    """Compile ``schedule`` into ``rank``'s message list for a buffer of ``length`` elements."""
    bounds = chunk_bounds(length, schedule.nchunks)
    steps, workspace = [], 0
    for step in schedule.steps:
        sends = _runs([t for t in step if t.src == rank], bounds, lambda t: t.dst)
        recvs = _runs([t for t in step if t.dst == rank], bounds, lambda t: t.src)
        direct = tuple(not r.reduce and not any(s.start < r.stop and r.start < s.stop for s in sends)
                       for r in recvs)
        workspace = max(workspace, sum(r.stop - r.start for r, d in zip(recvs, direct) if not d))
        steps.append(_Step(tuple(sends), tuple(recvs), direct))
    return Plan(tuple(steps), workspace)


class _Workspace:
    """A grow-only scratch buffer, so large all-reduces don't page-fault fresh memory each call."""

    def __init__(self) -> None:
        self.raw = np.empty(0, dtype=np.uint8)

    def get(self, nbytes: int) -> np.ndarray:
        if self.raw.nbytes < nbytes:
            self.raw = np.empty(nbytes, dtype=np.uint8)
        return self.raw


_workspace = _Workspace()


class LengthMismatchError(ValueError):
    """Ranks called a collective with buffers of different lengths or dtypes."""


def post_step(comm: MPI.Comm, step: _Step, data: np.ndarray, work: np.ndarray, item: int,
              tag: int = 0) -> tuple[list[MPI.Request], list[tuple[_Run, int]]]:
    """Post one step: its receives (``Irecv``), then its sends (``Isend``), all with ``tag``.

    ``data`` is the buffer as raw bytes, ``work`` a workspace of at least the plan's
    ``workspace_elems * item`` bytes, ``item`` the element size in bytes. Returns the requests
    (receives first, in ``step.recvs`` order, which :func:`finish_step` relies on) and the
    workspace slots ``(run, byte offset)`` that :func:`finish_step` applies.
    """
    requests, slots, offset = [], [], 0
    for run, direct in zip(step.recvs, step.direct):
        nbytes = (run.stop - run.start) * item
        if direct:
            target = data[run.start * item: run.stop * item]
        else:
            target = work[offset: offset + nbytes]
            slots.append((run, offset))
            offset += nbytes
        requests.append(comm.Irecv([target, MPI.BYTE], source=run.peer, tag=tag))
    for run in step.sends:
        requests.append(comm.Isend([data[run.start * item: run.stop * item], MPI.BYTE],
                                   dest=run.peer, tag=tag))
    return requests, slots


def truncation_error(exc: MPI.Exception, rank: int, name: str, flat: FlatBuffer) -> LengthMismatchError | None:
    """The :class:`LengthMismatchError` that an MPI error while waiting on a step means, or
    ``None`` when it is not a truncated message (the caller re-raises ``exc`` then)."""
    if exc.Get_error_class() == MPI.ERR_TRUNCATE or exc.Get_error_class() == MPI.ERR_IN_STATUS:
        return LengthMismatchError(
            f"rank {rank}: a message longer than expected arrived in {name!r}: "
            f"ranks passed buffers of different lengths or dtypes (this rank: "
            f"{flat.length} x {flat.dtype_name})")
    return None


def finish_step(step: _Step, status: list[MPI.Status], slots: list[tuple[_Run, int]], flat: FlatBuffer,
                work: np.ndarray, rank: int, name: str) -> None:
    """After a step's requests completed: check every received size (``status`` in request
    order), then add (reduce) or copy what landed in the workspace into the buffer."""
    item, data = flat.itemsize, flat.bytes
    for run, st in zip(step.recvs, status):
        expected = (run.stop - run.start) * item
        got = st.Get_count(MPI.BYTE)
        if got != expected:
            raise LengthMismatchError(
                f"rank {rank}: expected {expected} bytes from rank {run.peer} in "
                f"{name!r} but got {got}: ranks passed buffers of different lengths "
                f"or dtypes (this rank: {flat.length} x {flat.dtype_name})")
    for run, offset in slots:
        nbytes = (run.stop - run.start) * item
        if run.reduce:
            flat.add_bytes(run.start, run.stop, work[offset: offset + nbytes])
        else:
            data[run.start * item: run.stop * item] = work[offset: offset + nbytes]


def execute(schedule: Schedule, flat: FlatBuffer, comm: MPI.Comm) -> None:
    """Run ``schedule`` on ``flat`` (a validated, contiguous :class:`FlatBuffer`) over ``comm``.

    ``comm`` should be a :func:`private_comm`. Raises :class:`LengthMismatchError` when a
    message of unexpected size arrives (ranks passed buffers of different lengths). Blocking
    runs use tag 0; the nonblocking ones (:mod:`~workbench.comm.nonblocking`) never do.
    """
    rank = comm.Get_rank()
    plan = compile_plan(schedule, flat.length, rank)
    item = flat.itemsize
    data = flat.bytes  # uint8 view of the whole buffer
    work = _workspace.get(plan.workspace_elems * item)
    status = [MPI.Status() for _ in range(64)]
    for step in plan.steps:
        requests, slots = post_step(comm, step, data, work, item)
        if len(status) < len(requests):
            status = [MPI.Status() for _ in requests]
        try:
            MPI.Request.Waitall(requests, status)
        except MPI.Exception as exc:
            mismatch = truncation_error(exc, rank, schedule.name, flat)
            if mismatch is None:
                raise
            raise mismatch from exc
        finish_step(step, status, slots, flat, work, rank, schedule.name)
