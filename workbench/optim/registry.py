"""Algorithm names -> what they are. The implementations live in ``workbench.optim.sync`` and
``workbench.optim.master``; this table is importable without torch or MPI (config validation
uses it before any process starts)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AlgorithmSpec:
    name: str
    description: str
    master_based: bool  # rank 0 serves, ranks 1..N-1 train
    synchronous: bool   # lock-step: deterministic, final weights checksummed
    elastic: bool       # has a center variable and rho
    momentum: bool      # uses the momentum knob


ALGORITHMS: dict[str, AlgorithmSpec] = {s.name: s for s in [
    AlgorithmSpec("sync-sgd", "synchronous data-parallel SGD: all-reduce of gradients every step",
                  False, True, False, True),
    AlgorithmSpec("async-sgd", "Downpour-style: workers push gradients, the master applies them "
                  "first-come-first-served and returns weights", True, False, False, False),
    AlgorithmSpec("async-msgd", "async-sgd with momentum applied at the master", True, False, False, True),
    AlgorithmSpec("hogwild-sgd", "async-sgd with one master thread per worker updating the weights "
                  "with no lock (racing)", True, False, False, False),
    AlgorithmSpec("easgd", "original EASGD: workers exchange with the master's center in strict "
                  "round-robin rank order", True, False, True, False),
    AlgorithmSpec("async-easgd", "EASGD with a first-come-first-served master holding the center",
                  True, False, True, False),
    AlgorithmSpec("async-measgd", "async-easgd with momentum workers (MEASGD)", True, False, True, True),
    AlgorithmSpec("hogwild-easgd", "EASGD with one master thread per worker updating the center with "
                  "no lock (racing)", True, False, True, False),
    AlgorithmSpec("sync-easgd", "lock-step EASGD: all-reduce of worker weights, elastic worker step "
                  "and synchronous center step on every rank", False, True, True, False),
]}


def algorithms() -> dict[str, str]:
    """Algorithm name -> one-line description, in the paper's order."""
    return {name: spec.description for name, spec in ALGORITHMS.items()}
