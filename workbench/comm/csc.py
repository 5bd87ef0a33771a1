"""Coarse-grained sparse communication (GradientFlow's CSC) as a hook with its own state."""
from __future__ import annotations

import hashlib
import math

import numpy as np
import torch

from .hooks import GradBucket, HookState, Work
from .options import Communication


def carried_share(interval: float, momentum: float) -> float:
    """psi(T): the share of a sent chunk's accumulator v that is its momentum u when the chunk is
    sent every T = ``interval`` steps and its gradient g stays the same: u = (1 - m^T)/(1 - m) g
    and v = sum over k = 1..T of (1 - m^k)/(1 - m) g, so
    psi(T) = (1 - m^T)(1 - m) / (T(1 - m) - m(1 - m^T)); psi(1) = 1 (dense: v is u),
    psi(10) = 0.157, psi(100) = 0.011 (m = 0.9). Carrying psi(T) v on as momentum gives back
    what momentum factor masking drops (m/(1 - m) u in all), so a chunk sent every T steps moves
    as far as momentum SGD would; a chunk sent more often moves less, one sent less often more."""
    decayed = momentum ** interval
    return (1 - decayed) * (1 - momentum) / (interval * (1 - momentum) - momentum * (1 - decayed))


class CSCState(HookState):
    """CSC's state: per bucket, chunks of ``chunk`` elements; the chunks' L1 norms are
    all-reduced; every rank selects the same top ``ceil(ratio * K)`` chunks (ties by lower
    index: a stable sort) and all-reduces only those, packed; the rest stays in the residual
    ``v``; momentum correction accumulates momentum ``u`` before the selection and clears the
    sent chunks in both (momentum factor masking, off during a dense warm-up unless the
    momentum is carried). With ``clip_norm``, a sparse step's gradient is clipped first
    (:func:`clip_`, DGC's local gradient clipping: see :class:`~workbench.comm.options.Communication`).

    **Carrying the momentum** (``carry_momentum``, docs/papers.md section 3): DGC's masking drops
    the momentum u of a sent chunk, which momentum SGD would have gone on applying
    (m u, m^2 u, ...: m/(1 - m) u in all); a chunk sent every T steps then moves only
    gain(T) = 1 - m(1 - m^T)/(T(1 - m)) as far as momentum SGD (0.1 at T = 1, 0.41 at T = 10,
    m = 0.9). With the carry on, the optimizer goes on applying it: :attr:`carry_weight` is, on
    the elements sent this step, :func:`carried_share` of the bucket's mean send interval
    T = K / (chunks sent) (one value per bucket, the same on every rank: no extra bytes), and
    :func:`workbench.optim.rules.carried_momentum_sgd` keeps that share of the sent sum in its
    velocity. The average chunk then moves at momentum SGD's speed; DGC's relative pace between
    chunks sent often and seldom is kept. Every send clears u, dense ones too (psi(1) = 1: a dense
    warm-up is momentum SGD exactly, its momentum in the optimizer's velocity).

    Attributes:
        ratio: the selection ratio of the current step (set before :meth:`begin_step`).
        u, v: the momentum and the residual (accumulator), laid out like the gradient pool.
        carry_weight: per element, the share of this step's sent sum that the optimizer keeps
            as momentum (0 where nothing was sent, or with the carry off).
        selection_digest: sha256 over every selection so far (the same on every rank).
    """

    def __init__(self, grad: torch.Tensor, options: Communication, momentum: float = 0.0) -> None:
        self.chunk, self.momentum = options.sparse_chunk, momentum
        self.residual, self.momentum_correction = options.residual, options.momentum_correction
        self.carry = options.carry_momentum and options.momentum_correction and momentum > 0
        self.clip_norm = options.clip_norm
        self.ratio = 1.0
        self.mask_momentum = True
        self.u, self.v = torch.zeros_like(grad), torch.zeros_like(grad)
        self.carry_weight = torch.zeros_like(grad)
        self.selection_digest = ""
        self._digest = hashlib.sha256()
        self._pending: list[tuple[slice, torch.Tensor, float]] = []  # (bucket, chunks sent, interval)
        self._saved: tuple[torch.Tensor, ...] | None = None

    def begin_step(self, may_skip: bool = False) -> None:
        self.mask_momentum = self.ratio < 1.0 or self.carry
        self.carry_weight.zero_()
        if may_skip:  # a skipped step must leave u and v as they were (an inf kept in u would
            if self._saved is None:  # make every later step overflow at ratio 1)
                self._saved = (torch.empty_like(self.u), torch.empty_like(self.v))
            self._saved[0].copy_(self.u)
            self._saved[1].copy_(self.v)

    def settle(self, applied: bool) -> None:
        """What was sent leaves the residual (and, with momentum masking, the momentum, whose
        share the optimizer carries on); without a residual everything unsent is dropped. A
        skipped step puts u and v back as they were: the residual from earlier steps is sent
        later, the skipped step's own gradient is dropped, as a dense skip drops it."""
        if applied:
            for part, sent, interval in self._pending:
                self._settle_bucket(part, sent, interval)
        elif self._saved is not None:
            self.u.copy_(self._saved[0])
            self.v.copy_(self._saved[1])
        self._pending.clear()

    def _settle_bucket(self, part: slice, sent: torch.Tensor, interval: float) -> None:
        """``sent``: the bucket's chunks sent this step (sorted chunk indices)."""
        u, v = self.u[part], self.v[part]
        masked = self.momentum_correction and self.mask_momentum
        if self.carry and masked:  # without a residual, v is u itself: all of it is momentum
            fill_chunks(self.carry_weight[part], sent, self.chunk,
                        carried_share(interval, self.momentum) if self.residual else 1.0)
        if self.residual:
            fill_chunks(v, sent, self.chunk, 0.0)
        else:
            v.zero_()
        if masked:
            fill_chunks(u, sent, self.chunk, 0.0)

    def accumulate(self, bucket: GradBucket) -> torch.Tensor:
        """Fold the bucket's gradient into u and v; returns v's slice."""
        g, part = bucket.buffer, slice(bucket.start, bucket.stop)
        u, v = self.u[part], self.v[part]
        if self.clip_norm is not None and self.ratio < 1.0:
            clip_(g, self.clip_norm * math.sqrt(bucket.numel / self.u.numel() / bucket.wire.size))
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
        return v

    def record(self, bucket: GradBucket, selected: torch.Tensor) -> None:
        self._digest.update(bucket.index.to_bytes(4, "little") + selected.numpy().astype(np.int64).tobytes())
        self.selection_digest = self._digest.hexdigest()


def clip_(g: torch.Tensor, limit: float) -> None:
    """Scale ``g`` down to an L2 norm of ``limit`` when it is larger (DGC's local gradient
    clipping); a gradient with an inf or NaN is left for the overflow check to see."""
    norm = float(torch.linalg.vector_norm(g))
    if math.isfinite(norm) and norm > limit:
        g.mul_(limit / norm)


def chunked(t: torch.Tensor, c: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A 1-D ``t`` as its whole chunks of ``c`` elements, a ``(len(t) // c, c)`` view, and its
    tail (the last ``len(t) % c`` elements, the last chunk when not empty), both views."""
    whole = t.numel() // c
    return t[:whole * c].view(whole, c), t[whole * c:]


def split_tail(chunks: torch.Tensor, whole: int) -> tuple[torch.Tensor, bool]:
    """Sorted chunk indices as (the whole chunks among them, whether the short tail chunk, index
    ``whole``, is the last of them)."""
    with_tail = bool(chunks.numel()) and int(chunks[-1]) == whole
    return (chunks[:-1] if with_tail else chunks), with_tail


def fill_chunks(t: torch.Tensor, chunks: torch.Tensor, c: int, value: float) -> None:
    """Set the chunks ``chunks`` (sorted chunk indices, the tail last) of the 1-D ``t`` to ``value``,
    touching only them."""
    rows, tail = chunked(t, c)
    whole, with_tail = split_tail(chunks, rows.shape[0])
    if with_tail:
        tail.fill_(value)
    rows.index_fill_(0, whole, value)


#: elements per block of :func:`chunk_norms` (a block's absolute values stay in cache)
NORM_BLOCK = 1 << 16


def chunk_norms(v: torch.Tensor, c: int) -> torch.Tensor:
    """The L1 norm of each chunk of ``c`` elements of the 1-D ``v`` (the tail chunk's over its own
    elements), a block of rows at a time: no full-size temporary."""
    rows, tail = chunked(v, c)
    whole = rows.shape[0]
    norms = torch.empty(whole + (1 if tail.numel() else 0), dtype=v.dtype)
    block = max(1, NORM_BLOCK // c)
    for i in range(0, whole, block):
        torch.sum(rows[i:i + block].abs(), dim=1, out=norms[i:min(i + block, whole)])
    if tail.numel():
        norms[-1] = tail.abs().sum()
    return norms


def csc_hook(state: CSCState, bucket: GradBucket) -> Work:
    """Coarse-grained sparse communication of one bucket (see :class:`CSCState`)."""
    v = state.accumulate(bucket)
    n, c = bucket.numel, state.chunk
    if n == 0:
        return Work()
    chunks = -(-n // c)
    keep = chunks if state.ratio >= 1.0 else min(chunks, math.ceil(state.ratio * chunks))
    if keep == chunks:  # dense (warm-up or ratio 1): no norms to exchange
        return _send_chunks(state, bucket, v, torch.arange(chunks), dense=True)
    norms = chunk_norms(v, c)
    work = bucket.wire.control(norms, n)

    return work.then(lambda: _send_chunks(state, bucket, v, top_chunks(norms, keep)))


def top_chunks(norms: torch.Tensor, keep: int) -> torch.Tensor:
    """The ``keep`` chunks of largest norm, ties to the lower index, as sorted chunk indices: the
    first ``keep`` of a stable descending sort, found by selection (the keep-th largest norm, the
    chunks above it, then the tied ones from the lowest index; faster than the sort on many chunks:
    benchmarks/README.md, "What the hooks cost apart from the wire").
    Norms with a NaN (an overflow: the step will be skipped) take the sort, where NaN comes first."""
    if bool(torch.isnan(norms).any()):
        order = torch.sort(norms, descending=True, stable=True).indices
        return torch.sort(order[:keep]).values
    threshold = torch.kthvalue(norms, norms.numel() - keep + 1).values
    above = (norms > threshold).nonzero().squeeze(1)
    tied = (norms == threshold).nonzero().squeeze(1)[:keep - above.numel()]
    return torch.sort(torch.cat([above, tied])).values


def _send_chunks(state: CSCState, bucket: GradBucket, v: torch.Tensor, selected: torch.Tensor,
                 dense: bool = False) -> Work:
    """All-reduce the ``selected`` chunks of ``v`` packed (the last one unpadded); unpack them into
    the bucket when back, the rest 0. ``dense``: every chunk, counted as the bucket's dense equivalent."""
    state.record(bucket, selected)
    n, c, g = bucket.numel, state.chunk, bucket.buffer
    rows, tail = chunked(v, c)
    whole, with_tail = split_tail(selected, rows.shape[0])  # with_tail: the last, short chunk goes too
    if dense:
        message = v.clone()
    else:
        packed = rows[whole].reshape(-1)
        message = torch.cat([packed, tail]) if with_tail else packed

    def unpack() -> None:
        if dense:
            g.copy_(message)
        else:
            g.zero_()
            g_rows, g_tail = chunked(g, c)
            g_rows.index_copy_(0, whole, message[:whole.numel() * c].view(-1, c))
            if with_tail:
                g_tail.copy_(message[whole.numel() * c:])
        # settled once the step applies; the bucket's mean send interval: K / chunks sent
        state._pending.append((slice(bucket.start, bucket.stop), selected, -(-n // c) / selected.numel()))
    return bucket.wire.allreduce(message, n if dense else None).then(unpack)
