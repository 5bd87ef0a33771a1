"""workbench: a Jupyter-based research workbench for distributed deep-learning training on HPC
clusters (EASGD family against SGD baselines, pluggable and measurable collectives).

Public names::

    import workbench as wb
    cfg = wb.RunConfig(algorithm="sync-easgd", ranks=4, epochs=3)
    with wb.Cluster(n=4) as cluster:        # ipyparallel engines that are MPI ranks
        run = cluster.train(cfg)            # returns at once
        wb.Dashboard(run)                   # live loss, time share per rank, timeline
        result = run.wait()                 # RunResult
    wb.Store().runs()                       # every run, as a DataFrame
    wb.Sweep(cfg, grid={"tau": [1, 4]}, seeds=[0, 1]).run(cluster)
    wb.algorithms()                         # the nine training algorithms
    wb.collectives, wb.allreduce            # schedules, executor, all-reduce over MPI

Heavy parts (mpi4py, torch, pandas, ipyparallel, widgets, plotly) load on first use: importing
workbench, building a ``RunConfig`` and driving a ``Cluster`` never initialise MPI in the
notebook kernel or on a login node (only the ranks do), and ``import workbench`` stays cheap.
"""
from importlib import import_module

from .config import ConfigError, RunConfig
from .optim.registry import algorithms

__version__ = "0.1.0"

_LAZY = {
    "collectives": "workbench",
    "allreduce": "workbench.collectives",
    "RunResult": "workbench.results",
    "Cluster": "workbench.runtime.cluster",
    "Run": "workbench.runtime.run",
    "RunError": "workbench.runtime.run",
    "Dashboard": "workbench.dashboard",
    "Store": "workbench.store",
    "Sweep": "workbench.sweep",
    "SweepPanel": "workbench.dashboard.sweep_panel",
}

__all__ = ["collectives", "allreduce", "algorithms", "RunConfig", "ConfigError", "RunResult",
           *_LAZY, "__version__"]


def __getattr__(name: str):
    if name == "collectives":
        value = import_module("workbench.collectives")
    elif name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'workbench' has no attribute {name!r}")
