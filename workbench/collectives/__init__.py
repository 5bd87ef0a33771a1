"""The collectives facade (docs/architecture.md, "Public contracts"): one import for the public names of four packages.

    from workbench.collectives import Schedule, Transfer, schedules, allreduce, topology, simulate

``Schedule``/``Transfer``/``schedules`` come from :mod:`workbench.schedules` (algorithms as data),
``topology`` is :mod:`workbench.network.topology`, ``simulate`` from :mod:`workbench.netsim` and
``allreduce`` from :mod:`workbench.comm` (the only one that needs MPI: loaded on first use, so
importing this facade never initialises MPI).
"""
from ..comm.names import AUTO, NATIVE, SUPPORTED_DTYPES, algorithm_names, check_algorithm
from ..lazy import lazy
from ..schedules.schedule import Schedule, ScheduleError, Transfer, chunk_bounds

__getattr__, __dir__ = lazy(__name__, {
    "schedules": ("workbench.schedules", None),
    "topology": ("workbench.network.topology", None),
    "study": ("workbench.netsim.study", None),
    "simulate": ("workbench.netsim.simulator", "simulate"),
    "SimResult": ("workbench.netsim.simulator", "SimResult"),
    "allreduce": ("workbench.comm.mpi_allreduce", "allreduce"),
    "UnsupportedDtypeError": ("workbench.comm.buffers", "UnsupportedDtypeError"),
    "LengthMismatchError": ("workbench.comm.executor", "LengthMismatchError"),
})

__all__ = ["Schedule", "Transfer", "ScheduleError", "schedules", "topology", "simulate", "SimResult",
           "allreduce", "chunk_bounds", "AUTO", "NATIVE",
           "algorithm_names", "check_algorithm", "SUPPORTED_DTYPES", "UnsupportedDtypeError",
           "LengthMismatchError", "study"]
