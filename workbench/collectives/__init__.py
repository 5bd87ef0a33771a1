"""Collective communication: all-reduce algorithms as data, run over MPI.

``Schedule``/``Transfer`` describe an algorithm; ``schedules`` generates them; ``allreduce``
runs one over mpi4py, in place; ``topology`` builds networks and ``simulate`` times a
Schedule on one. See DESIGN.md, "Collectives".

Only ``allreduce`` (and the executor's errors) need MPI: they load ``mpi4py`` on first use,
so importing this package (as ``RunConfig`` and the CLI do) never initialises MPI.
"""
from importlib import import_module

from .names import AUTO, NATIVE, SUPPORTED_DTYPES, algorithm_names, check_algorithm
from .schedule import Schedule, ScheduleError, Transfer, chunk_bounds

#: name -> (module, attribute or None for the module itself), loaded on first use
_LAZY = {
    "schedules": ("schedules", None),
    "topology": ("topology", None),
    "study": ("study", None),
    "simulate": ("simulator", "simulate"),
    "SimResult": ("simulator", "SimResult"),
    "allreduce": ("mpi_allreduce", "allreduce"),
    "UnsupportedDtypeError": ("buffers", "UnsupportedDtypeError"),
    "LengthMismatchError": ("executor", "LengthMismatchError"),
}

__all__ = ["Schedule", "Transfer", "ScheduleError", "schedules", "topology", "simulate", "SimResult",
           "allreduce", "chunk_bounds", "AUTO", "NATIVE",
           "algorithm_names", "check_algorithm", "SUPPORTED_DTYPES", "UnsupportedDtypeError",
           "LengthMismatchError"]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module_name, attribute = _LAZY[name]
    module = import_module(f"{__name__}.{module_name}")
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
