"""Time a :class:`~workbench.collectives.schedule.Schedule` on a :class:`~workbench.collectives.
topology.Topology` instead of running it on MPI.

Lock-step model (the one that matches MultiTree's hardware: every network interface runs its
schedule table step by step): each transfer of a step is a flow routed over the topology; the
bytes of all flows that cross a directed link in that step share its bandwidth; a flow takes
``max over its links (bytes on the link) / bandwidth + hops * latency``; a step takes as long as
its slowest flow (plus ``step_overhead``); the all-reduce is the sum of its steps. With one flow
per link this is exactly the textbook alpha-beta cost, e.g. ring ``2(n-1)(alpha + S/(n B))``.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from .schedule import Schedule, ScheduleError
from .topology import Topology

PAPER_BANDWIDTH = 16e9   # bytes/s per link (MultiTree paper)
PAPER_LATENCY = 150e-9   # seconds per hop


@dataclass
class SimResult:
    """``seconds``: total time; ``step_seconds``: per step; ``link_bytes``: bytes per directed
    link over the whole all-reduce; ``max_link_flows``: most flows sharing one link in a step."""

    seconds: float
    step_seconds: list[float]
    link_bytes: dict[tuple[int, int], float]
    max_link_flows: int
    link_bandwidth: float

    def link_utilisation(self) -> dict[tuple[int, int], float]:
        """Fraction of the all-reduce's time each link was busy sending (0..1)."""
        if self.seconds <= 0:
            return {link: 0.0 for link in self.link_bytes}
        return {link: b / self.link_bandwidth / self.seconds for link, b in self.link_bytes.items()}


def simulate(schedule: Schedule, topo: Topology, nbytes: float, link_bandwidth: float = PAPER_BANDWIDTH,
             link_latency: float = PAPER_LATENCY, step_overhead: float = 0.0) -> SimResult:
    """Seconds for ``schedule`` to all-reduce ``nbytes`` bytes on ``topo`` (lock-step model).

    ``link_bandwidth`` in bytes/s, ``link_latency`` and ``step_overhead`` in seconds. Rank ``i``
    of the schedule is node ``i`` of the topology.
    """
    if schedule.nranks > topo.nodes:
        raise ScheduleError(f"schedule has {schedule.nranks} ranks but the {topo.kind} has only "
                            f"{topo.nodes} nodes")
    if link_bandwidth <= 0 or link_latency < 0 or nbytes < 0:
        raise ScheduleError("simulate: link_bandwidth must be > 0, link_latency and nbytes >= 0")
    chunk = nbytes / schedule.nchunks
    steps, total_link_bytes, worst = [], Counter(), 0
    for step in schedule.steps:
        routes = [topo.route(t.src, t.dst) for t in step]
        load, flows = Counter(), Counter()
        for route in routes:
            for link in route:
                load[link] += chunk
                flows[link] += 1
        total_link_bytes.update(load)
        worst = max(worst, max(flows.values(), default=0))
        slowest = max((max(load[l] for l in r) / link_bandwidth + len(r) * link_latency
                       for r in routes if r), default=0.0)
        steps.append(slowest + step_overhead)
    return SimResult(sum(steps), steps, dict(total_link_bytes), worst, link_bandwidth)
