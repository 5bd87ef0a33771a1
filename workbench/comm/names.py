"""The names ``allreduce`` accepts, importable without MPI or torch.

Configuration checks (``RunConfig``, the CLI) run in the notebook kernel and on login nodes,
where importing ``mpi4py.MPI`` would initialise MPI; they read the names from here.
"""
from __future__ import annotations

from .. import schedules

NATIVE = "native"
AUTO = "auto"

#: dtypes the collectives accept, by their numpy/torch names.
SUPPORTED_DTYPES = ("float64", "float32", "float16", "bfloat16", "int64", "int32")


def algorithm_names() -> list[str]:
    """Every value ``allreduce``'s ``algorithm`` accepts."""
    return [AUTO, NATIVE, *schedules.SCHEDULES]


def check_algorithm(algorithm: str) -> str:
    """Return ``algorithm`` if valid, else raise ``ValueError`` listing the valid names."""
    if not isinstance(algorithm, str) or (algorithm not in schedules.SCHEDULES
                                          and algorithm not in (AUTO, NATIVE)):
        raise ValueError(f"algorithm must be one of {', '.join(algorithm_names())}; "
                         f"got {algorithm!r}")
    return algorithm
