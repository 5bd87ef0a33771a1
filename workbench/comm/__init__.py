"""Execution over MPI: the flat buffers, the schedule executor, ``allreduce`` with ``auto`` (an
ordered list of implementations) and its tuning table, and the nonblocking ``iallreduce``
(:mod:`~workbench.comm.nonblocking`), and the gradient-communication strategies: fusion and overlap
(:mod:`~workbench.comm.strategies`), wire precision and sparse communication as hooks
(:mod:`~workbench.comm.hooks`).

Only what runs on ranks needs ``mpi4py``: the names (:mod:`~workbench.comm.names`) are pure, and
everything else loads on first use, so ``RunConfig`` and the CLI can check names without MPI.
"""
from ..lazy import lazy
from .names import AUTO, NATIVE, SUPPORTED_DTYPES, algorithm_names, check_algorithm

__getattr__, __dir__ = lazy(__name__, {
    "allreduce": (".mpi_allreduce", "allreduce"),
    "FlatBuffer": (".buffers", "FlatBuffer"),
    "UnsupportedDtypeError": (".buffers", "UnsupportedDtypeError"),
    "LengthMismatchError": (".executor", "LengthMismatchError"),
    "iallreduce": (".nonblocking", "iallreduce"),
    "Handle": (".nonblocking", "Handle"),
    "progress": (".nonblocking", "progress"),
    "waitall": (".nonblocking", "waitall"),
})

__all__ = ["AUTO", "NATIVE", "SUPPORTED_DTYPES", "algorithm_names", "check_algorithm", "allreduce", "FlatBuffer",
           "UnsupportedDtypeError", "LengthMismatchError", "iallreduce", "Handle", "progress", "waitall"]
