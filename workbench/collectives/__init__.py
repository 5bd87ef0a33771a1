"""Collective communication: all-reduce algorithms as data, run over MPI.

``Schedule``/``Transfer`` describe an algorithm; ``schedules`` generates them; ``allreduce``
runs one over mpi4py, in place. See DESIGN.md, "Collectives".
"""
from . import schedules
from .allreduce import algorithm_names, allreduce, check_algorithm
from .buffers import SUPPORTED_DTYPES, UnsupportedDtypeError
from .executor import LengthMismatchError
from .schedule import Schedule, ScheduleError, Transfer, chunk_bounds

__all__ = ["Schedule", "Transfer", "ScheduleError", "schedules", "allreduce", "chunk_bounds",
           "algorithm_names", "check_algorithm", "SUPPORTED_DTYPES", "UnsupportedDtypeError",
           "LengthMismatchError"]
