"""Time a :class:`~workbench.schedules.schedule.Schedule` on a :class:`~workbench.collectives.
topology.Topology` instead of running it on MPI.

Two models, chosen with ``mode``:

``"lockstep"`` (default; the one that matches the MultiTree paper, whose network interfaces run
their schedule tables step by step): each transfer of a step is a flow routed over the topology;
the bytes of all flows that cross a directed link in that step share its bandwidth; a flow takes
``max over its links (bytes on the link) / bandwidth + hops * latency``; a step takes as long as
its slowest flow (plus ``step_overhead``); the all-reduce is the sum of its steps. With one flow
per link this is exactly the textbook alpha-beta cost, e.g. ring ``2(n-1)(alpha + S/(n B))``.

``"flow"`` (how the MPI executor runs a schedule: no global barrier): every rank works through
its own steps in order; a transfer starts once its sender and its receiver have finished all
their transfers of earlier steps (plus ``step_overhead`` per step), spends ``hops * latency``
in flight and then shares the links of its route with every other transmitting flow, max-min
fairly (progressive filling), recomputed whenever a flow starts or ends. Ranks that are ahead
run ahead, so it is never slower than lock-step on a contention-free schedule, and contended
links are shared by bandwidth, not by whole steps.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

from ..schedules.schedule import Schedule
from ..network.topology import Topology

PAPER_BANDWIDTH = 16e9   # bytes/s per link (MultiTree paper)
PAPER_LATENCY = 150e-9   # seconds per hop


class SimulationError(ValueError):
    """A simulation asked for with arguments it cannot take (mode, sizes, a schedule too big for
    the network); the message names the argument."""


@dataclass
class SimResult:
    """``seconds``: total time; ``step_seconds``: per step; ``link_bytes``: bytes per directed
    link over the whole all-reduce; ``max_link_flows``: most flows sharing one link in a step."""

    seconds: float
    step_seconds: list[float]
    link_bytes: dict[tuple[int, int], float]
    max_link_flows: int
    link_bandwidth: float
    mode: str = "lockstep"

    def link_utilisation(self) -> dict[tuple[int, int], float]:
        """Fraction of the all-reduce's time each link was busy sending (0..1)."""
        if self.seconds <= 0:
            return {link: 0.0 for link in self.link_bytes}
        return {link: b / self.link_bandwidth / self.seconds for link, b in self.link_bytes.items()}


MODES = ("lockstep", "flow")


def simulate(schedule: Schedule, topo: Topology, nbytes: float, link_bandwidth: float = PAPER_BANDWIDTH,
             link_latency: float = PAPER_LATENCY, step_overhead: float = 0.0,
             mode: str = "lockstep", node_bandwidth: float | None = None) -> SimResult:
    """Seconds for ``schedule`` to all-reduce ``nbytes`` bytes on ``topo``.

    ``link_bandwidth`` in bytes/s, ``link_latency`` (per hop) and ``step_overhead`` (per step)
    in seconds; ``mode`` is ``"lockstep"`` or ``"flow"`` (see the module's text). Rank ``i`` of
    the schedule is node ``i`` of the topology.

    ``node_bandwidth`` (bytes/s, default unlimited) caps what one rank's network interface
    injects in total over all its links, and separately what it receives: the transfers a rank
    sends at the same time share it, as the flows on a link share the link. A torus node with
    four links of 16 GB/s whose interface moves 32 GB/s is ``node_bandwidth=32e9``.
    """
    if mode not in MODES:
        raise SimulationError(f"simulate: mode must be one of {', '.join(MODES)}, got {mode!r}")
    if schedule.nranks > topo.nodes:
        raise SimulationError(f"schedule has {schedule.nranks} ranks but the {topo.kind} has only "
                            f"{topo.nodes} nodes")
    for name, value, low in (("link_bandwidth", link_bandwidth, "> 0"), ("link_latency", link_latency, ">= 0"),
                             ("step_overhead", step_overhead, ">= 0"), ("nbytes", nbytes, ">= 0"),
                             ("node_bandwidth", 1.0 if node_bandwidth is None else node_bandwidth, "> 0")):
        if not isinstance(value, (int, float)) or value < 0 or (low == "> 0" and value == 0):
            raise SimulationError(f"simulate: {name} must be a number {low}, got {value!r}")
    chunk = nbytes / schedule.nchunks
    routes = schedule_routes(schedule, topo)
    use = _use(routes)
    total_link_bytes = Counter()
    for flows in use:
        for link, count in flows.items():
            total_link_bytes[link] += count * chunk
    worst = max((max(flows.values(), default=0) for flows in use), default=0)
    if mode == "flow":
        hops = [[len(route) for route in step_routes] for step_routes in routes]
        if node_bandwidth is not None:   # a rank's interface as two more links: bandwidth, no hops
            routes = [[route + ((_SEND, t.src), (_RECV, t.dst)) for t, route in zip(step, step_routes)]
                      for step, step_routes in zip(schedule.steps, routes)]

        def capacity(link) -> float:
            return node_bandwidth if link[0] in (_SEND, _RECV) else link_bandwidth

        seconds, steps = _flow_model(schedule, routes, hops, chunk, capacity, link_latency, step_overhead)
        return SimResult(seconds, steps, dict(total_link_bytes), worst, link_bandwidth, mode)
    steps = []
    for step, step_routes, flows in zip(schedule.steps, routes, use):
        if node_bandwidth is not None:   # the transfers a rank sends (receives) share its interface
            sends, receives = Counter(t.src for t in step), Counter(t.dst for t in step)
        slowest = 0.0
        for t, route in zip(step, step_routes):
            if not route:
                continue
            seconds = max(flows[link] for link in route) * chunk / link_bandwidth
            if node_bandwidth is not None:
                seconds = max(seconds, max(sends[t.src], receives[t.dst]) * chunk / node_bandwidth)
            slowest = max(slowest, seconds + len(route) * link_latency)
        steps.append(slowest + step_overhead)
    return SimResult(sum(steps), steps, dict(total_link_bytes), worst, link_bandwidth, mode)


def _use(routes) -> list[Counter]:
    """Per step, how many of the given routes cross each link."""
    return [Counter(link for route in step_routes for link in route) for step_routes in routes]


_SEND, _RECV = "send", "recv"   # a rank's interface, as link names no topology uses


def link_use(schedule: Schedule, topo: Topology) -> list[Counter]:
    """Per step, how many transfers cross each directed link (for pictures and checks)."""
    return _use(schedule_routes(schedule, topo))


def schedule_routes(schedule: Schedule, topo: Topology) -> list[list[tuple[tuple[int, int], ...]]]:
    """Per step and transfer, the directed links it crosses on ``topo``.

    A schedule built for a switched network (MultiTree) carries its own routes in
    ``params["routes"]``, keyed ``(step, src, dst)``: the paths its construction found free.
    They are used when ``topo`` has the links they name; elsewhere the topology's own routing
    (:meth:`Topology.route`) is used.
    """
    own = schedule.params.get("routes") or {}
    if own and schedule.params.get("network") is not topo:
        used = {link for route in own.values() for link in route}
        if not used <= topo.links:
            own = {}   # built for another network: route it the topology's way
    return [[own.get((s, t.src, t.dst)) or topo.route(t.src, t.dst) for t in step]
            for s, step in enumerate(schedule.steps)]


def _flow_model(schedule: Schedule, routes, hops, chunk: float, capacity, latency: float,
                overhead: float) -> tuple[float, list[float]]:
    """Event-driven flow model; returns the finish time and, per step, when its last flow ended.
    ``capacity(link)``: bytes/s; ``hops[s][i]``: the physical links transfer i of step s crosses."""
    # each rank's steps in order; a flow (step s) may start when both its ends have finished
    # every flow of their earlier steps
    flows = [(s, t.src, t.dst, route) for s, step in enumerate(schedule.steps)
             for t, route in zip(step, routes[s])]
    flow_hops = [h for step_hops in hops for h in step_hops]
    todo, steps_of = _rank_steps(flows)
    cursor = {r: 0 for r in steps_of}        # index into steps_of[r] of its current step
    free_at = {r: 0.0 for r in steps_of}     # when rank r finished its previous step
    waiting = defaultdict(list)              # step -> flow indices not started
    for i, (s, *_rest) in enumerate(flows):
        waiting[s].append(i)

    def current(r: int) -> int:
        return steps_of[r][cursor[r]] if cursor[r] < len(steps_of[r]) else -1

    now = 0.0
    pending_start: list[tuple[float, int]] = []   # (time it may start transmitting, flow)
    remaining = {}                                # transmitting flow -> bytes left
    step_end = [0.0] * len(schedule.steps)
    started = set()

    def release(r: int) -> None:
        """Start every flow of rank r's current step whose other end is there too."""
        s = current(r)
        if s < 0:
            return
        for i in list(waiting[s]):
            _, src, dst, route = flows[i]
            if r in (src, dst) and i not in started and current(src) == s and current(dst) == s:
                started.add(i)
                waiting[s].remove(i)
                begin = max(free_at[src], free_at[dst]) + overhead
                pending_start.append((max(begin, now) + flow_hops[i] * latency, i))

    for r in steps_of:
        release(r)
    while pending_start or remaining:
        now = _advance(now, remaining, pending_start, flows, capacity, chunk)
        done = [i for i, left in remaining.items() if left <= chunk * 1e-9 + 1e-12]
        for i in done:
            del remaining[i]
            s, src, dst, _ = flows[i]
            step_end[s] = max(step_end[s], now)
            for r in (src, dst):
                todo[(r, s)] -= 1
                if todo[(r, s)] == 0:
                    cursor[r] += 1
                    free_at[r] = now
        for i in done:
            for r in flows[i][1:3]:
                release(r)
    return now, [b - a for a, b in zip([0.0] + step_end[:-1], step_end)]


def _rank_steps(flows: list[tuple]) -> tuple[defaultdict, defaultdict]:
    """For the flows ``(step, src, dst, route)``: (rank, step) -> how many flows of that rank in that
    step are unfinished, and rank -> its steps, ascending."""
    todo = defaultdict(int)
    steps_of = defaultdict(list)
    for s, src, dst, _ in flows:
        for r in (src, dst):
            if todo[(r, s)] == 0:
                steps_of[r].append(s)
            todo[(r, s)] += 1
    for r in steps_of:
        steps_of[r].sort()
    return todo, steps_of


def _advance(now: float, remaining: dict[int, float], pending_start: list[tuple[float, int]], flows: list[tuple],
             capacity, chunk: float) -> float:
    """Move the flow model to its next event (a transmitting flow ends, or a pending one may start):
    the transmitting flows (``remaining``: flow -> bytes left) send at their max-min fair rates until
    then, and the pending flows whose start has come begin with ``chunk`` bytes. Returns the new time."""
    rates = _max_min_rates({i: flows[i][3] for i in remaining}, capacity)
    next_finish = min((remaining[i] / rates[i] for i in remaining if rates[i] > 0), default=float("inf"))
    next_start = min((t for t, _ in pending_start), default=float("inf"))
    dt = min(next_finish, next_start - now)
    dt = max(dt, 0.0)
    for i in remaining:
        remaining[i] -= rates[i] * dt
    now += dt
    for item in [p for p in pending_start if p[0] <= now + 1e-15]:
        pending_start.remove(item)
        remaining[item[1]] = chunk
    return now


def _max_min_rates(active: dict[int, tuple], capacity) -> dict[int, float]:
    """Max-min fair rates (progressive filling) of flows over links; ``capacity(link)`` in bytes/s."""
    rates: dict[int, float] = {}
    left = dict(active)
    cap: dict = {}
    while left:
        users = defaultdict(list)
        for i, route in left.items():
            for link in route:
                users[link].append(i)
        if not users:   # flows without links (a rank to itself) finish at once
            rates.update({i: float("inf") for i in left})
            break
        for link in users:
            cap.setdefault(link, capacity(link))
        link = min(users, key=lambda l: cap[l] / len(users[l]))
        share = cap[link] / len(users[link])
        for i in users[link]:
            rates[i] = share
            for other in left[i]:
                cap[other] -= share
            del left[i]
    return rates
