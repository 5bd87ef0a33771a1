"""``RunConfig``: one training run, validated before any process starts.

Every bad value raises :class:`ConfigError` naming the parameter and what is allowed.
Hyper-parameters left as ``None`` get the algorithm's defaults (:data:`DEFAULTS`); ``rho``
defaults to the paper's ``beta = p*lr*rho = 0.9``, i.e. ``rho = 0.9 / (p * lr)`` with ``p``
workers.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any

from .collectives import algorithm_names as collective_names
from .optim.registry import ALGORITHMS

#: Per-algorithm defaults for lr and momentum (reach >= 0.88 test accuracy on digits, 4 ranks).
DEFAULTS = {
    "sync-sgd": {"lr": 0.1, "momentum": 0.9},
    "async-sgd": {"lr": 0.05, "momentum": 0.0},
    "async-msgd": {"lr": 0.02, "momentum": 0.9},
    "hogwild-sgd": {"lr": 0.05, "momentum": 0.0},
    "easgd": {"lr": 0.1, "momentum": 0.0},
    "async-easgd": {"lr": 0.1, "momentum": 0.0},
    "async-measgd": {"lr": 0.02, "momentum": 0.9},
    "hogwild-easgd": {"lr": 0.1, "momentum": 0.0},
    "sync-easgd": {"lr": 0.1, "momentum": 0.0},
}
BETA = 0.9  # the paper's moving rate p*alpha


class ConfigError(ValueError):
    """A RunConfig value that is not allowed; the message names the parameter."""


@dataclass
class RunConfig:
    """One training run. See README "Training" for what each knob does."""

    algorithm: str = "sync-easgd"
    ranks: int = 4
    model: str = "mlp"
    dataset: str = "digits"
    epochs: int = 10
    lr: float | None = None
    rho: float | None = None
    tau: int = 1
    momentum: float | None = None
    batch_size: int = 16
    seed: int = 0
    collective: str = "native"
    single_buffer: bool = True
    overlap: bool = True
    eval_every: int = 10
    checkpoint_every: int = 0
    telemetry: bool = True
    synthetic_samples: int = 4000
    fail_rank: int | None = None
    fail_step: int | None = None
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        algos = list(ALGORITHMS)
        if self.algorithm not in ALGORITHMS:
            raise ConfigError(f"algorithm must be one of {', '.join(algos)}; got {self.algorithm!r}")
        spec = ALGORITHMS[self.algorithm]
        self._int("ranks", 1)
        if spec.master_based and self.ranks < 2:
            raise ConfigError(f"ranks must be >= 2 for {self.algorithm} (rank 0 is the master)")
        self._int("epochs", 1)
        self._int("tau", 1)
        self._int("batch_size", 1)
        self._int("eval_every", 1)
        self._int("checkpoint_every", 0)
        self._int("seed", 0)
        self._int("synthetic_samples", 20)
        defaults = DEFAULTS[self.algorithm]
        if self.lr is None:
            self.lr = defaults["lr"]
        if self.momentum is None:
            self.momentum = defaults["momentum"]
        self._number("lr", lambda v: v > 0, "> 0")
        self._number("momentum", lambda v: 0 <= v < 1, "in [0, 1)")
        if self.rho is None:
            self.rho = BETA / (self.workers * self.lr)
        self._number("rho", lambda v: v >= 0, ">= 0")
        if spec.elastic and self.workers * self.lr * self.rho >= 2:
            raise ConfigError(f"rho: p*lr*rho = {self.workers * self.lr * self.rho:.3g} must be < 2 "
                              f"for the center update to be stable (p={self.workers} workers)")
        if self.collective not in collective_names():
            raise ConfigError(f"collective must be one of {', '.join(collective_names())}; "
                              f"got {self.collective!r}")
        for name in ("single_buffer", "overlap", "telemetry"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false; got {getattr(self, name)!r}")
        self._check_model_and_data()
        if (self.fail_rank is None) != (self.fail_step is None):
            raise ConfigError("fail_rank and fail_step go together (both set or both unset)")
        if self.fail_rank is not None:
            if not isinstance(self.fail_rank, int) or not 0 <= self.fail_rank < self.ranks:
                raise ConfigError(f"fail_rank must be a rank in 0..{self.ranks - 1}; got {self.fail_rank!r}")
            if not isinstance(self.fail_step, int) or self.fail_step < 0:
                raise ConfigError(f"fail_step must be an integer >= 0; got {self.fail_step!r}")

    # -- derived -------------------------------------------------------------------------
    @property
    def spec(self):
        """The algorithm's registry entry."""
        return ALGORITHMS[self.algorithm]

    @property
    def workers(self) -> int:
        """Ranks that train: all of them, or all but the master."""
        return self.ranks - 1 if ALGORITHMS[self.algorithm].master_based else self.ranks

    # -- validation helpers --------------------------------------------------------------
    def _int(self, name: str, minimum: int) -> None:
        value = getattr(self, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise ConfigError(f"{name} must be an integer >= {minimum}; got {value!r}")

    def _number(self, name: str, ok, allowed: str) -> None:
        value = getattr(self, name)
        if (not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value)
                or not ok(value)):
            raise ConfigError(f"{name} must be a number {allowed}; got {value!r}")
        setattr(self, name, float(value))

    def _check_model_and_data(self) -> None:
        from . import data, models
        try:
            models.check_model_name(self.model)
        except ValueError as exc:
            raise ConfigError(f"model: {exc}") from None
        if self.dataset == "digits":
            train = 1437  # data.digits() split, known without loading it
        elif self.dataset == "synthetic":
            train = int(self.synthetic_samples * 0.8)
        elif self.dataset.endswith(".npz"):
            try:
                train = len(data.from_npz(self.dataset).y_train)
            except (OSError, ValueError) as exc:
                raise ConfigError(f"dataset: cannot read {self.dataset!r}: {exc}") from None
        else:
            raise ConfigError(f"dataset must be one of {', '.join(data.BUILTIN_DATASETS)} or a path "
                              f"to an .npz file; got {self.dataset!r}")
        shard = train // self.workers
        if self.batch_size > shard:
            raise ConfigError(f"batch_size {self.batch_size} is larger than a worker's shard "
                              f"({shard} samples: {train} training samples over {self.workers} "
                              f"workers)")

    # -- serialisation -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "RunConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise ConfigError(f"unknown RunConfig field(s) {sorted(unknown)}; known: {sorted(known)}")
        return cls(**values)
