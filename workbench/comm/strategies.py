"""Gradient communication as composable strategies (GradientFlow), in PyTorch DDP's words.

The :class:`GradientReducer` only buckets, overlaps and waits: it cuts the flat gradient pool
into buckets (fusion), hands each bucket to a communication hook as soon as backward has
produced it (overlap) and waits for what is still in flight before the optimizer step. Everything
else is a hook with its own state (:mod:`workbench.comm.hooks`): the dense all-reduce, CSC, and
wire precision as a wrapper around either, or a user's hook (``RunConfig(comm_hook=...)``). The
strategies compose in one order:

    fusion, overlap (GradientReducer)  ->  wire precision (wire_precision)  ->  CSC or dense (the hook)
    ->  iallreduce (Wire)

- **fusion**: parameters in backward order (the reverse of registration order) are cut into
  buckets of at least ``fusion_bytes`` bytes; each bucket is contiguous in the pool because
  the pool is laid out in registration order. Buckets are issued strictly in index order, so
  every rank issues the same all-reduces in the same order.
- **overlap**: ``register_post_accumulate_grad_hook`` marks a parameter ready; a bucket whose
  parameters are all ready is issued from inside backward, and every hook call advances the
  nonblocking all-reduces in flight (:func:`workbench.comm.nonblocking.progress`).
- **wire precision** (:func:`~workbench.comm.precision.wire_precision`): fp16 / bf16 copies travel,
  pre-divided by the rank count (fp16 also multiplied by a dynamic loss scale); with
  ``native``/``auto`` both run the ``ring`` schedule (MPI has no bf16 sum, MPICH's fp16 sum is
  slow), whose every step's partial sum is rounded; an overflow on any rank makes every rank
  skip the step: the decision is all-reduced (one float, counted as a message).
- **CSC** (:func:`~workbench.comm.csc.csc_hook`, coarse-grained sparse communication): per
  bucket, chunks of ``sparse_chunk`` elements; the chunks' L1 norms are all-reduced; every rank
  selects the same top ``ceil(ratio * K)`` chunks (ties by lower index: a stable sort) and
  all-reduces only those, packed; the rest stays in a residual; momentum correction
  accumulates momentum before the selection and clears the sent chunks in both buffers
  (momentum factor masking).

Byte accounting: every message adds this rank's bytes on the wire to ``reducer.traffic.wire_bytes``
(:class:`~workbench.comm.hooks.Traffic`, the run's one byte counter), and what dense fp32 with the
same collective would have sent for the same buckets to ``reducer.traffic.dense_wire_bytes``.
"""
from __future__ import annotations

import torch
from mpi4py import MPI

from ..deadline import Deadline
from .buckets import bucket_bounds
from .csc import CSCState, csc_hook
from .hooks import GradBucket, Hook, HookState, Traffic, Wire, Work, allreduce_hook, dense_bytes, unwrap  # noqa: F401
from .nonblocking import progress
from .options import Communication
from .precision import BACKOFF, GROWTH_INTERVAL, INITIAL_LOSS_SCALE, PrecisionState, wire_precision  # noqa: F401

#: name -> hook: the dense all-reduce and coarse-grained sparse communication;
#: wire precision wraps either (:func:`~workbench.comm.precision.wire_precision`), fusion and
#: overlap go around them (the reducer)
HOOKS: dict[str, Hook] = {"allreduce": allreduce_hook, "csc": csc_hook}


def hook_name(options: Communication) -> str:
    """The registered hook the options call for."""
    return "csc" if options.sparse else "allreduce"


def make_hook(options: Communication, grad: torch.Tensor, momentum: float = 0.0,
              hook: Hook | None = None) -> tuple[Hook, HookState]:
    """The hook and state a run's options call for: ``hook`` (a user's, with a plain
    :class:`HookState`) or the registered one, wrapped in :func:`wire_precision` when the wire
    dtype is fp16/bf16."""
    if hook is not None and options.sparse:
        raise ValueError("comm_hook replaces the built-in hooks: it cannot be combined with sparse_ratio "
                         "(coarse-grained sparse communication is a hook itself)")
    if hook is None:
        hook = HOOKS[hook_name(options)]
    state: HookState = CSCState(grad, options, momentum) if hook is csc_hook else HookState()
    if options.wire_dtype != "fp32":
        return wire_precision(hook), PrecisionState(state, options.wire_dtype)
    return hook, state


class GradientReducer:
    """Buckets, overlaps and waits for one model's flat gradient pool (see the module docstring).

    ``hook`` and ``state``: the communication hook and its state (DDP's ``register_comm_hook(state,
    hook)``); by default the ones ``options`` call for (:func:`~workbench.comm.strategies.make_hook`:
    dense or CSC, in wire precision when the wire dtype is fp16/bf16). A ``hook`` without a
    ``state`` gets a plain :class:`~workbench.comm.hooks.HookState`, wrapped in wire precision
    like the built-in ones. ``options`` give the buckets (``fusion_bytes``) and ``overlap``.

    Per step: :meth:`start` (before backward), backward (the hook is called for each bucket as
    soon as it is ready, when ``overlap``), :meth:`finish` (issues the rest, waits; returns False
    when the step must be skipped). After :meth:`finish`, ``grad`` holds the sum over ranks of
    what was sent; :attr:`traffic` counts what went on the wire.
    """

    def __init__(self, params: list[torch.nn.Parameter], bounds: list[tuple[int, int]], grad: torch.Tensor,
                 comm: MPI.Comm, collective: str, options: Communication, momentum: float = 0.0,
                 timeout: float | None = None, hook: Hook | None = None, state: HookState | None = None,
                 traffic: Traffic | None = None) -> None:
        self.grad, self.options, self.timeout = grad, options, timeout
        if state is None:
            hook, state = make_hook(options, grad, momentum, hook)
        self.hook, self.state = hook, state
        self.traffic = traffic if traffic is not None else Traffic()  # the rank's one counter (Communicator.traffic)
        self.wire = Wire(comm, collective, self.traffic)
        self.buckets = [GradBucket(i, a, b, ps, grad[a:b], self.wire)
                        for i, (a, b, ps) in enumerate(bucket_bounds(bounds, options.fusion_bytes))]
        self._bucket_of = {p: b.index for b in self.buckets for p in b.params}
        self._missing = [len(b.params) for b in self.buckets]
        self._issued: list[Work] = []
        self._hooks = []
        if options.overlap:
            for index, param in enumerate(params):
                self._hooks.append(param.register_post_accumulate_grad_hook(
                    lambda _p, index=index: self._ready(index)))

    @property
    def csc(self) -> CSCState | None:
        """CSC's state, when the hook is CSC (wrapped or not)."""
        return unwrap(self.state, CSCState)

    @property
    def momentum_in_communication(self) -> bool:
        """CSC with momentum correction: the sent sum already carries momentum, so the optimizer
        applies it without momentum of its own."""
        csc = self.csc
        return csc is not None and csc.momentum_correction

    def start(self) -> None:
        """Arm the buckets for one step (CSC's ratio: set ``csc.ratio`` first)."""
        self.state.begin_step()
        self._missing = [len(b.params) for b in self.buckets]
        self._issued = []

    def _ready(self, index: int) -> None:
        bucket = self._bucket_of[index]
        self._missing[bucket] -= 1
        self._issue_ready()
        progress(self.wire.comm)

    def _issue_ready(self, everything: bool = False) -> None:
        while len(self._issued) < len(self.buckets):
            bucket = self.buckets[len(self._issued)]
            if not everything and self._missing[bucket.index] > 0:
                return
            self._issued.append(self.hook(self.state, bucket))

    def finish(self) -> bool:
        """Issue the buckets not issued yet, wait for all; True to apply the step, False when the
        hook's state says every rank skips it (a wire overflow on some rank)."""
        self._issue_ready(everything=True)
        deadline = Deadline(self.timeout)
        for work in self._issued:
            work.wait(deadline.left())
        applied = self.state.decide(self.wire, deadline)
        self.state.settle(applied)
        if not applied:
            self.traffic.skipped_steps += 1
        return applied

    def reduce(self) -> bool:
        """:meth:`start` then :meth:`finish`, for a gradient already computed (no overlap)."""
        self.start()
        return self.finish()

    def close(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
