"""Gradient communication as composable strategies (GradientFlow), in PyTorch DDP's words.

A **bucket** (:class:`GradBucket`) is a contiguous slice of the flat gradient pool
(:class:`workbench.models.FlatParams` lays every gradient out in one tensor). A **hook** is a
function ``hook(state, bucket) -> Work`` with a plain state object (:class:`CommState`): it
starts the bucket's reduction and returns at once; ``work.wait()`` leaves the *sum over ranks*
in ``bucket.buffer``. The :class:`GradientReducer` forms the buckets (fusion), fires the hook for
each bucket as soon as backward has produced it (overlap) and waits for what is still in flight
before the optimizer step. The strategies compose in one order:

    fusion (GradientReducer)  ->  CSC (csc_hook)  ->  wire precision (reduce_tensor)  ->  iallreduce

- **fusion**: parameters in backward order (the reverse of registration order) are cut into
  buckets of at least ``fusion_bytes`` bytes; each bucket is contiguous in the pool because
  the pool is laid out in registration order. Buckets are issued strictly in index order, so
  every rank issues the same all-reduces in the same order.
- **overlap**: ``register_post_accumulate_grad_hook`` marks a parameter ready; a bucket whose
  parameters are all ready is issued from inside backward, and every hook call advances the
  nonblocking all-reduces in flight (:func:`workbench.comm.nonblocking.progress`).
- **wire precision**: fp16 / bf16 copies travel, pre-divided by the rank count (fp16 also
  multiplied by a dynamic loss scale); with ``native``/``auto`` both run the ``ring`` schedule
  (MPI has no bf16 sum, MPICH's fp16 sum is slow), whose every step's partial sum is rounded; an overflow on any rank makes every rank skip the step:
  the decision is all-reduced (one float, counted as a message).
- **CSC** (coarse-grained sparse communication): per bucket, chunks of ``sparse_chunk``
  elements; the chunks' L1 norms are all-reduced; every rank selects the same top
  ``ceil(ratio * K)`` chunks (ties by lower index: a stable sort) and all-reduces only those,
  packed; the rest stays in a residual; momentum correction accumulates momentum before the
  selection and clears the sent chunks in both buffers (momentum factor masking).

Byte accounting: every message adds this rank's bytes on the wire to ``state.wire_bytes``
(:func:`workbench.comm.implementations.bytes_sent`), and what dense fp32 with the same
collective would have sent for the same buckets to ``state.dense_wire_bytes``.
"""
from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
from mpi4py import MPI

from .buckets import bucket_bounds  # noqa: F401 - the buckets' one home, named here too
from .implementations import sent_bytes
from .names import AUTO, NATIVE
from ..deadline import Deadline, poll
from .nonblocking import Handle, iallreduce, progress
from .options import Communication

#: fp16 dynamic loss scaling: the first scale, the factor on overflow, and how many good steps
#: before the scale doubles (apex/torch.amp use 2**16 and 2000; our gradients are pre-divided
#: by the rank count and smaller, and runs are short)
INITIAL_LOSS_SCALE = 2.0 ** 12
BACKOFF = 0.5
GROWTH_INTERVAL = 200


@dataclass
class GradBucket:
    """One bucket: ``buffer`` is ``pool[start:stop]``; ``params`` the parameter indices in it
    (backward order)."""

    index: int
    start: int
    stop: int
    params: tuple[int, ...]
    buffer: torch.Tensor

    @property
    def numel(self) -> int:
        return self.stop - self.start


@dataclass
class CommState:
    """Everything the hooks share: the communicator, the options and the counters.

    Attributes:
        wire_bytes: bytes this rank put on the wire (all messages, CSC norms and the overflow
            decision included).
        dense_wire_bytes: what dense fp32 would have sent for the same buckets and collective.
        messages: all-reduce calls issued.
        ratio: CSC's selection ratio for the current step (set by the reducer).
        loss_scale: fp16's dynamic loss scale.
        mask_momentum: CSC momentum correction clears the sent chunks in ``u`` too (DGC's
            momentum factor masking); off during a dense warm-up, so that it is momentum SGD.
    """

    comm: MPI.Comm
    collective: str
    options: Communication
    momentum: float = 0.0
    timeout: float | None = None
    wire_bytes: int = 0
    dense_wire_bytes: int = 0
    messages: int = 0
    skipped_steps: int = 0
    ratio: float = 1.0
    loss_scale: float = INITIAL_LOSS_SCALE
    good_steps: int = 0
    mask_momentum: bool = True
    overflow: bool = False
    u: torch.Tensor | None = None  # CSC momentum (momentum correction)
    v: torch.Tensor | None = None  # CSC accumulator: the residual
    selection_digest: str = ""     # sha256 over every CSC selection so far (the same on every rank)
    #: CSC: (u, v, sent mask) of the buckets sent this step, cleared by :meth:`settle`
    pending: list = field(default_factory=list)
    _digest: "hashlib._Hash" = field(default_factory=hashlib.sha256, repr=False)

    @property
    def size(self) -> int:
        return self.comm.Get_size()

    def settle(self, applied: bool) -> None:
        """CSC after the step's decision: what was sent leaves the residual (and, with momentum
        masking, the momentum); without a residual everything unsent is dropped. A skipped step
        (a wire overflow) clears nothing here; the reducer puts u and v back as they were before
        the step (:meth:`GradientReducer.finish`): the residual from earlier steps is sent later,
        the skipped step's own gradient is dropped, as a dense skip drops it."""
        if applied:
            for u, v, sent in self.pending:
                if self.options.residual:
                    v.masked_fill_(sent, 0.0)
                else:
                    v.zero_()
                if self.options.momentum_correction and self.mask_momentum:
                    u.masked_fill_(sent, 0.0)
        self.pending.clear()

    def count(self, handle: Handle, dense_elems: int | None) -> None:
        """Count one message: ``handle``'s bytes on the wire; the dense-fp32 equivalent of
        ``dense_elems`` elements (None: this message has no dense equivalent of its own)."""
        self.messages += 1
        self.wire_bytes += handle.bytes_sent
        if dense_elems is not None:
            self.dense_wire_bytes += dense_bytes(dense_elems, self.comm, self.dense_algorithm(handle))

    def dense_algorithm(self, handle: Handle) -> str:
        """The collective dense fp32 would run: the run's own, or what ``auto`` chose for this
        message (bf16 on the wire runs ``ring`` where ``native`` was asked for: not the dense one)."""
        return handle.algorithm if self.collective == AUTO else self.collective


def dense_bytes(elements: int, comm: MPI.Comm, algorithm: str) -> int:
    """Bytes this rank sends to all-reduce ``elements`` float32 values with ``algorithm``."""
    if comm.Get_size() == 1 or elements == 0:
        return 0
    return sent_bytes(elements, 4, comm, algorithm)


class Work:
    """A reduction in flight: a nonblocking handle and what to do when it completes (which may
    start the next phase: CSC's norms, then its chunks). ``wait()`` returns nothing; the
    result is where the hook said it would be."""

    def __init__(self, handle: Handle | None, then: Callable[[], "Work | None"] | None = None) -> None:
        self.handle, self.then = handle, then

    def test(self) -> bool:
        """Advance; True when every phase is complete."""
        while True:
            if self.handle is not None and not self.handle.test():
                return False
            if self.then is None:
                return True
            then, self.then = self.then, None
            nxt = then()
            if nxt is None:
                self.handle = None
                return True
            self.handle, self.then = nxt.handle, nxt.then

    def wait(self, timeout: float | None = None) -> None:
        # yields the CPU between tries: let the peers we wait for run (cnn: 8.9 -> 7.0 ms/step)
        poll(self.test, timeout, lambda: TimeoutError(
            f"rank {self.handle.comm.Get_rank()}: a gradient bucket's all-reduce did not complete within "
            f"{timeout} s ({self.handle!r})"))


def reduce_tensor(state: CommState, tensor: torch.Tensor, dense_elems: int | None,
                  then: Callable[[], "Work | None"] | None = None) -> Work:
    """Start summing the float32 ``tensor`` over ranks in place, in the wire dtype; ``then`` runs
    after the sum is back in ``tensor``."""
    opts, p = state.options, state.size
    if opts.wire_dtype == "fp32":
        handle = iallreduce(tensor, state.comm, state.collective)
        state.count(handle, dense_elems)
        return Work(handle, then)
    scale = state.loss_scale if opts.wire_dtype == "fp16" else 1.0
    wire = (tensor * (scale / p)).to(getattr(torch, opts.wire_torch_dtype))
    if not torch.isfinite(wire).all():
        state.overflow = True  # this rank's values do not fit: every rank will skip (finish())
    # MPI has no bf16 sum and MPICH sums fp16 in software (1.1M elements: 27.8 ms against 2.8 ms
    # in fp32): half-precision wires run the ring schedule, which adds through torch (1.7 ms)
    collective = "ring" if state.collective in (AUTO, NATIVE) else state.collective
    handle = iallreduce(wire, state.comm, collective, narrow_bf16=True)
    state.count(handle, dense_elems)

    def back() -> Work | None:
        tensor.copy_(wire.to(tensor.dtype) * (p / scale))
        if not torch.isfinite(tensor).all():
            state.overflow = True
        return then() if then is not None else None
    return Work(handle, back)


def allreduce_hook(state: CommState, bucket: GradBucket) -> Work:
    """Dense: the whole bucket, in the wire dtype."""
    return reduce_tensor(state, bucket.buffer, bucket.numel)


def csc_hook(state: CommState, bucket: GradBucket) -> Work:
    """Coarse-grained sparse communication of one bucket (see the module docstring)."""
    opts, g = state.options, bucket.buffer
    part = slice(bucket.start, bucket.stop)
    u, v = state.u[part], state.v[part]
    if opts.momentum_correction:
        u.mul_(state.momentum).add_(g)
        if opts.residual:
            v.add_(u)
        else:
            v.copy_(u)
    elif opts.residual:
        v.add_(g)
    else:
        v.copy_(g)
    n, c = bucket.numel, opts.sparse_chunk
    chunks = -(-n // c)
    if n == 0:
        return Work(None)
    padded = torch.zeros(chunks * c, dtype=v.dtype)
    padded[:n] = v
    rows = padded.view(chunks, c)

    def send(selected: torch.Tensor) -> Work:
        state._digest.update(bucket.index.to_bytes(4, "little") + selected.numpy().astype(np.int64).tobytes())
        state.selection_digest = state._digest.hexdigest()
        packed = rows[selected].reshape(-1)
        tail = chunks * c - n if selected.numel() and int(selected[-1]) == chunks - 1 else 0
        message = packed[:packed.numel() - tail] if tail else packed

        def unpack() -> None:
            out = torch.zeros(chunks * c, dtype=g.dtype)
            full = torch.zeros(selected.numel() * c, dtype=g.dtype)
            full[:message.numel()] = message
            out.view(chunks, c)[selected] = full.view(-1, c)
            g.copy_(out[:n])
            mask = torch.zeros(chunks, dtype=torch.bool)
            mask[selected] = True
            state.pending.append((u, v, mask.repeat_interleave(c)[:n]))  # cleared once the step applies
            return None
        return reduce_tensor(state, message, None, then=unpack)


    keep = chunks if state.ratio >= 1.0 else min(chunks, math.ceil(state.ratio * chunks))
    if keep == chunks:  # dense (warm-up or ratio 1): no norms to exchange
        work = send(torch.arange(chunks))
        state.dense_wire_bytes += dense_bytes(n, state.comm, state.dense_algorithm(work.handle))
        return work
    norms = rows.abs().sum(dim=1)
    norm_handle = iallreduce(norms, state.comm, state.collective)
    state.count(norm_handle, None)
    state.dense_wire_bytes += dense_bytes(n, state.comm, state.dense_algorithm(norm_handle))

    def select() -> Work:
        order = torch.sort(norms, descending=True, stable=True).indices  # ties: lower index first
        return send(torch.sort(order[:keep]).values)
    return Work(norm_handle, select)


#: a hook: ``hook(state, bucket) -> Work`` starts the bucket's reduction; when the work is done
#: ``bucket.buffer`` holds the sum over ranks (DDP's ``register_comm_hook`` contract, with our Work
#: for its future)
Hook = Callable[[CommState, GradBucket], Work]

#: name -> hook: the dense all-reduce and coarse-grained sparse communication; wire precision
#: applies inside both (:func:`reduce_tensor`), fusion and overlap around them (the reducer)
HOOKS: dict[str, Hook] = {"allreduce": allreduce_hook, "csc": csc_hook}


def hook_name(options: Communication) -> str:
    """The registered hook the options call for."""
    return "csc" if options.sparse else "allreduce"


class GradientReducer:
    """Buckets, hooks and waits for one model's flat gradient pool (see the module docstring).

    Per step: :meth:`start` (before backward), backward (hooks issue buckets when ``overlap``),
    :meth:`finish` (issues the rest, waits; returns False when the step must be skipped).
    After :meth:`finish`, ``grad`` holds the sum over ranks of what was sent.
    """

    def __init__(self, params: list[torch.nn.Parameter], bounds: list[tuple[int, int]], grad: torch.Tensor,
                 comm: MPI.Comm, collective: str, options: Communication, momentum: float = 0.0,
                 timeout: float | None = None, hook: Hook | None = None) -> None:
        self.grad, self.options = grad, options
        self.state = CommState(comm, collective, options, momentum=momentum, timeout=timeout)
        if options.sparse:
            self.state.u, self.state.v = torch.zeros_like(grad), torch.zeros_like(grad)
        # CSC with fp16/bf16: a skipped step must leave u and v as they were before it (a
        # non-finite value kept in u, which ratio 1 never clears, would skip every later step)
        self._saved = ((torch.empty_like(grad), torch.empty_like(grad))
                       if options.sparse and options.wire_dtype != "fp32" else None)
        self.buckets = [GradBucket(i, a, b, ps, grad[a:b])
                        for i, (a, b, ps) in enumerate(bucket_bounds(bounds, options.fusion_bytes))]
        self.hook = hook if hook is not None else HOOKS[hook_name(options)]  # a custom hook, like DDP's
        self._bucket_of = {p: b.index for b in self.buckets for p in b.params}
        self._missing = [len(b.params) for b in self.buckets]
        self._issued: list[Work] = []
        self._hooks = []
        if options.overlap:
            for index, param in enumerate(params):
                self._hooks.append(param.register_post_accumulate_grad_hook(
                    lambda _p, index=index: self._ready(index)))

    @property
    def momentum_in_communication(self) -> bool:
        """CSC with momentum correction: the sent sum already carries momentum, so the optimizer
        applies it without momentum of its own."""
        return self.options.sparse and self.options.momentum_correction

    def start(self, ratio: float = 1.0) -> None:
        """Arm the buckets for one step; ``ratio``: CSC's selection ratio this step."""
        self.state.ratio = ratio
        self.state.mask_momentum = ratio < 1.0
        self.state.overflow = False
        if self._saved is not None:
            self._saved[0].copy_(self.state.u)
            self._saved[1].copy_(self.state.v)
        self._missing = [len(b.params) for b in self.buckets]
        self._issued = []

    def _ready(self, index: int) -> None:
        bucket = self._bucket_of[index]
        self._missing[bucket] -= 1
        self._issue_ready()
        progress(self.state.comm)

    def _issue_ready(self, everything: bool = False) -> None:
        while len(self._issued) < len(self.buckets):
            bucket = self.buckets[len(self._issued)]
            if not everything and self._missing[bucket.index] > 0:
                return
            self._issued.append(self.hook(self.state, bucket))

    def finish(self) -> bool:
        """Issue the buckets not issued yet, wait for all; True to apply the step, False when a
        wire overflow on any rank makes every rank skip it (fp16's loss scale then halves, and
        CSC's momentum and residual are put back as they were at :meth:`start`)."""
        self._issue_ready(everything=True)
        timeout = self.state.timeout
        deadline = Deadline(timeout)
        for work in self._issued:
            work.wait(deadline.left())
        applied = self._decide(timeout)
        self.state.settle(applied)
        return applied

    def _decide(self, timeout: float | None) -> bool:
        """Whether every rank applies this step: always in fp32; with fp16/bf16 on the wire, no
        rank saw an overflow (one all-reduced float), and fp16's loss scale adapts."""
        if self.options.wire_dtype == "fp32":
            return True
        flag = np.array([1.0 if self.state.overflow else 0.0], dtype=np.float32)
        decision = iallreduce(flag, self.state.comm, "native")
        self.state.count(decision, None)
        decision.wait(timeout)
        if flag[0] > 0:
            self.state.skipped_steps += 1
            if self._saved is not None:  # CSC's buffers as before the step: it did not happen
                self.state.u.copy_(self._saved[0])
                self.state.v.copy_(self._saved[1])
            self.state.good_steps = 0
            if self.options.wire_dtype == "fp16":
                self.state.loss_scale *= BACKOFF
            return False
        self.state.good_steps += 1
        if self.options.wire_dtype == "fp16" and self.state.good_steps % GROWTH_INTERVAL == 0:
            self.state.loss_scale *= 2.0
        return True

    def reduce(self, ratio: float = 1.0) -> bool:
        """:meth:`start` then :meth:`finish`, for a gradient already computed (no overlap)."""
        self.start(ratio)
        return self.finish()

    def close(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
