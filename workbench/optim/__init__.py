"""Optimisation: pure update rules, the algorithm registry, and the implementations
(``sync`` for lock-step algorithms, ``master`` for master-based ones)."""
from . import rules
from .registry import ALGORITHMS, AlgorithmSpec, algorithms

__all__ = ["rules", "ALGORITHMS", "AlgorithmSpec", "algorithms"]
