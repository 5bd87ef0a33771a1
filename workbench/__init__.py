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
    wb.Dashboard(wb.watch("run-id"))        # a run `workbench train` or an sbatch job records, as it goes
    wb.Sweep(cfg, grid={"tau": [1, 4]}, seeds=[0, 1]).run(cluster)
    wb.algorithms()                         # the nine training algorithms
    wb.collectives, wb.allreduce            # schedules, executor, all-reduce over MPI
    with wb.VirtualCluster("vc", nodes=4, bandwidth="100mbit") as vc:   # namespaced nodes, shaped links
        wb.Cluster(n=4, vcluster=vc)        # engines on its nodes

Heavy parts (mpi4py, torch, pandas, ipyparallel, widgets, plotly) load on first use: importing
workbench, building a ``RunConfig`` and driving a ``Cluster`` never initialise MPI in the
notebook kernel or on a login node (only the ranks do), and ``import workbench`` stays cheap.
"""
from .config import ConfigError, RunConfig
from .lazy import lazy
from .optim.registry import algorithms

__version__ = "0.1.0"

__getattr__, __dir__ = lazy(__name__, {
    "collectives": (".collectives", None),
    "allreduce": (".comm.mpi_allreduce", "allreduce"),
    "RunResult": (".results", "RunResult"),
    "Cluster": (".runtime.client.cluster", "Cluster"),
    "Run": (".runtime.client.run", "Run"),
    "RunError": (".runtime.client.run", "RunError"),
    "watch": (".runtime.client.watch", "watch"),
    "Dashboard": (".dashboard", "Dashboard"),
    "Store": (".store", "Store"),
    "Sweep": (".sweep", "Sweep"),
    "SweepPanel": (".dashboard.sweep_panel", "SweepPanel"),
    "VirtualCluster": (".vcluster", "VirtualCluster"),
})

__all__ = ["collectives", "allreduce", "algorithms", "RunConfig", "ConfigError", "RunResult", "Cluster", "Run",
           "RunError", "watch", "Dashboard", "Store", "Sweep", "SweepPanel", "VirtualCluster", "__version__"]
