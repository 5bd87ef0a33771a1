"""A training algorithm, defined once: :class:`Algorithm` and its three families.

One object per algorithm says everything the workbench needs to know about it before any process
starts: its name and description, the classes its ranks run, its default learning rate and momentum,
the options it takes beyond those every algorithm takes (:attr:`Algorithm.options`; each option's own
declaration in :mod:`workbench.config` says why an algorithm that does not take it refuses it), its
own checks of a configuration (:meth:`Algorithm.check`), and how it communicates, in the form the
predictor reads (:attr:`Algorithm.exchange`, :attr:`Algorithm.period`). The registry
(:mod:`workbench.optim.registry`) is the list of these objects; nothing else keeps a list or a flag
of its own about an algorithm.

The family is the class:

- :class:`LockStep`: every rank trains, in lock-step (bitwise deterministic for a seed: the final
  weights are checksummed); the all-reduce's ``collective`` applies.
- :class:`Periodic`, a lock-step family of its own (EASGD's descendants): ``sync_every`` local steps,
  then an exchange; the inner optimizer's options apply.
- :class:`MasterBased`: rank 0 serves (the center or the weights), ranks 1..N-1 train and exchange
  with it point to point; ``tau`` applies.

What the rest of the workbench asks of an algorithm is derived here from those declarations: an
algorithm is elastic when it takes ``rho``, has an outer optimizer when it takes ``outer_lr``,
streams fragments when it takes ``fragments``, reduces gradients when it takes the gradient
strategies.

Pure: the standard library only (the notebook kernel and the CLI read it before any process starts;
the ranks' classes are named as ``"module:Class"`` strings and imported by :meth:`implementation_class`).
"""
from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import Any, ClassVar

from ..options import ConfigError

#: the options only some algorithms take, by what they are for (each algorithm lists those it takes)
ELASTIC = ("rho",)
PERIOD = ("tau",)
MOMENTUM = ("momentum",)
COLLECTIVE = ("collective",)
GRADIENT_STRATEGIES = ("wire_dtype", "sparse_ratio", "comm_hook")
INNER = ("sync_every", "warmup_steps", "inner_optimizer", "weight_decay")
OUTER = ("outer_lr", "outer_momentum", "nesterov", "outer_wire_dtype")
STREAMING = ("fragments", "sync_delay", "fragment_alpha")
#: every option that only some algorithms take (``RunConfig``'s declarations say the same: ``scoped=True``)
SCOPED = frozenset(ELASTIC + PERIOD + MOMENTUM + COLLECTIVE + GRADIENT_STRATEGIES + INNER + OUTER + STREAMING)

#: how an algorithm communicates, as the predictor (:mod:`workbench.netsim.predict`) models it
EXCHANGES = {
    "gradients": "every step, the gradients all-reduced in buckets as they are ready (the gradient strategies apply)",
    "weights": "every period, the weights all-reduced (Sync EASGD)",
    "round-robin": "every period, each worker sends its weights to rank 0 and gets the center back, one worker at "
                   "a time (the original EASGD)",
    "average": "every period, the models averaged by an all-reduce of the weights (Local SGD)",
    "outer": "every period, the outer gradient all-reduced in outer_wire_dtype (DiLoCo)",
    "streaming": "fragment by fragment on a staggered schedule, each exchange overlapped with sync_delay local "
                 "steps (Streaming DiLoCo)",
}


class DefinitionError(ValueError):
    """An algorithm's definition that cannot work; the message names the field."""


@dataclass(frozen=True, kw_only=True)
class Algorithm:
    """One training algorithm, declared as one of its three families (:class:`LockStep`, :class:`Periodic`,
    :class:`MasterBased`), which take these arguments.

    Args:
        name: the name users give (``RunConfig(algorithm=...)``, ``--algorithm``).
        description: one line, shown by ``workbench algorithms`` and ``wb.algorithms()``.
        worker: ``"package.module:Class"`` that every rank runs (ranks 1..N-1 when there is a master),
            imported on the ranks only; built with the rank's :class:`~workbench.runtime.rank.context.Context`,
            its ``run(resume_dir=None)`` returns the final weights.
        master: ``"package.module:Class"`` that rank 0 runs (it serves the center or the weights):
            :class:`MasterBased` only, which needs it.
        default_lr: the learning rate ``RunConfig(lr=None)`` means for it.
        default_momentum: the momentum ``RunConfig(momentum=None)`` means for it (> 0: a momentum variant).
        options: the options it takes among those only some algorithms take (the groups of
            :mod:`workbench.optim.definition`: :data:`ELASTIC`, :data:`PERIOD`, :data:`MOMENTUM`, ...); one
            every algorithm takes is not listed.
        exchange: how it communicates, one of :data:`EXCHANGES`, for the predictor; None: the predictor
            does not model it.

    Raises:
        DefinitionError: the class itself rather than a family; a ``master`` given to a family without one,
            or none to :class:`MasterBased`; a ``worker`` or ``master`` that is not ``"package.module:Class"``;
            an ``exchange`` that is not one of :data:`EXCHANGES`.
    """

    #: "lock-step", "periodic" or "master-based"
    family: ClassVar[str] = ""
    #: the option that sets the steps between exchanges, for the predictor (None: every step)
    period: ClassVar[str | None] = None

    name: str
    description: str
    worker: str
    master: str | None = None
    default_lr: float = 0.1
    default_momentum: float = 0.0
    options: frozenset[str] = frozenset()
    exchange: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", frozenset(self.options))
        if not self.family:
            raise DefinitionError(f"{self.name}: define it as a LockStep, Periodic or MasterBased algorithm")
        if self.exchange is not None and self.exchange not in EXCHANGES:
            raise DefinitionError(f"{self.name}: exchange must be one of {', '.join(EXCHANGES)} or None; "
                                  f"got {self.exchange!r}")
        if (self.master is not None) != self.master_based:
            raise DefinitionError(f"{self.name}: a master ('module:Class' for rank 0) is what a MasterBased "
                                  f"algorithm has, and only it")
        for role, target in (("worker", self.worker), ("master", self.master)):
            if target is not None and (not isinstance(target, str) or target.count(":") != 1):
                raise DefinitionError(f"{self.name}: {role} must be 'package.module:Class'; got {target!r}")

    # -- what the rest of the workbench asks, derived from the declarations ---------------------
    @property
    def master_based(self) -> bool:
        """Rank 0 serves (holds the center or the weights); ranks 1..N-1 train."""
        return self.family == "master-based"

    @property
    def synchronous(self) -> bool:
        """Lock-step, bitwise deterministic for a seed: the final weights are checksummed."""
        return not self.master_based

    @property
    def periodic(self) -> bool:
        """EASGD's descendants: local steps, then an exchange every ``sync_every`` steps."""
        return self.family == "periodic"

    @property
    def elastic(self) -> bool:
        """Has a center variable and the elastic coefficient ``rho`` (EASGD family)."""
        return "rho" in self.options

    @property
    def momentum(self) -> bool:
        """A momentum variant: its default momentum is > 0 (an elastic worker takes the momentum
        step: MEASGD)."""
        return self.default_momentum > 0

    @property
    def reduces_gradients(self) -> bool:
        """All-reduces gradients in nonblocking buckets: the gradient-communication strategies apply."""
        return set(GRADIENT_STRATEGIES) <= self.options

    @property
    def outer_optimizer(self) -> bool:
        """Keeps outer weights that an outer optimizer moves by the workers' averaged change (DiLoCo)."""
        return "outer_lr" in self.options

    @property
    def streaming(self) -> bool:
        """Exchanges fragment by fragment, overlapped with the inner steps (Streaming DiLoCo)."""
        return "fragments" in self.options

    @property
    def evaluated(self) -> str:
        """What the evaluated weights are, for the dashboard's accuracy axis."""
        if self.elastic:
            return "center"
        if self.outer_optimizer:
            return "outer model"
        if self.periodic:
            return "averaged model"
        return "master's weights" if self.master_based else "model"

    def uses(self, option: str) -> bool:
        """Whether it takes the RunConfig option ``option`` (an option every algorithm takes included)."""
        return option in self.options or option not in SCOPED

    def check(self, cfg: Any) -> None:
        """Its own checks of a :class:`~workbench.config.RunConfig` beyond the options' (raise
        :class:`~workbench.config.ConfigError` with one line naming the option); none by default."""

    def implementation_class(self, rank: int) -> type:
        """The class ``rank`` runs (imported now: this needs torch and mpi4py)."""
        module, _, name = (self.master if self.master_based and rank == 0 else self.worker).partition(":")
        return getattr(import_module(module), name)


@dataclass(frozen=True, kw_only=True)
class LockStep(Algorithm):
    """Every rank trains in lock-step: gradients (``exchange="gradients"``) or weights all-reduced.

    Bitwise deterministic for a seed: the final weights are checksummed. The all-reduce's ``collective``
    applies.

    Its arguments, and the errors they may raise, are :class:`Algorithm`'s.

    Attributes:
        family: ``"lock-step"``.
        period: the option that sets the steps between exchanges, for the predictor: ``tau``.
    """

    family: ClassVar[str] = "lock-step"
    period: ClassVar[str | None] = "tau"


@dataclass(frozen=True, kw_only=True)
class Periodic(LockStep):
    """EASGD's descendants: ``sync_every`` local steps of the inner optimizer, then an exchange.

    A lock-step family of its own; the inner optimizer's options apply. Its checks (:meth:`check`): AdamW
    without momentum, Streaming DiLoCo's fragments.

    Its arguments, and the errors they may raise, are :class:`Algorithm`'s.

    Attributes:
        family: ``"periodic"``.
        period: the option that sets the steps between exchanges, for the predictor: ``sync_every``.
    """

    family: ClassVar[str] = "periodic"
    period: ClassVar[str | None] = "sync_every"

    def check(self, cfg: Any) -> None:
        """The family's checks of a :class:`~workbench.config.RunConfig`, which calls it at construction.

        Args:
            cfg: the configuration (its fields checked one by one already).

        Raises:
            ConfigError: ``momentum`` given with ``inner_optimizer="adamw"`` (AdamW uses its betas); for a
                streaming algorithm, ``fragments`` more than ``sync_every``, ``sync_delay`` not below
                ``sync_every // fragments``, or more fragments than the model has parameter tensors.
        """
        if cfg.inner_optimizer == "adamw" and cfg.momentum is not None:
            raise ConfigError(f"momentum: inner_optimizer='adamw' uses its betas (0.9, 0.999), not momentum "
                              f"(got {cfg.momentum!r}); leave momentum unset or use inner_optimizer='sgd'")
        if self.streaming:
            _check_fragments(cfg)


def _check_fragments(cfg: Any) -> None:
    """Streaming DiLoCo's fragments against ``sync_every``, ``sync_delay`` and the model's tensors."""
    if cfg.fragments > cfg.sync_every:
        raise ConfigError(f"fragments must be <= sync_every ({cfg.sync_every}): each of the {cfg.fragments} "
                          f"fragments syncs once every sync_every steps, at least one step apart")
    gap = cfg.sync_every // cfg.fragments
    if cfg.sync_delay >= gap:
        raise ConfigError(f"sync_delay must be < sync_every // fragments = {gap} (one fragment in flight at a "
                          f"time); got {cfg.sync_delay}")
    if cfg.fragments > 1:
        from .. import data, models
        info = data.describe(cfg.dataset, **cfg.data_sizes)
        tensors = models.tensor_count(cfg.model, info.feature_shape, info.num_classes)
        if cfg.fragments > tensors:
            raise ConfigError(f"fragments must be <= the model's {tensors} parameter tensors (a fragment is a "
                              f"run of whole tensors); got {cfg.fragments}")


@dataclass(frozen=True, kw_only=True)
class MasterBased(Algorithm):
    """Rank 0 serves; ranks 1..N-1 train and exchange with it every ``tau`` steps, point to point.

    Its checks (:meth:`check`): at least two ranks, one message per exchange.

    Its arguments, and the errors they may raise, are :class:`Algorithm`'s.

    Attributes:
        family: ``"master-based"``.
        period: the option that sets the steps between exchanges, for the predictor: ``tau``.
    """

    family: ClassVar[str] = "master-based"
    period: ClassVar[str | None] = "tau"

    def check(self, cfg: Any) -> None:
        """The family's checks of a :class:`~workbench.config.RunConfig`, which calls it at construction.

        Args:
            cfg: the configuration (its fields checked one by one already).

        Raises:
            ConfigError: fewer than 2 ranks (rank 0 is the master), or a ``fusion_bytes`` other than unset
                or 0 (a worker sends one message per exchange, or one per tensor).
        """
        if cfg.ranks < 2:
            raise ConfigError(f"ranks must be >= 2 for {cfg.algorithm} (rank 0 is the master)")
        fusion = cfg.communication_options.fusion_bytes
        if fusion not in (None, 0):
            raise ConfigError(f"fusion_bytes: {cfg.algorithm} is master-based: its workers send one message per "
                              f"exchange (fusion_bytes unset) or one per tensor (0); got {fusion!r}")
