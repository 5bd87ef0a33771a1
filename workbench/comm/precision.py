"""Wire precision (fp16/bf16 on the wire, with loss scaling and an overflow skip) as a wrapper
around any hook: DDP's ``fp16_compress_wrapper`` pattern, with a state of its own."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from ..deadline import Deadline
from .hooks import GradBucket, Hook, HookState, Wire, Work
from .names import NATIVE

#: fp16 dynamic loss scaling: the first scale, the factor on overflow, and how many good steps
#: before the scale doubles (apex/torch.amp use 2**16 and 2000; our gradients are pre-divided
#: by the rank count and smaller, and runs are short)
INITIAL_LOSS_SCALE = 2.0 ** 12
BACKOFF = 0.5
GROWTH_INTERVAL = 200

#: the half-precision wire dtypes by their option value (``wire_dtype``, ``outer_wire_dtype``)
WIRE_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


class PrecisionState(HookState):
    """:func:`wire_precision`'s state: the wire dtype, fp16's dynamic loss scale and this step's
    overflow flag, around the wrapped hook's own state ``inner``.

    Attributes:
        loss_scale: fp16's dynamic loss scale (bf16: always 1).
        overflow: this rank saw a non-finite value this step (compressed or summed).
    """

    def __init__(self, inner: HookState, wire_dtype: str) -> None:
        if wire_dtype not in WIRE_DTYPES:
            raise ValueError(f"wire_dtype must be fp16 or bf16 for wire_precision; got {wire_dtype!r}")
        self.inner, self.wire_dtype = inner, wire_dtype
        self.dtype = WIRE_DTYPES[wire_dtype]
        self.loss_scale = INITIAL_LOSS_SCALE
        self.good_steps = 0
        self.overflow = False
        self._half: _HalfWire | None = None

    def half_wire(self, wire: Wire) -> "_HalfWire":
        """``wire`` with the payload in this state's dtype (made once per wire)."""
        if self._half is None or self._half.base is not wire:
            self._half = _HalfWire(wire, self)
        return self._half

    @property
    def scale(self) -> float:
        return self.loss_scale if self.wire_dtype == "fp16" else 1.0

    def begin_step(self, may_skip: bool = False) -> None:
        self.overflow = False
        self.inner.begin_step(may_skip=True)

    def decide(self, wire: Wire, deadline: Deadline) -> bool:
        """No rank saw an overflow (one all-reduced float, counted as a message), and the inner
        state agrees."""
        flag = np.array([1.0 if self.overflow else 0.0], dtype=np.float32)
        wire.control(flag, collective=NATIVE).wait(deadline.left())
        return bool(flag[0] == 0) and self.inner.decide(wire, deadline)

    def settle(self, applied: bool) -> None:
        """fp16's loss scale halves on a skipped step and doubles every ``GROWTH_INTERVAL`` good
        ones; then the inner state settles."""
        if applied:
            self.good_steps += 1
            if self.wire_dtype == "fp16" and self.good_steps % GROWTH_INTERVAL == 0:
                self.loss_scale *= 2.0
        else:
            self.good_steps = 0
            if self.wire_dtype == "fp16":
                self.loss_scale *= BACKOFF
        self.inner.settle(applied)


class _HalfWire(Wire):
    """A wire whose payload travels in the precision state's dtype; control messages as before."""

    def __init__(self, wire: Wire, precision: PrecisionState) -> None:
        super().__init__(wire.comm, wire.collective, wire.traffic)
        self.base, self.control, self.precision = wire, wire.control, precision
        self._free: list[torch.Tensor] = []  # wire buffers no message holds now

    def allreduce(self, tensor: torch.Tensor, dense_elems: int | None = None, *,
                  collective: str | None = None) -> Work:
        state, p = self.precision, self.size
        scale = state.scale
        # scaled in place (the sum overwrites the tensor anyway), then narrowed into a buffer of
        # the pool: the bits of (tensor * s).to(dtype) without allocating and faulting in a new one
        # every step (61M values: 25 ms against 300 ms)
        tensor.mul_(scale / p)
        buffer = self._take(tensor.numel())
        wire = buffer[:tensor.numel()].view(tensor.shape)
        wire.copy_(tensor)
        if not finite(wire):
            state.overflow = True  # this rank's values do not fit: every rank will skip
        work = super().allreduce(wire, dense_elems, collective=collective)

        def back() -> None:
            tensor.copy_(wire)  # widened in place, then unscaled: the bits of wire.to(dtype) * (p / scale)
            tensor.mul_(p / scale)
            self._free.append(buffer)
            if not finite(tensor):
                state.overflow = True
        return work.then(back)

    def _take(self, numel: int) -> torch.Tensor:
        """A free wire buffer of at least ``numel`` elements (at most twice that), else a new one:
        each message in flight has its own, and a bucket finds its last step's again."""
        for i, buffer in enumerate(self._free):
            if numel <= buffer.numel() <= 2 * numel:
                return self._free.pop(i)
        return torch.empty(numel, dtype=self.precision.dtype)


def finite(tensor: torch.Tensor) -> bool:
    """No inf or NaN in ``tensor``: its min and max are finite (NaN propagates through both).
    One vectorised pass; ``torch.isfinite(t).all()`` builds a boolean copy and is many times slower
    (benchmarks/README.md, "What the hooks cost apart from the wire")."""
    if tensor.numel() == 0:
        return True
    low, high = torch.aminmax(tensor)
    return bool(torch.isfinite(low)) and bool(torch.isfinite(high))


def wire_precision(hook: Hook) -> Hook:
    """Wrap ``hook`` so that its payload travels in fp16/bf16 (DDP's ``fp16_compress_wrapper``):
    the wrapped hook is called with a :class:`PrecisionState` whose ``inner`` is ``hook``'s own
    state, and with the bucket on a wire that compresses what ``hook`` sends."""
    def wrapped(state: PrecisionState, bucket: GradBucket) -> Work:
        return hook(state.inner, replace(bucket, wire=state.half_wire(bucket.wire)))
    wrapped.__name__ = f"wire_precision({getattr(hook, '__name__', 'hook')})"
    return wrapped
