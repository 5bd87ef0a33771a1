"""All-reduce algorithms as data: a :class:`Schedule` is steps of :class:`Transfer`\\ s.

Pure Python (networkx only for the topology-aware MultiTree, loaded on first use): the executor
over MPI (:mod:`workbench.comm`), the network simulator (:mod:`workbench.netsim`) and the
pictures (:mod:`workbench.dashboard.pictures`) all take these objects.

    from workbench import schedules
    s = schedules.ring(4)                 # also recursive_doubling, halving_doubling, binary_tree,
    s.nranks, s.nchunks, s.steps          # double_binary_tree, linear, ring_2d, multitree(topo, k)

``SCHEDULES`` maps the names that take only a rank count to their generators (``ALGORITHMS``, the
old name, still works for one release with a DeprecationWarning).
"""
from ..lazy import lazy
from .generators import (SCHEDULES, binary_tree, double_binary_tree, double_binary_trees, halving_doubling,
                         linear, nccl_btree, recursive_doubling, ring, tree_schedule)
from .schedule import Schedule, ScheduleError, Transfer, chunk_bounds, make_schedule

__all__ = ["Schedule", "Transfer", "ScheduleError", "chunk_bounds", "make_schedule", "SCHEDULES", "ring",
           "recursive_doubling", "halving_doubling", "binary_tree", "double_binary_tree", "double_binary_trees",
           "nccl_btree", "linear", "tree_schedule", "multitree", "ring_2d", "multitree_trees"]

# the topology-aware schedules load networkx on first use, so checking an algorithm name stays
# cheap in the notebook kernel and the CLI
__getattr__, __dir__ = lazy(__name__, {**{name: (".topology_aware", name)
                                          for name in ("multitree", "ring_2d", "multitree_trees")},
                                       "ALGORITHMS": (".generators", "ALGORITHMS")})  # deprecated: SCHEDULES
