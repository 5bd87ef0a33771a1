"""Networks: topologies (torus, mesh, ring, fully connected, bus, switch, fat-tree, BiGraph) and the routes
messages take through them. Pure Python + networkx; the simulator (:mod:`workbench.netsim`) and
the topology-aware schedules (:mod:`workbench.schedules`) build on it."""
from .topology import (KINDS, Topology, TopologyError, bigraph, bus, fat_tree, fully_connected, lower_bound_steps,
                       mesh, parse, ring, switch, torus)

__all__ = ["Topology", "TopologyError", "KINDS", "parse", "ring", "fully_connected", "bus", "switch", "torus", "mesh",
           "fat_tree", "bigraph", "lower_bound_steps"]
