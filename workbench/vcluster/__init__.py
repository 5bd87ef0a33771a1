"""A virtual HPC cluster on one machine: nodes as Linux namespaces joined by shaped links.

    import workbench as wb
    with wb.VirtualCluster("vc", nodes=4, bandwidth="100mbit") as vc:
        with wb.Cluster(n=4, vcluster=vc) as cluster:
            cluster.train(cfg).wait()

``plan`` (pure: names, addresses, routes, rates), ``wiring`` (namespaces, cables, shaping),
``cluster`` (:class:`VirtualCluster`), ``slurm`` (a Slurm across the nodes), ``rootless`` (the
same inside a user namespace).
"""
from .cluster import MPI_ENV, VirtualCluster
from .plan import PlanError
from .tools import VirtualClusterError

__all__ = ["VirtualCluster", "VirtualClusterError", "PlanError", "MPI_ENV"]
