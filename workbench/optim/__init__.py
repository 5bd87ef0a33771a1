"""Optimisation: pure update rules, the algorithm registry, and the implementations
(``sync`` for lock-step algorithms, ``master`` for master-based ones, ``periodic`` for the
periodic-averaging family: Local SGD, DiLoCo, Streaming DiLoCo).

``rules`` (torch) loads on first use: the registry is read by configuration checks in the
notebook kernel and the CLI, which should not pay for importing torch.
"""
from ..lazy import lazy
from .definition import Algorithm, LockStep, MasterBased, Periodic
from .registry import ALGORITHMS, AlgorithmSpec, algorithms, definition_of

__getattr__, __dir__ = lazy(__name__, {name: (f".{name}", None) for name in ("rules", "sync", "master", "periodic", "fragments")})

__all__ = ["rules", "fragments", "ALGORITHMS", "Algorithm", "AlgorithmSpec", "LockStep", "MasterBased", "Periodic",
           "algorithms", "definition_of"]
