"""The training algorithms: the registry is the list of their definitions
(:class:`~workbench.optim.definition.Algorithm`, one object each), and the one place that knows an
algorithm by its name (torch.distributed's comm-hook registry in spirit).

Everything else asks a definition: configuration checks ask which options it takes and its own
checks, the worker loop asks for the class each rank runs, the predictor asks how it communicates,
the dashboard what its evaluated weights are. A researcher's own algorithm is a definition in their
own module, named as ``"package.module:NAME"`` wherever a built-in name goes (:func:`definition_of`).

The implementations live in ``workbench.optim.sync``, ``.master`` and ``.periodic`` and are named
as ``"module:Class"`` strings, imported on first use: this table stays importable without torch or
mpi4py (the notebook kernel and the CLI read it before any process starts).
"""
from __future__ import annotations

import importlib

from .definition import (COLLECTIVE, ELASTIC, GRADIENT_STRATEGIES, INNER, MOMENTUM, OUTER, PERIOD, STREAMING,
                         Algorithm, LockStep, MasterBased, Periodic)

_SYNC, _MASTER, _PERIODIC = "workbench.optim.sync", "workbench.optim.master", "workbench.optim.periodic"


#: kept for the names the code used before the definitions (issue 43): an algorithm's entry
AlgorithmSpec = Algorithm

# the SGD baselines' master applies momentum when it is set (async-msgd sets it by default)
_SGD_MASTER = frozenset(PERIOD + MOMENTUM)
_EASGD_MASTER = frozenset(PERIOD + ELASTIC)
_DESCENDANTS = frozenset(COLLECTIVE + MOMENTUM + INNER)

ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in [
    LockStep(name="sync-sgd", description="synchronous data-parallel SGD: all-reduce of gradients every step",
             worker=f"{_SYNC}:SyncSGD", default_momentum=0.9, exchange="gradients",
             options=COLLECTIVE + MOMENTUM + GRADIENT_STRATEGIES),
    MasterBased(name="async-sgd", description="Downpour-style: workers push gradients, the master applies them "
                "first-come-first-served and returns weights",
                worker=f"{_MASTER}:GradientWorker", master=f"{_MASTER}:Master", default_lr=0.05, options=_SGD_MASTER),
    MasterBased(name="async-msgd", description="async-sgd with momentum applied at the master",
                worker=f"{_MASTER}:GradientWorker", master=f"{_MASTER}:Master", default_lr=0.02,
                default_momentum=0.9, options=_SGD_MASTER),
    MasterBased(name="hogwild-sgd", description="async-sgd with one master thread per worker updating the weights "
                "with no lock (racing)",
                worker=f"{_MASTER}:GradientWorker", master=f"{_MASTER}:HogwildMaster", default_lr=0.05,
                options=_SGD_MASTER),
    MasterBased(name="easgd", description="original EASGD: workers exchange with the master's center in strict "
                "round-robin rank order",
                worker=f"{_MASTER}:RoundRobinElasticWorker", master=f"{_MASTER}:RoundRobinMaster",
                options=_EASGD_MASTER, exchange="round-robin"),
    MasterBased(name="async-easgd", description="EASGD with a first-come-first-served master holding the center",
                worker=f"{_MASTER}:ElasticWorker", master=f"{_MASTER}:Master", options=_EASGD_MASTER),
    MasterBased(name="async-measgd", description="async-easgd with momentum workers (MEASGD)",
                worker=f"{_MASTER}:ElasticWorker", master=f"{_MASTER}:Master", default_lr=0.02,
                default_momentum=0.9, options=_EASGD_MASTER | set(MOMENTUM)),
    MasterBased(name="hogwild-easgd", description="EASGD with one master thread per worker updating the center "
                "with no lock (racing)",
                worker=f"{_MASTER}:ElasticWorker", master=f"{_MASTER}:HogwildMaster", options=_EASGD_MASTER),
    LockStep(name="sync-easgd", description="lock-step EASGD: all-reduce of worker weights, elastic worker step "
             "and synchronous center step on every rank",
             worker=f"{_SYNC}:SyncEASGD", exchange="weights", options=COLLECTIVE + ELASTIC + PERIOD),
    # EASGD's descendants: periodic averaging, with an outer optimizer in DiLoCo. DiLoCo's inner SGD has no
    # momentum by default: the outer Nesterov momentum (0.9, lr 0.7) on top of an inner momentum of 0.9
    # diverged to chance on LeNet-5/Fashion-MNIST at H = 10, 50 and 100 (benchmarks/descendants.py)
    Periodic(name="local-sgd", description="Local SGD: sync_every local momentum-SGD steps on every worker, then "
             "the models averaged (all-reduce); warmup_steps of sync-SGD first make it post-local SGD",
             worker=f"{_PERIODIC}:LocalSGD", default_momentum=0.9, exchange="average", options=_DESCENDANTS),
    Periodic(name="diloco", description="DiLoCo: sync_every inner steps (sgd or adamw), then the outer gradient "
             "(outer weights minus the workers' mean) all-reduced and applied by outer Nesterov SGD; workers "
             "restart from it",
             worker=f"{_PERIODIC}:DiLoCo", exchange="outer", options=_DESCENDANTS | set(OUTER)),
    Periodic(name="streaming-diloco", description="Streaming DiLoCo: DiLoCo fragment by fragment on a staggered "
             "schedule, each exchange overlapped with sync_delay inner steps, mixed into the local weights by "
             "fragment_alpha",
             worker=f"{_PERIODIC}:StreamingDiLoCo", exchange="streaming",
             options=_DESCENDANTS | set(OUTER) | set(STREAMING)),
]}


class UnknownAlgorithm(ValueError):
    """A name that is neither built in nor a definition in an importable module; one line."""


def definition_of(name: object) -> Algorithm:
    """The definition an algorithm name stands for: a built-in name, or ``"package.module:NAME"``
    for a researcher's own :class:`~workbench.optim.definition.Algorithm` in their module (imported
    now; the module must not need MPI to import). :class:`UnknownAlgorithm` (one line) otherwise."""
    if isinstance(name, str) and name in ALGORITHMS:
        return ALGORITHMS[name]
    if not isinstance(name, str) or name.count(":") != 1:
        raise UnknownAlgorithm(f"algorithm must be one of {', '.join(ALGORITHMS)} or 'package.module:NAME' (an "
                               f"Algorithm defined in your module); got {name!r}")
    module, _, attribute = name.partition(":")
    try:
        found = getattr(importlib.import_module(module), attribute, None)
    except Exception as exc:  # noqa: BLE001 - a module that raises while importing is as bad as a missing one
        text = str(exc).strip().splitlines()
        raise UnknownAlgorithm(f"algorithm {name!r}: cannot import {module!r}: {type(exc).__name__}: "
                               f"{text[0] if text else ''}".rstrip(": ")) from None
    if not isinstance(found, Algorithm):
        raise UnknownAlgorithm(f"algorithm {name!r}: {module}.{attribute} is "
                               + ("missing" if found is None else f"a {type(found).__name__}")
                               + ", not an Algorithm (workbench.optim.LockStep, Periodic or MasterBased)")
    return found


def known_definition(name: object) -> Algorithm | None:
    """:func:`definition_of`, or None where the name stands for none (a stored run whose module is
    gone: the dashboard and the results then draw it without what its definition would add)."""
    try:
        return definition_of(name)
    except UnknownAlgorithm:
        return None


def algorithms() -> dict[str, str]:
    """Algorithm name -> one-line description, in the paper's order."""
    return {name: spec.description for name, spec in ALGORITHMS.items()}
