"""Optimisation: pure update rules, the algorithm registry, and the implementations
(``sync`` for lock-step algorithms, ``master`` for master-based ones).

``rules`` (torch) loads on first use: the registry is read by configuration checks in the
notebook kernel and the CLI, which should not pay for importing torch.
"""
from importlib import import_module

from .registry import ALGORITHMS, AlgorithmSpec, algorithms

__all__ = ["rules", "ALGORITHMS", "AlgorithmSpec", "algorithms"]


def __getattr__(name: str):
    if name in ("rules", "sync", "master"):
        return import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
