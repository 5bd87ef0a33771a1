"""Gradient-communication hooks, as PyTorch DDP has them: ``hook(state, bucket) -> Work``.

A **bucket** (:class:`GradBucket`) is a contiguous slice of the flat gradient pool, with the
:class:`Wire` its messages travel on. A **hook** starts the bucket's reduction and returns a
:class:`Work` at once; when the work is done ``bucket.buffer`` holds the *sum over ranks*. Each
hook has its own **state** object (DDP's ``PowerSGDState`` in spirit), a :class:`HookState`:

- :func:`allreduce_hook` with a plain :class:`HookState`: the whole bucket, dense;
- :func:`~workbench.comm.csc.csc_hook` with a :class:`~workbench.comm.csc.CSCState`:
  coarse-grained sparse communication (chunk norms, the top chunks, the residual, momentum
  correction and the ratio of the step);
- :func:`~workbench.comm.precision.wire_precision` wraps **any** hook (DDP's
  ``fp16_compress_wrapper``): its :class:`~workbench.comm.precision.PrecisionState` holds the
  wire dtype, fp16's dynamic loss scale and the overflow flag, and the wrapped hook's own state
  (``state.inner``). The wrapped hook's payload travels in fp16/bf16, pre-divided by the rank
  count (fp16 also multiplied by the loss scale); its control messages (CSC's norms) stay
  float32. An overflow on any rank makes every rank skip the step: one all-reduced float decides.

The registry of the built-in hooks and the hook a run's options call for
(:func:`~workbench.comm.strategies.make_hook`) are in :mod:`workbench.comm.strategies`; a user's
hook is named ``"module:function"`` (:mod:`workbench.comm.hookspec`).

A state's step lifecycle, which :class:`~workbench.comm.strategies.GradientReducer` drives:
:meth:`HookState.begin_step` before the step's buckets, :meth:`HookState.decide` once every
bucket is back (whether the step applies, the same on every rank), :meth:`HookState.settle`
after the decision. The defaults do nothing and apply every step.

**Work** is a handle in flight and a flat list of continuations (:meth:`Work.then`), each run
when the message before it is back; a continuation may start the next message (CSC's norms,
then its chunks, then fp16's decompression: one list, never nested).

**Byte accounting**: every message adds the bytes this rank puts on the wire to
:attr:`Traffic.wire_bytes`, and what dense fp32 with the same collective would have sent for
the same buckets to :attr:`Traffic.dense_wire_bytes` (:meth:`Wire.allreduce`).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable

import torch
from mpi4py import MPI

from ..deadline import Deadline, poll
from .implementations import message_wire_bytes
from .names import AUTO, NATIVE
from .nonblocking import Handle, iallreduce

_HALF = (torch.float16, torch.bfloat16)


@dataclass
class Traffic:
    """This rank's communication counters: the one byte counter of a run (kept with telemetry
    on or off; ``summary.json``'s ``wire_bytes`` and ``bytes_sent`` are made from it).

    Attributes:
        wire_bytes: bytes this rank put on the wire (every message: payloads, CSC's norms, the
            overflow decision).
        dense_wire_bytes: what dense fp32 with the same collective would have sent.
        messages: all-reduce calls issued.
        skipped_steps: steps every rank skipped (a wire overflow).
    """

    wire_bytes: int = 0
    dense_wire_bytes: int = 0
    messages: int = 0
    skipped_steps: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"wire_bytes": self.wire_bytes, "dense_wire_bytes": self.dense_wire_bytes,
                "messages": self.messages, "skipped_steps": self.skipped_steps}


def dense_bytes(elements: int, comm: MPI.Comm, algorithm: str) -> int:
    """Bytes this rank sends to all-reduce ``elements`` float32 values with ``algorithm``."""
    if comm.Get_size() == 1 or elements == 0:
        return 0
    return message_wire_bytes(elements, 4, comm, algorithm)


def wire_collective(collective: str, dtype) -> str:
    """The collective a message of ``dtype`` (torch or numpy) runs where ``collective`` was asked for:
    fp16/bf16 run ``ring`` where ``native`` or ``auto`` was (see :class:`Wire`); anything else as asked."""
    return "ring" if dtype in _HALF and collective in (AUTO, NATIVE) else collective


class Work:
    """A reduction in flight: the message on the wire now and a flat list of continuations.

    A continuation runs when the message before it is back; it may return a further
    :class:`Work` (the next message), whose own continuations then run before the rest of the
    list (anything else it returns is ignored: ``lambda: bucket.buffer.mul_(0.5)`` will do).
    ``wait()`` returns nothing: the result is where the hook said it would be."""

    __slots__ = ("handle", "_then")

    def __init__(self, handle: Handle | None = None) -> None:
        self.handle = handle
        self._then: deque[Callable[[], Work | None]] = deque()

    def then(self, step: Callable[[], "Work | None"]) -> "Work":
        """Run ``step`` once everything before it is done; returns this work (chainable)."""
        self._then.append(step)
        return self

    def test(self) -> bool:
        """Advance; True when the message and every continuation are done."""
        while True:
            if self.handle is not None and not self.handle.test():
                return False
            if not self._then:
                self.handle = None
                return True
            nxt = self._then.popleft()()
            self.handle = None
            if isinstance(nxt, Work):  # splice: its message now, its continuations before ours
                self.handle = nxt.handle
                self._then.extendleft(reversed(nxt._then))

    def wait(self, timeout: float | None = None) -> None:
        # yields the CPU between tries: let the peers we wait for run (cnn: 8.9 -> 7.0 ms/step)
        poll(self.test, timeout, lambda: TimeoutError(
            f"rank {MPI.COMM_WORLD.Get_rank()}: a gradient bucket's all-reduce did not complete within "
            f"{timeout} s ({self.handle!r})"))


class Wire:
    """How messages travel: the communicator, the collective, and the :class:`Traffic` counter
    every message is counted in. fp16/bf16 tensors run ``ring`` where ``native`` or ``auto`` was
    asked for: MPI has no bf16 sum, and MPICH sums fp16 in software, many times slower than fp32,
    while the ring adds through torch (benchmarks/README.md, "Gradient communication against DDP")."""

    def __init__(self, comm: MPI.Comm, collective: str, traffic: Traffic | None = None) -> None:
        self.comm, self.collective = comm, collective
        self.traffic = traffic if traffic is not None else Traffic()

    @property
    def size(self) -> int:
        return self.comm.Get_size()

    def allreduce(self, tensor: torch.Tensor, dense_elems: int | None = None, *,
                  collective: str | None = None) -> Work:
        """Start summing ``tensor`` (or a numpy array) over ranks in place; the tensor belongs to
        the message until its :class:`Work` is done (wire precision scales it in place first).
        ``dense_elems``: the dense fp32 equivalent of this message in elements (None: none of its
        own, e.g. a control message)."""
        collective = wire_collective(collective or self.collective, tensor.dtype)
        handle = iallreduce(tensor, self.comm, collective, narrow_bf16=tensor.dtype in _HALF)
        self.count(handle, dense_elems)
        return Work(handle)

    #: a control message (CSC's norms, the overflow decision): float32 on every wire
    control = allreduce

    def count(self, handle: Handle, dense_elems: int | None) -> None:
        traffic = self.traffic
        traffic.messages += 1
        traffic.wire_bytes += handle.wire_bytes
        if dense_elems is not None:
            traffic.dense_wire_bytes += dense_bytes(dense_elems, self.comm, self.dense_algorithm(handle))

    def count_dense(self, elements: int, handle: Handle) -> None:
        """Add ``elements`` of dense fp32 to the dense equivalent, as ``handle``'s collective."""
        self.traffic.dense_wire_bytes += dense_bytes(elements, self.comm, self.dense_algorithm(handle))

    def dense_algorithm(self, handle: Handle) -> str:
        """The collective dense fp32 would run: the run's own, or what ``auto`` chose for this
        message (a half-precision wire runs ``ring`` where ``native`` was asked for)."""
        return handle.algorithm if self.collective == AUTO else self.collective


@dataclass
class GradBucket:
    """One bucket: ``buffer`` is ``pool[start:stop]``; ``params`` the parameter indices in it
    (backward order); ``wire`` what its messages travel on."""

    index: int
    start: int
    stop: int
    params: tuple[int, ...]
    buffer: torch.Tensor
    wire: Wire

    @property
    def numel(self) -> int:
        return self.stop - self.start


class HookState:
    """A hook's state: the step lifecycle, which does nothing here (the plain all-reduce's state,
    and a user hook's, which may keep what it likes on it)."""

    def begin_step(self, may_skip: bool = False) -> None:
        """Before the step's first bucket. ``may_skip``: :meth:`settle` may say the step was
        skipped (a wrapper that can skip asks its inner state to keep what it needs to undo)."""

    def decide(self, wire: Wire, deadline: Deadline) -> bool:
        """Once every bucket is back: whether every rank applies this step."""
        return True

    def settle(self, applied: bool) -> None:
        """After the decision."""


#: a hook: ``hook(state, bucket) -> Work`` starts the bucket's reduction; when the work is done
#: ``bucket.buffer`` holds the sum over ranks (DDP's ``register_comm_hook`` contract, with our Work
#: for its future)
Hook = Callable[[HookState, GradBucket], Work]


def allreduce_hook(state: HookState, bucket: GradBucket) -> Work:
    """Dense: the whole bucket (DDP's ``default_hooks.allreduce_hook``)."""
    return bucket.wire.allreduce(bucket.buffer, bucket.numel)


def unwrap(state: HookState, kind: type) -> HookState | None:
    """The state of type ``kind`` in ``state`` or the states it wraps (None if there is none)."""
    while state is not None:
        if isinstance(state, kind):
            return state
        state = getattr(state, "inner", None)
    return None
