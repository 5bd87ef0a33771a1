"""Algorithm names -> implementation and properties: the one place that knows an algorithm by
its name (torch.distributed's comm-hook registry in spirit).

Everything else asks an :class:`AlgorithmSpec`: configuration checks ask which options it uses
(:meth:`AlgorithmSpec.uses`, which reads the option's own declaration in :mod:`workbench.config`)
and whether rank 0 is a master; the worker loop asks for the class
each rank runs (:meth:`AlgorithmSpec.implementation_class`). The implementations live in
``workbench.optim.sync`` and ``workbench.optim.master`` and are named here as ``"module:Class"``
strings, imported on first use: this table stays importable without torch or mpi4py (the
notebook kernel and the CLI read it before any process starts).
"""
from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module

_SYNC, _MASTER, _PERIODIC = "workbench.optim.sync", "workbench.optim.master", "workbench.optim.periodic"


#: learning-rate schedules over a run (``RunConfig.lr_schedule``; :func:`~workbench.optim.rules.scheduled_lr`)
LR_SCHEDULES = ("constant", "cosine", "step")


@dataclass(frozen=True)
class AlgorithmSpec:
    """One training algorithm: what it is and which classes run it.

    Attributes:
        name: the name users give (``RunConfig(algorithm=...)``, ``--algorithm``).
        description: one line, shown by ``workbench algorithms`` and ``wb.algorithms()``.
        implementation: ``"module:Class"`` that every rank runs (synchronous algorithms) or
            that the workers, ranks 1..N-1, run (master-based ones).
        master: ``"module:Class"`` that rank 0 runs in a master-based algorithm; None when
            every rank trains.
        synchronous: lock-step, bitwise deterministic for a seed: the final weights are
            checksummed in ``summary.json``.
        elastic: has a center variable and the elastic coefficient ``rho`` (EASGD family).
        momentum: a momentum variant: its default momentum is > 0; an elastic one takes the
            momentum worker step (MEASGD).
        default_lr, default_momentum: what ``RunConfig(lr=None, momentum=None)`` means for it
            (reach >= 0.88 test accuracy on digits, 4 ranks).
        periodic: the periodic-averaging family (EASGD's descendants, ``workbench.optim.periodic``):
            None for the others; ``"average"``: the workers' models are averaged every
            ``sync_every`` steps (Local SGD); ``"outer"``: an outer optimizer steps on the averaged
            change (DiLoCo); ``"streaming"``: the same, fragment by fragment (Streaming DiLoCo).
    """

    name: str
    description: str
    implementation: str
    master: str | None
    synchronous: bool
    elastic: bool
    momentum: bool
    default_lr: float
    default_momentum: float
    periodic: str | None = None

    @property
    def master_based(self) -> bool:
        """Rank 0 serves (holds the center or the weights); ranks 1..N-1 train."""
        return self.master is not None

    def uses(self, option: str) -> bool:
        """Whether the algorithm uses the RunConfig option ``option`` (its declaration says which
        algorithms do; an option every algorithm uses is used by this one too)."""
        from ..config import options
        return options()[option].used_by(self)

    @property
    def options(self) -> frozenset[str]:
        """The options that only some algorithms use and this one does."""
        from ..config import scoped
        return frozenset(name for name, declared in scoped().items() if declared.used_by(self))

    @property
    def reduces_gradients(self) -> bool:
        """All-reduces gradients in nonblocking buckets (the gradient-communication strategies)."""
        return self.synchronous and not self.elastic and self.periodic is None

    @property
    def outer_optimizer(self) -> bool:
        """Keeps outer weights that an outer optimizer (SGD with Nesterov momentum) moves by the
        workers' averaged change (DiLoCo, Streaming DiLoCo)."""
        return self.periodic in ("outer", "streaming")

    def implementation_class(self, rank: int) -> type:
        """The class ``rank`` runs (imported now: this needs torch and mpi4py). It is built
        with the rank's :class:`~workbench.runtime.rank.context.Context` and has
        ``run(resume_dir=None)``, which returns the final weights."""
        module, _, name = (self.master if self.master_based and rank == 0 else self.implementation).partition(":")
        return getattr(import_module(module), name)


def _spec(name: str, description: str, implementation: str, master: str | None = None, *,
          synchronous: bool = False, elastic: bool = False, momentum: bool = False, lr: float = 0.1,
          periodic: str | None = None) -> AlgorithmSpec:
    return AlgorithmSpec(name, description, implementation, master, synchronous, elastic, momentum,
                         default_lr=lr, default_momentum=0.9 if momentum else 0.0, periodic=periodic)


ALGORITHMS: dict[str, AlgorithmSpec] = {s.name: s for s in [
    _spec("sync-sgd", "synchronous data-parallel SGD: all-reduce of gradients every step",
          f"{_SYNC}:SyncSGD", synchronous=True, momentum=True),
    # the SGD baselines' master applies momentum when it is set (async-msgd sets it by default)
    _spec("async-sgd", "Downpour-style: workers push gradients, the master applies them "
          "first-come-first-served and returns weights",
          f"{_MASTER}:GradientWorker", f"{_MASTER}:Master", lr=0.05),
    _spec("async-msgd", "async-sgd with momentum applied at the master",
          f"{_MASTER}:GradientWorker", f"{_MASTER}:Master", momentum=True, lr=0.02),
    _spec("hogwild-sgd", "async-sgd with one master thread per worker updating the weights "
          "with no lock (racing)",
          f"{_MASTER}:GradientWorker", f"{_MASTER}:HogwildMaster", lr=0.05),
    _spec("easgd", "original EASGD: workers exchange with the master's center in strict "
          "round-robin rank order",
          f"{_MASTER}:RoundRobinElasticWorker", f"{_MASTER}:RoundRobinMaster", elastic=True),
    _spec("async-easgd", "EASGD with a first-come-first-served master holding the center",
          f"{_MASTER}:ElasticWorker", f"{_MASTER}:Master", elastic=True),
    _spec("async-measgd", "async-easgd with momentum workers (MEASGD)",
          f"{_MASTER}:ElasticWorker", f"{_MASTER}:Master", elastic=True, momentum=True, lr=0.02),
    _spec("hogwild-easgd", "EASGD with one master thread per worker updating the center with "
          "no lock (racing)",
          f"{_MASTER}:ElasticWorker", f"{_MASTER}:HogwildMaster", elastic=True),
    _spec("sync-easgd", "lock-step EASGD: all-reduce of worker weights, elastic worker step "
          "and synchronous center step on every rank",
          f"{_SYNC}:SyncEASGD", synchronous=True, elastic=True),
    # EASGD's descendants: periodic averaging, with an outer optimizer in DiLoCo. DiLoCo's inner SGD has no
    # momentum by default: the outer Nesterov momentum (0.9, lr 0.7) on top of an inner momentum of 0.9
    # diverged to chance on LeNet-5/Fashion-MNIST at H = 10, 50 and 100 (benchmarks/descendants.py)
    _spec("local-sgd", "Local SGD: sync_every local momentum-SGD steps on every worker, then the models "
          "averaged (all-reduce); warmup_steps of sync-SGD first make it post-local SGD",
          f"{_PERIODIC}:LocalSGD", synchronous=True, momentum=True, periodic="average"),
    _spec("diloco", "DiLoCo: sync_every inner steps (sgd or adamw), then the outer gradient (outer weights "
          "minus the workers' mean) all-reduced and applied by outer Nesterov SGD; workers restart from it",
          f"{_PERIODIC}:DiLoCo", synchronous=True, periodic="outer"),
    _spec("streaming-diloco", "Streaming DiLoCo: DiLoCo fragment by fragment on a staggered schedule, each "
          "exchange overlapped with sync_delay inner steps, mixed into the local weights by fragment_alpha",
          f"{_PERIODIC}:StreamingDiLoCo", synchronous=True, periodic="streaming"),
]}


def algorithms() -> dict[str, str]:
    """Algorithm name -> one-line description, in the paper's order."""
    return {name: spec.description for name, spec in ALGORITHMS.items()}
