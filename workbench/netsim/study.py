"""Compare all-reduce schedules on a simulated network: the MultiTree paper's study as a function.

    from workbench.collectives import study, topology
    frame = study.compare(topology.torus(8, 8), sizes=[32 << 10, 64 << 20])
    study.speedups(frame)                         # speed-up over ring per algorithm and size

``schedule_on(name, topo)`` builds a schedule laid out for the network: ``ring`` follows the
topology's ring embedding (the snake on a grid), ``ring_2d`` / ``ring_2d_bidir`` use the grid's
shape (or the most square factorisation of the rank count), ``multitree`` grows its trees on
the topology; the other names are :data:`~workbench.schedules.generators.SCHEDULES`.
"""
from __future__ import annotations

import math
import time
from typing import Iterable, Sequence

import pandas as pd

from .. import schedules
from ..network import topology
from ..schedules.topology_aware import multitree, ring_2d
from ..schedules.schedule import Schedule
from ..sizes import format_size as size_label  # noqa: F401 - study.size_label, as notebooks call it
from .simulator import MODES, SimulationError, PAPER_BANDWIDTH, PAPER_LATENCY, simulate
from ..network.topology import Topology

from .names import PAPER_ALGORITHMS, SIM_ALGORITHMS  # noqa: F401 - study.PAPER_ALGORITHMS, as notebooks use it
#: The paper's message sizes: 32 KiB to 64 MiB.
PAPER_SIZES = (32 << 10, 128 << 10, 512 << 10, 2 << 20, 8 << 20, 64 << 20)
#: MultiTree's all-gather steps T from the public construction code: (torus side, k) -> T.
PAPER_TREE_STEPS = {(4, 2): 7, (4, 3): 6, (4, 5): 5, (8, 2): 18, (8, 3): 17, (8, 5): 17}
#: The networks of the paper's evaluation (fat tree: 8 leaves of 8, full bisection).
PAPER_NETWORKS = {
    "torus 4x4": lambda: topology.torus(4, 4), "torus 8x8": lambda: topology.torus(8, 8),
    "mesh 4x4": lambda: topology.mesh(4, 4), "mesh 8x8": lambda: topology.mesh(8, 8),
    "fat-tree 64": lambda: topology.fat_tree(64, nodes_per_leaf=8),
    "BiGraph 32": lambda: topology.bigraph(32, switches_per_layer=4),
}
#: What the paper reports, for tables that put our numbers beside it.
PAPER_CLAIMS = {
    "torus 8x8": "MultiTree 2.2x over ring (2.3x with message-based flow control), 1.51x (1.56x) over 2D ring; "
                 "double binary tree worst",
    "mesh 8x8": "double binary tree worst",
    "fat-tree 64": "methods converge at large messages; MultiTree best at small ones",
    "BiGraph 32": "methods converge at large messages; MultiTree best at small ones",
}


def grid_shape(topo: Topology) -> tuple[int, int]:
    """``(rows, cols)`` for a 2D ring: the grid's own shape, else the most square factorisation."""
    if len(topo.dims) == 2:
        return topo.dims
    n = topo.nodes
    rows = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
    return rows, n // rows


def schedule_on(name: str, topo: Topology, k: int = 2) -> Schedule:
    """The schedule ``name`` laid out for ``topo`` (see the module's text)."""
    if name not in SIM_ALGORITHMS:
        raise SimulationError(f"unknown algorithm {name!r}; allowed: {', '.join(SIM_ALGORITHMS)}")
    n = topo.nodes
    if name == "ring":
        return schedules.ring(n, topo.ring_order())
    if name in ("ring_2d", "ring_2d_bidir"):
        return ring_2d(*grid_shape(topo), bidirectional=name == "ring_2d_bidir")
    if name == "multitree":
        return multitree(topo, k)
    return schedules.SCHEDULES[name](n)


def compare(topo: Topology, algorithms: Sequence[str] = PAPER_ALGORITHMS, sizes: Iterable[int] = PAPER_SIZES,
            link_bandwidth: float = PAPER_BANDWIDTH, link_latency: float = PAPER_LATENCY,
            mode: str = "lockstep", k: int = 2, step_overhead: float = 0.0,
            node_bandwidth: float | None = None) -> pd.DataFrame:
    """One row per (algorithm, size): ``seconds``, ``steps``, ``speedup_vs_ring`` (when ring is
    among the algorithms), ``build_s`` (seconds to build the schedule) and ``busbw_GBps``.
    The link and node parameters are :func:`~workbench.netsim.simulator.simulate`'s."""
    if mode not in MODES:
        raise SimulationError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    sizes = [int(s) for s in sizes]
    if not sizes or any(s <= 0 for s in sizes):
        raise SimulationError(f"sizes must be positive byte counts, got {sizes}")
    bad = [a for a in algorithms if a not in SIM_ALGORITHMS]
    if bad or not algorithms:
        raise SimulationError(f"unknown algorithm(s) {bad}; allowed: {', '.join(SIM_ALGORITHMS)}")
    rows = []
    n = topo.nodes
    for name in algorithms:
        start = time.perf_counter()
        schedule = schedule_on(name, topo, k)
        build = time.perf_counter() - start
        for size in sizes:
            result = simulate(schedule, topo, size, link_bandwidth, link_latency, step_overhead, mode=mode,
                              node_bandwidth=node_bandwidth)
            rows.append({"algorithm": name, "bytes": size, "seconds": result.seconds,
                         "steps": schedule.num_steps, "max_link_flows": result.max_link_flows,
                         "busbw_GBps": size / result.seconds * 2 * (n - 1) / n / 1e9 if result.seconds else 0.0,
                         "build_s": build})
    frame = pd.DataFrame(rows)
    if "ring" in algorithms:
        ring = frame[frame["algorithm"] == "ring"].set_index("bytes")["seconds"]
        frame["speedup_vs_ring"] = frame["bytes"].map(ring) / frame["seconds"]
    return frame


def interface_sweep(topo: Topology, links: Sequence[float | None] = (None, 4, 3, 2.5, 2.25, 2, 1.5, 1),
                    nbytes: int = 64 << 20, link_bandwidth: float = PAPER_BANDWIDTH) -> pd.DataFrame:
    """MultiTree's speed-up over ring and the two 2D rings as one rank's interface bandwidth
    (``node_bandwidth``) shrinks, given in multiples of one link (``None``: unlimited)."""
    built = {name: schedule_on(name, topo) for name in ("ring", "ring_2d", "ring_2d_bidir", "multitree")}
    rows = []
    for count in links:
        nic = None if count is None else count * link_bandwidth
        t = {name: simulate(s, topo, nbytes, link_bandwidth, node_bandwidth=nic).seconds for name, s in built.items()}
        rows.append({"interface (links)": "unlimited" if count is None else count,
                     "multitree / ring": t["ring"] / t["multitree"],
                     "multitree / 2D ring": t["ring_2d"] / t["multitree"],
                     "multitree / 2D ring (both ways)": t["ring_2d_bidir"] / t["multitree"]})
    return pd.DataFrame(rows)


def speedups(frame: pd.DataFrame) -> pd.DataFrame:
    """Speed-up over ring as a table: algorithms down, sizes across."""
    if "speedup_vs_ring" not in frame:
        raise SimulationError("speedups: the comparison has no ring rows to compare with")
    table = frame.pivot(index="algorithm", columns="bytes", values="speedup_vs_ring")
    table = table.reindex([a for a in dict.fromkeys(frame["algorithm"])])
    table.columns = [size_label(c) for c in table.columns]
    return table
