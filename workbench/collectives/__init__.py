"""Collective communication: all-reduce algorithms as data, run over MPI.

``Schedule``/``Transfer`` describe an algorithm; ``schedules`` generates them; ``allreduce``
runs one over mpi4py, in place; ``topology`` builds networks and ``simulate`` times a
Schedule on one. See DESIGN.md, "Collectives".
"""
from . import schedules, topology
from .allreduce import algorithm_names, allreduce, check_algorithm
from .buffers import SUPPORTED_DTYPES, UnsupportedDtypeError
from .executor import LengthMismatchError
from .schedule import Schedule, ScheduleError, Transfer, chunk_bounds
from .simulator import SimResult, simulate

__all__ = ["Schedule", "Transfer", "ScheduleError", "schedules", "topology", "simulate", "SimResult",
           "allreduce", "chunk_bounds",
           "algorithm_names", "check_algorithm", "SUPPORTED_DTYPES", "UnsupportedDtypeError",
           "LengthMismatchError"]
