"""Coarse-grained sparse communication (GradientFlow's CSC) as a hook with its own state."""
from __future__ import annotations

import hashlib
import math

import numpy as np
import torch

from .hooks import GradBucket, HookState, Work
from .options import Communication


class CSCState(HookState):
    """CSC's state: per bucket, chunks of ``chunk`` elements; the chunks' L1 norms are
    all-reduced; every rank selects the same top ``ceil(ratio * K)`` chunks (ties by lower
    index: a stable sort) and all-reduces only those, packed; the rest stays in the residual
    ``v``; momentum correction accumulates momentum ``u`` before the selection and clears the
    sent chunks in both (momentum factor masking, off during a dense warm-up).

    Attributes:
        ratio: the selection ratio of the current step (set before :meth:`begin_step`).
        u, v: the momentum and the residual (accumulator), laid out like the gradient pool.
        selection_digest: sha256 over every selection so far (the same on every rank).
    """

    def __init__(self, grad: torch.Tensor, options: Communication, momentum: float = 0.0) -> None:
        self.chunk, self.momentum = options.sparse_chunk, momentum
        self.residual, self.momentum_correction = options.residual, options.momentum_correction
        self.ratio = 1.0
        self.mask_momentum = True
        self.u, self.v = torch.zeros_like(grad), torch.zeros_like(grad)
        self.selection_digest = ""
        self._digest = hashlib.sha256()
        self._pending: list = []  # (u, v, sent mask) of the buckets sent this step
        self._saved: tuple[torch.Tensor, torch.Tensor] | None = None

    def begin_step(self, may_skip: bool = False) -> None:
        self.mask_momentum = self.ratio < 1.0
        if may_skip:  # a skipped step must leave u and v as they were (an inf kept in u would
            if self._saved is None:  # make every later step overflow at ratio 1)
                self._saved = (torch.empty_like(self.u), torch.empty_like(self.v))
            self._saved[0].copy_(self.u)
            self._saved[1].copy_(self.v)

    def settle(self, applied: bool) -> None:
        """What was sent leaves the residual (and, with momentum masking, the momentum); without
        a residual everything unsent is dropped. A skipped step puts u and v back as they were:
        the residual from earlier steps is sent later, the skipped step's own gradient is
        dropped, as a dense skip drops it."""
        if applied:
            for u, v, sent in self._pending:
                if self.residual:
                    v.masked_fill_(sent, 0.0)
                else:
                    v.zero_()
                if self.momentum_correction and self.mask_momentum:
                    u.masked_fill_(sent, 0.0)
        elif self._saved is not None:
            self.u.copy_(self._saved[0])
            self.v.copy_(self._saved[1])
        self._pending.clear()

    def accumulate(self, bucket: GradBucket) -> tuple[torch.Tensor, torch.Tensor]:
        """Fold the bucket's gradient into u and v; returns their slices."""
        g, part = bucket.buffer, slice(bucket.start, bucket.stop)
        u, v = self.u[part], self.v[part]
        if self.momentum_correction:
            u.mul_(self.momentum).add_(g)
            if self.residual:
                v.add_(u)
            else:
                v.copy_(u)
        elif self.residual:
            v.add_(g)
        else:
            v.copy_(g)
        return u, v

    def record(self, bucket: GradBucket, selected: torch.Tensor) -> None:
        self._digest.update(bucket.index.to_bytes(4, "little") + selected.numpy().astype(np.int64).tobytes())
        self.selection_digest = self._digest.hexdigest()


def csc_hook(state: CSCState, bucket: GradBucket) -> Work:
    """Coarse-grained sparse communication of one bucket (see :class:`CSCState`)."""
    u, v = state.accumulate(bucket)
    n, c = bucket.numel, state.chunk
    if n == 0:
        return Work()
    chunks = -(-n // c)
    rows = torch.zeros(chunks * c, dtype=v.dtype)
    rows[:n] = v
    rows = rows.view(chunks, c)
    keep = chunks if state.ratio >= 1.0 else min(chunks, math.ceil(state.ratio * chunks))
    if keep == chunks:  # dense (warm-up or ratio 1): no norms to exchange
        return _send_chunks(state, bucket, rows, torch.arange(chunks), u, v, dense=True)
    norms = rows.abs().sum(dim=1)
    work = bucket.wire.control(norms, n)

    def select() -> Work:
        order = torch.sort(norms, descending=True, stable=True).indices  # ties: lower index first
        return _send_chunks(state, bucket, rows, torch.sort(order[:keep]).values, u, v)
    return work.then(select)


def _send_chunks(state: CSCState, bucket: GradBucket, rows: torch.Tensor, selected: torch.Tensor,
                 u: torch.Tensor, v: torch.Tensor, dense: bool = False) -> Work:
    """All-reduce the ``selected`` chunks packed (the last one unpadded); unpack them into the
    bucket when back, the rest 0. ``dense``: every chunk, counted as the bucket's dense equivalent."""
    state.record(bucket, selected)
    chunks, c = rows.shape
    n = bucket.numel
    packed = rows[selected].reshape(-1)
    tail = chunks * c - n if selected.numel() and int(selected[-1]) == chunks - 1 else 0
    message = packed[:packed.numel() - tail] if tail else packed
    g = bucket.buffer

    def unpack() -> None:
        out = torch.zeros(chunks * c, dtype=g.dtype)
        full = torch.zeros(selected.numel() * c, dtype=g.dtype)
        full[:message.numel()] = message
        out.view(chunks, c)[selected] = full.view(-1, c)
        g.copy_(out[:n])
        mask = torch.zeros(chunks, dtype=torch.bool)
        mask[selected] = True
        state._pending.append((u, v, mask.repeat_interleave(c)[:n]))  # cleared once the step applies
    return bucket.wire.allreduce(message, n if dense else None).then(unpack)
