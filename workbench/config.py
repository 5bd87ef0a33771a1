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

from .checks import integer
from .comm.hookspec import check_hook
from .comm.names import algorithm_names as collective_names
from .comm.options import DEFAULT_SPARSE_CHUNK, Communication, CommunicationError, resolve
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
#: Seeds go to torch.manual_seed, numpy and scikit-learn (``random_state``); numpy's legacy
#: generator, which scikit-learn uses, takes 0 .. 2**32 - 1, the narrowest of the three.
MAX_SEED = 2**32 - 1
#: String fields: a wrong type is a ConfigError, not a TypeError deep in validation.
_STRING_FIELDS = ("algorithm", "model", "dataset", "collective")
#: Options that an algorithm may not use: name -> the value meaning "not set" (see :func:`ignored_options`).
UNSET = {"collective": "native", "tau": 1, "rho": None, "momentum": None, "fusion_bytes": None,
         "wire_dtype": "fp32", "sparse_ratio": None}
#: seconds one gradient bucket's all-reduce may take before the rank gives up (a backstop: a
#: failing rank normally brings the whole job down at once)
COMM_TIMEOUT = 600.0


class ConfigError(ValueError):
    """A RunConfig value that is not allowed; the message names the parameter."""


def ignored_options(algorithm: str, values: dict[str, Any], derived_rho: float | None = None
                    ) -> list[tuple[str, str]]:
    """The options in ``values`` that ``algorithm`` would silently ignore, as ``(name, why)``.

    An option counts only when it is set to something other than "not set" (:data:`UNSET`) and
    the algorithm's registry entry does not use it (:meth:`~workbench.optim.registry.AlgorithmSpec.uses`):
    ``collective`` other than ``native`` on a master-based algorithm (no all-reduce: workers
    exchange with rank 0); ``tau`` other than 1 on ``sync-sgd`` (it all-reduces gradients every
    step); ``rho`` on an algorithm without an elastic term (the SGD baselines), unless it equals
    the derived default ``derived_rho`` (a config read back from JSON carries it); ``momentum``
    other than 0 on an elastic algorithm without momentum (use ``async-measgd``). A single run
    refuses these (:class:`ConfigError`); a sweep or ``workbench compare`` over several
    algorithms drops them for the algorithms that ignore them (:func:`without_ignored`).
    """
    spec = ALGORITHMS[algorithm]

    def users(option: str) -> str:
        return ", ".join(name for name, s in ALGORITHMS.items() if s.uses(option))

    found = []
    collective = values.get("collective", UNSET["collective"])
    if not spec.uses("collective") and collective != UNSET["collective"]:
        found.append(("collective", f"collective: {algorithm} is master-based (workers exchange with rank 0, "
                                    f"no all-reduce), so it ignores collective={collective!r}; leave it "
                                    f"at 'native' (or pick a synchronous algorithm: {users('collective')})"))
    tau = values.get("tau", UNSET["tau"])
    if not spec.uses("tau") and tau != UNSET["tau"]:
        found.append(("tau", f"tau: {algorithm} all-reduces gradients every step and ignores tau={tau!r}; "
                             f"leave it at 1 (tau is the communication period of the EASGD family and "
                             f"of the master-based algorithms)"))
    rho = values.get("rho")
    derived = derived_rho is not None and isinstance(rho, (int, float)) and math.isclose(rho, derived_rho, rel_tol=1e-9)
    if not spec.uses("rho") and rho is not None and not derived:
        found.append(("rho", f"rho: {algorithm} has no elastic term and ignores rho={rho!r}; leave rho "
                             f"unset (it applies to {users('rho')})"))
    momentum = values.get("momentum")
    if not spec.uses("momentum") and momentum not in (None, 0, 0.0):
        found.append(("momentum", f"momentum: {algorithm} does not use momentum (got {momentum!r}); leave it "
                                  f"unset (async-measgd is momentum EASGD)"))
    what = "all-reduces weights, not gradients" if spec.synchronous else \
        "is master-based (workers exchange with rank 0, no all-reduce)"
    for option, unset in (("fusion_bytes", None), ("wire_dtype", "fp32"), ("sparse_ratio", None)):
        value = values.get(option, unset)
        if not spec.uses(option) and value != unset:
            found.append((option, f"{option}: {algorithm} {what}, so it cannot use {option}={value!r}; leave it "
                                  f"unset (gradient-communication strategies apply to {users(option)})"))
    return found


def shared_files() -> bool:
    """Whether results are meant for other users too: ``WORKBENCH_SHARED=1`` (or true/yes).

    By default the results store is created ``0600`` (its ``-wal``/``-shm`` files follow it)
    and run directories ``0700``, so other users of a shared login node cannot read runs; with
    ``WORKBENCH_SHARED=1`` both are created with the usual umask-derived modes."""
    import os
    return os.environ.get("WORKBENCH_SHARED", "").strip().lower() in ("1", "true", "yes")


def without_ignored(values: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``values`` (RunConfig fields, ``algorithm`` among them) with the options its algorithm
    ignores reset to "not set", and their names. For sweeps and ``workbench compare``, where
    one set of options is shared by several algorithms."""
    algorithm = values.get("algorithm", "sync-easgd")
    if algorithm not in ALGORITHMS:
        return dict(values), []  # RunConfig names the bad algorithm
    names = [name for name, _ in ignored_options(algorithm, values)]
    return {**values, **{name: UNSET[name] for name in names}}, names


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
    # gradient communication (GradientFlow; workbench.comm.options): a preset name or dict of the
    # options below, which it fills in; then the options themselves
    communication: str | dict | None = None
    fusion_bytes: int | None = None
    wire_dtype: str = "fp32"
    sparse_ratio: float | None = None
    sparse_chunk: int = DEFAULT_SPARSE_CHUNK
    warmup_epochs: int = 0
    residual: bool = True
    momentum_correction: bool = True
    comm_hook: str | None = None  # "module:function": a gradient hook (workbench.comm.hookspec)
    eval_every: int = 10
    checkpoint_every: int = 0
    telemetry: bool = True
    synthetic_samples: int = 4000
    fail_rank: int | None = None
    fail_step: int | None = None
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        algos = list(ALGORITHMS)
        for name in _STRING_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, str):
                raise ConfigError(f"{name} must be a string; got {type(value).__name__} {value!r}"
                                  + (" (pass str(path))" if name == "dataset" and hasattr(value, "__fspath__")
                                     else ""))
        if not isinstance(self.extra, dict):
            raise ConfigError(f"extra must be a dict; got {type(self.extra).__name__}")
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
        if self.seed > MAX_SEED:
            raise ConfigError(f"seed must be an integer in 0..{MAX_SEED} (2**32 - 1, what numpy and "
                              f"scikit-learn accept); got {self.seed!r}")
        self._int("synthetic_samples", 20)
        defaults = DEFAULTS[self.algorithm]
        given_rho, given_momentum = self.rho, self.momentum
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
        self._apply_communication()
        ignored = ignored_options(self.algorithm, {"collective": self.collective, "tau": self.tau,
                                                   "rho": given_rho, "momentum": given_momentum,
                                                   "fusion_bytes": self.fusion_bytes, "wire_dtype": self.wire_dtype,
                                                   "sparse_ratio": self.sparse_ratio},
                                  derived_rho=BETA / (self.workers * self.lr))
        if ignored:
            raise ConfigError(ignored[0][1])
        for name in ("single_buffer", "overlap", "telemetry"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false; got {getattr(self, name)!r}")
        self._check_model_and_data()
        if self.comm_hook is not None:
            check_hook(self.comm_hook, error=ConfigError)
        if (self.fail_rank is None) != (self.fail_step is None):
            raise ConfigError("fail_rank and fail_step go together (both set or both unset)")
        if self.fail_rank is not None:
            if (not isinstance(self.fail_rank, int) or isinstance(self.fail_rank, bool)
                    or not 0 <= self.fail_rank < self.ranks):
                raise ConfigError(f"fail_rank must be a rank in 0..{self.ranks - 1}; got {self.fail_rank!r}")
            integer("fail_step", self.fail_step, 0, error=ConfigError)

    def _apply_communication(self) -> None:
        """Expand ``communication`` into the option fields and check them all together."""
        try:
            preset = resolve(self.communication)
        except CommunicationError as exc:
            raise ConfigError(str(exc)) from None
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for name, value in preset.items():
            mine = getattr(self, name)
            if mine != defaults[name] and mine != value:
                raise ConfigError(f"{name}={mine!r} contradicts communication={self.communication!r}, which sets "
                                  f"{name}={value!r}; give one of them")
            setattr(self, name, value)
        self.communication = None  # expanded: the fields say it all (and survive to_dict/from_dict)
        if not isinstance(self.single_buffer, bool):
            raise ConfigError(f"single_buffer must be true or false; got {self.single_buffer!r}")
        if not self.single_buffer and self.fusion_bytes not in (None, 0):
            raise ConfigError(f"single_buffer=False is fusion_bytes=0 (one message per tensor); it contradicts "
                              f"fusion_bytes={self.fusion_bytes!r}: give one of them")
        try:
            self.communication_options  # noqa: B018 - validates
        except CommunicationError as exc:
            raise ConfigError(str(exc)) from None

    # -- derived -------------------------------------------------------------------------
    @property
    def communication_options(self) -> Communication:
        """The gradient-communication options (``single_buffer=False`` is ``fusion_bytes=0``).
        ``overlap`` means the gradient hooks for sync-sgd; Sync EASGD and the master-based
        EASGD workers overlap their weight exchange with the gradient computation instead."""
        fusion = 0 if not self.single_buffer and self.fusion_bytes is None else self.fusion_bytes
        return Communication(fusion_bytes=fusion, overlap=self.overlap, wire_dtype=self.wire_dtype,
                             sparse_ratio=self.sparse_ratio, sparse_chunk=self.sparse_chunk,
                             warmup_epochs=self.warmup_epochs, residual=self.residual,
                             momentum_correction=self.momentum_correction)

    @property
    def comm_timeout(self) -> float:
        """Seconds a rank waits for one all-reduce of a bucket (:data:`COMM_TIMEOUT`)."""
        return COMM_TIMEOUT

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
        integer(name, getattr(self, name), minimum, error=ConfigError)

    def _number(self, name: str, ok, allowed: str) -> None:
        value = getattr(self, name)
        if (not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value)
                or not ok(value)):
            raise ConfigError(f"{name} must be a number {allowed}; got {value!r}")
        setattr(self, name, float(value))

    def _check_model_and_data(self) -> None:
        """The dataset's shapes and labels and the model against them, without torch for the
        built-in models and datasets (a ``module:function`` model is built once to check it)."""
        from . import data, models
        try:
            info = data.describe(self.dataset, samples=self.synthetic_samples)
        except ValueError as exc:
            raise ConfigError(str(exc) if str(exc).startswith("dataset") else f"dataset: {exc}") from None
        try:
            models.check_model(self.model, info.feature_shape, info.num_classes)
        except ValueError as exc:
            raise ConfigError(f"model: {exc}") from None
        train = info.train_samples
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
