"""How a run communicates its gradients (GradientFlow): the options, validated, importable
without MPI or torch (``RunConfig`` and the CLI check them before any process starts).

The strategies compose in one order, each a switch (:mod:`workbench.comm.strategies` runs them):

1. **fusion** (lazy all-reduce): gradients are grouped into buckets of at least
   ``fusion_bytes`` bytes in the order backward produces them; ``0`` is one message per
   tensor, ``None`` (infinity) one message per step;
2. **overlap**: a bucket's all-reduce starts from the gradient hooks while backward still runs;
3. **wire precision**: ``wire_dtype`` ``fp16``/``bf16`` halves the bytes (pre-divided by the
   rank count; fp16 with dynamic loss scaling; an overflow on any rank skips the step on all);
4. **coarse-grained sparse communication** (CSC): ``sparse_ratio`` of the chunks of
   ``sparse_chunk`` elements with the largest L1 norms are sent; the rest stays in a local
   residual (``residual``), with momentum correction (``momentum_correction``), the masked
   momentum carried on by the optimizer (``carry_momentum``), DGC's local gradient clipping
   (``clip_norm``) and a dense warm-up of ``warmup_epochs`` epochs.

``PRESETS`` name common combinations for ``RunConfig(communication="fp16")``.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from ..checks import finite_number

#: wire dtypes by their CLI names -> torch dtype names
WIRE_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}

#: default chunk size of CSC, in elements. The paper's value is not available to us. The norms
#: cost K = n/c floats per step, 1/64 of the dense bytes here, so rho = 0.1 sends 8.6x fewer
#: bytes; on the 4.7K-parameter digits MLP (6 epochs, 4 ranks, rho 0.1) c = 64 reached 0.936
#: test accuracy against 0.961 dense, while c = 256 (19 chunks in all) reached 0.75
DEFAULT_SPARSE_CHUNK = 64


class CommunicationError(ValueError):
    """A gradient-communication option that is not allowed; the message names it."""


@dataclass(frozen=True)
class Communication:
    """The gradient-communication options of one run.

    Attributes:
        fusion_bytes: bucket threshold θ in bytes of gradient (float32); ``0``: one message per
            tensor; ``None``: one message per step (a single bucket).
        overlap: issue bucket all-reduces from the backward hooks while backward runs (off here;
            ``RunConfig.overlap`` defaults to on, the EASGD family's weight-exchange overlap).
        wire_dtype: ``fp32``, ``fp16`` or ``bf16``: the dtype the gradients travel in.
        sparse_ratio: CSC's selection ratio ρ in (0, 1]; ``None``: dense (CSC off).
        sparse_chunk: CSC's chunk size c in elements.
        warmup_epochs: CSC: dense epochs first, then ρ falls geometrically to ``sparse_ratio``
            over the warm-up (``0``: sparse from the first step).
        residual: CSC: keep what was not sent and add it next step.
        momentum_correction: CSC: accumulate momentum before selection (u <- m*u + g;
            v <- v + u), so the optimizer applies the sent sum without momentum of its own.
        carry_momentum: CSC with momentum correction: the momentum that momentum factor masking
            clears from a sent chunk goes on in the optimizer, as momentum SGD would have applied
            it; ``False``: dropped, DGC as published (at rho = 0.1 that trains at about 0.4 of
            momentum SGD's speed: docs/papers.md section 3).
        clip_norm: CSC: DGC's local gradient clipping. On a sparse step each rank scales the
            gradient it folds into its momentum and residual down to an L2 norm of at most
            ``clip_norm / sqrt(ranks)`` (DGC's threshold scaled by N^-1/2), a bucket of ``n_b`` of
            the ``n`` elements to its share ``clip_norm * sqrt(n_b / n) / sqrt(ranks)``, so the
            whole gradient's bound holds for any fusion; dense steps (the warm-up) are not
            clipped. ``None``: off.
    """

    fusion_bytes: int | None = None
    overlap: bool = False
    wire_dtype: str = "fp32"
    sparse_ratio: float | None = None
    sparse_chunk: int = DEFAULT_SPARSE_CHUNK
    warmup_epochs: int = 0
    residual: bool = True
    momentum_correction: bool = True
    carry_momentum: bool = True
    clip_norm: float | None = None

    def __post_init__(self) -> None:
        fb = self.fusion_bytes
        if fb is not None and (not isinstance(fb, int) or isinstance(fb, bool) or fb < 0):
            raise CommunicationError(f"fusion_bytes must be an integer >= 0 (bytes; 0 = one message per "
                                     f"tensor) or None (one message per step); got {fb!r}")
        for name in ("overlap", "residual", "momentum_correction", "carry_momentum"):
            if not isinstance(getattr(self, name), bool):
                raise CommunicationError(f"{name} must be true or false; got {getattr(self, name)!r}")
        if self.wire_dtype not in WIRE_DTYPES:
            raise CommunicationError(f"wire_dtype must be one of {', '.join(WIRE_DTYPES)}; got {self.wire_dtype!r}")
        ratio = self.sparse_ratio
        if ratio is not None and (not finite_number(ratio) or not 0 < ratio <= 1):
            raise CommunicationError(f"sparse_ratio must be a number in (0, 1] (the share of chunks sent) "
                                     f"or None (dense); got {ratio!r}")
        if ratio is not None:
            object.__setattr__(self, "sparse_ratio", float(ratio))
        chunk = self.sparse_chunk
        if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1:
            raise CommunicationError(f"sparse_chunk must be an integer >= 1 (elements); got {chunk!r}")
        clip = self.clip_norm
        if clip is not None and (not finite_number(clip) or clip <= 0):
            raise CommunicationError(f"clip_norm must be a number > 0 (the L2 norm the ranks' gradients are "
                                     f"clipped to, together) or None (no clipping); got {clip!r}")
        if clip is not None:
            object.__setattr__(self, "clip_norm", float(clip))
        warm = self.warmup_epochs
        if not isinstance(warm, int) or isinstance(warm, bool) or warm < 0:
            raise CommunicationError(f"warmup_epochs must be an integer >= 0; got {warm!r}")
        if ratio is None:
            for name, default in (("warmup_epochs", 0), ("residual", True), ("momentum_correction", True),
                                  ("carry_momentum", True), ("sparse_chunk", DEFAULT_SPARSE_CHUNK),
                                  ("clip_norm", None)):
                if getattr(self, name) != default:
                    raise CommunicationError(f"{name} is an option of coarse-grained sparse communication; "
                                             f"set sparse_ratio (in (0, 1]) to use it")

    # -- derived ---------------------------------------------------------------------------
    @property
    def sparse(self) -> bool:
        return self.sparse_ratio is not None

    @property
    def wire_torch_dtype(self) -> str:
        """The torch dtype name on the wire: ``float32``, ``float16`` or ``bfloat16``."""
        return WIRE_DTYPES[self.wire_dtype]

    @property
    def wire_itemsize(self) -> int:
        return 4 if self.wire_dtype == "fp32" else 2

    @property
    def dense_default(self) -> bool:
        """Dense fp32, no fusion threshold, no overlap: what the runs before GradientFlow did."""
        return self == Communication()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        """One line: ``fusion 64K, overlap, fp16, CSC rho=0.1 c=256 warm-up 1``."""
        from ..sizes import format_size
        parts = ["one message per step" if self.fusion_bytes is None else
                 "one message per tensor" if self.fusion_bytes == 0 else f"fusion {format_size(self.fusion_bytes)}"]
        if self.overlap:
            parts.append("overlap")
        parts.append(self.wire_dtype)
        if self.sparse:
            csc = f"CSC rho={self.sparse_ratio:g} c={self.sparse_chunk}"
            if self.warmup_epochs:
                csc += f" warm-up {self.warmup_epochs}"
            if not self.residual:
                csc += " no residual"
            if not self.momentum_correction:
                csc += " no momentum correction"
            elif not self.carry_momentum:
                csc += " masked momentum dropped"
            if self.clip_norm is not None:
                csc += f" clip {self.clip_norm:g}"
            parts.append(csc)
        return ", ".join(parts)


#: RunConfig field names of the options (the same names as :class:`Communication`'s fields)
FIELDS = tuple(f.name for f in fields(Communication))

#: ``RunConfig(communication=NAME)``: common combinations
PRESETS: dict[str, dict[str, Any]] = {
    "dense": {"overlap": False},
    "per-tensor": {"fusion_bytes": 0, "overlap": False},
    "fused": {"fusion_bytes": 1 << 20, "overlap": True},
    "fp16": {"fusion_bytes": 1 << 20, "overlap": True, "wire_dtype": "fp16"},
    "bf16": {"fusion_bytes": 1 << 20, "overlap": True, "wire_dtype": "bf16"},
    "csc": {"sparse_ratio": 0.1, "warmup_epochs": 1},
    "gradientflow": {"fusion_bytes": 1 << 20, "overlap": True, "wire_dtype": "fp16", "sparse_ratio": 0.1,
                     "warmup_epochs": 1},
}


def resolve(communication: str | dict | None) -> dict[str, Any]:
    """The options a ``communication=`` value stands for: a preset name or a dict of options."""
    if communication is None:
        return {}
    if isinstance(communication, str):
        if communication not in PRESETS:
            raise CommunicationError(f"communication must be one of {', '.join(PRESETS)} or a dict of options "
                                     f"({', '.join(FIELDS)}); got {communication!r}")
        return dict(PRESETS[communication])
    if isinstance(communication, dict):
        unknown = sorted(set(communication) - set(FIELDS))
        if unknown:
            raise CommunicationError(f"communication: unknown option(s) {unknown}; known: {', '.join(FIELDS)}")
        return dict(communication)
    raise CommunicationError(f"communication must be a preset name ({', '.join(PRESETS)}) or a dict; "
                             f"got {type(communication).__name__}")


def warmup_ratio(final: float, epoch: float, warmup_epochs: int) -> float:
    """CSC's selection ratio at ``epoch`` (fractional): dense (1.0) in the first epoch of a
    warm-up, then falling geometrically to ``final`` at the end of ``warmup_epochs``
    (DGC's exponential schedule: 1, ..., final); ``final`` from then on."""
    if warmup_epochs <= 0 or epoch >= warmup_epochs:
        return final
    return float(final ** (math.floor(epoch) / warmup_epochs)) if epoch >= 1 else 1.0
