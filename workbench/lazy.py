"""Names that load on first use, for packages whose heavy parts (mpi4py, torch, pandas, plotly)
must not load with the package: ``import workbench`` stays cheap and never initialises MPI.

    __getattr__, __dir__ = lazy(__name__, {"allreduce": (".mpi_allreduce", "allreduce"),
                                           "rules": (".rules", None)})   # None: the module itself
"""
from __future__ import annotations

import sys
from importlib import import_module
from typing import Callable


def lazy(package: str, table: dict[str, tuple[str, str | None]]) -> tuple[Callable, Callable]:
    """A module ``__getattr__`` and ``__dir__`` for ``package``: ``table`` maps a name to (module,
    relative to ``package`` when it starts with a dot; attribute, or None for the module). A name
    is imported once, then kept in the package's namespace."""
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str):
        try:
            module_name, attribute = table[name]
        except KeyError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        module = import_module(module_name, package)
        value = module if attribute is None else getattr(module, attribute)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(table))

    return __getattr__, __dir__
