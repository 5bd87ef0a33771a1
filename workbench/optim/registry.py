"""Algorithm names -> implementation and properties: the one place that knows an algorithm by
its name (torch.distributed's comm-hook registry in spirit).

Everything else asks an :class:`AlgorithmSpec`: configuration checks ask which options it uses
(:meth:`AlgorithmSpec.uses`) and whether rank 0 is a master; the worker loop asks for the class
each rank runs (:meth:`AlgorithmSpec.implementation_class`). The implementations live in
``workbench.optim.sync`` and ``workbench.optim.master`` and are named here as ``"module:Class"``
strings, imported on first use: this table stays importable without torch or mpi4py (the
notebook kernel and the CLI read it before any process starts).
"""
from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module

#: RunConfig options whose meaning depends on the algorithm: an algorithm that does not use one
#: refuses it (:func:`workbench.config.ignored_options`)
OPTIONS = ("collective", "tau", "rho", "momentum", "fusion_bytes", "wire_dtype", "sparse_ratio")

_SYNC, _MASTER = "workbench.optim.sync", "workbench.optim.master"


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
        momentum: a momentum variant: its default momentum is > 0 (``config.DEFAULTS``); an
            elastic one takes the momentum worker step (MEASGD).
        options: the options of :data:`OPTIONS` it uses: ``collective`` (the all-reduce of the
            synchronous algorithms), ``tau`` (the communication period), ``rho``, ``momentum``,
            and the gradient-communication strategies (``fusion_bytes``: the buckets of the
            all-reduce, gradients or weights; ``wire_dtype`` and ``sparse_ratio``: gradients only).
    """

    name: str
    description: str
    implementation: str
    master: str | None
    synchronous: bool
    elastic: bool
    momentum: bool
    options: frozenset[str]

    def __post_init__(self) -> None:
        unknown = set(self.options) - set(OPTIONS)
        if unknown:
            raise ValueError(f"{self.name}: unknown options {sorted(unknown)}; known: {', '.join(OPTIONS)}")

    @property
    def master_based(self) -> bool:
        """Rank 0 serves (holds the center or the weights); ranks 1..N-1 train."""
        return self.master is not None

    def uses(self, option: str) -> bool:
        """Whether the algorithm uses ``option`` (one of :data:`OPTIONS`)."""
        return option in self.options

    def implementation_class(self, rank: int) -> type:
        """The class ``rank`` runs (imported now: this needs torch and mpi4py). It is built
        with the rank's :class:`~workbench.runtime.rank.context.Context` and has
        ``run(resume_dir=None)``, which returns the final weights."""
        module, _, name = (self.master if self.master_based and rank == 0 else self.implementation).partition(":")
        return getattr(import_module(module), name)


def _spec(name: str, description: str, implementation: str, master: str | None = None, *,
          synchronous: bool = False, elastic: bool = False, momentum: bool = False,
          options: tuple[str, ...] = ()) -> AlgorithmSpec:
    return AlgorithmSpec(name, description, implementation, master, synchronous, elastic, momentum,
                         frozenset(options))


ALGORITHMS: dict[str, AlgorithmSpec] = {s.name: s for s in [
    _spec("sync-sgd", "synchronous data-parallel SGD: all-reduce of gradients every step",
          f"{_SYNC}:SyncSGD", synchronous=True, momentum=True,
          options=("collective", "momentum", "fusion_bytes", "wire_dtype", "sparse_ratio")),
    # the SGD baselines' master applies momentum when it is set (async-msgd sets it by default)
    _spec("async-sgd", "Downpour-style: workers push gradients, the master applies them "
          "first-come-first-served and returns weights",
          f"{_MASTER}:GradientWorker", f"{_MASTER}:Master", options=("tau", "momentum")),
    _spec("async-msgd", "async-sgd with momentum applied at the master",
          f"{_MASTER}:GradientWorker", f"{_MASTER}:Master", momentum=True, options=("tau", "momentum")),
    _spec("hogwild-sgd", "async-sgd with one master thread per worker updating the weights "
          "with no lock (racing)",
          f"{_MASTER}:GradientWorker", f"{_MASTER}:HogwildMaster", options=("tau", "momentum")),
    _spec("easgd", "original EASGD: workers exchange with the master's center in strict "
          "round-robin rank order",
          f"{_MASTER}:RoundRobinElasticWorker", f"{_MASTER}:RoundRobinMaster", elastic=True,
          options=("tau", "rho")),
    _spec("async-easgd", "EASGD with a first-come-first-served master holding the center",
          f"{_MASTER}:ElasticWorker", f"{_MASTER}:Master", elastic=True, options=("tau", "rho")),
    _spec("async-measgd", "async-easgd with momentum workers (MEASGD)",
          f"{_MASTER}:ElasticWorker", f"{_MASTER}:Master", elastic=True, momentum=True,
          options=("tau", "rho", "momentum")),
    _spec("hogwild-easgd", "EASGD with one master thread per worker updating the center with "
          "no lock (racing)",
          f"{_MASTER}:ElasticWorker", f"{_MASTER}:HogwildMaster", elastic=True, options=("tau", "rho")),
    _spec("sync-easgd", "lock-step EASGD: all-reduce of worker weights, elastic worker step "
          "and synchronous center step on every rank",
          f"{_SYNC}:SyncEASGD", synchronous=True, elastic=True,
          options=("collective", "tau", "rho", "fusion_bytes")),
]}


def algorithms() -> dict[str, str]:
    """Algorithm name -> one-line description, in the paper's order."""
    return {name: spec.description for name, spec in ALGORITHMS.items()}
