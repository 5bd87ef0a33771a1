"""MultiTree (Huang et al., ISCA'21) and the TPU-style 2D ring, as ordinary Schedules.

MultiTree builds one spanning tree per root, all together, one time step at a time, so that no
directed link is used twice in a step: chunk ``r`` (1/N of the data) is reduce-scattered up
tree ``r`` (edges reversed, latest first) and all-gathered down it, ``2T`` steps in all, every
transfer one hop (on switched networks: one route through the switches, all of whose links are
free in that step). The construction follows the MultiTree paper (Huang et al., "Communication
Algorithm-Architecture Co-Design for Distributed Deep Learning", ISCA 2021) line by line.
"""
from __future__ import annotations

import itertools

import networkx as nx

from ..checks import integer

from .schedule import Schedule, ScheduleError, Transfer, make_schedule
from ..network.topology import Topology


def multitree_trees(topo: Topology, k: int = 2) -> tuple[list[tuple[int, int, int, int]], int]:
    """The trees as edges ``(root, child, parent, t)`` and the number of steps ``T``.

    ``k``: k-ary growth — a parent attaches at most ``k - 1`` children per step and tree.
    The route of each edge (switched networks) is in :func:`multitree_edges`.
    """
    edges, T = multitree_edges(topo, k)
    return [(root, child, parent, t) for root, child, parent, t, _ in edges], T


def multitree_edges(topo: Topology, k: int = 2):
    """The trees as edges ``(root, child, parent, t, route)`` and the number of steps ``T``;
    ``route`` is the tuple of directed links the all-gather transfer parent -> child takes.

    Direct networks (torus, mesh, ring, fully connected): a parent's candidates are its
    neighbours, in geometric order, and an edge uses the one link between them.

    Switched networks (fat tree, BiGraph): a parent's candidates are ranks on its own switch
    first (the paper's rule), then ranks on switches ``radius`` or fewer switch-to-switch links
    away, nearest first; an edge to another switch takes the first of the shortest switch
    paths all of whose links are still free in this step (the paper's "search unused switch
    links"), so a busy spine does not block a child that another spine can reach. The trees are
    built for every radius from 1 to the switches' diameter (a radius that cannot connect
    every switch is skipped) and the one with the fewest steps is kept: on a BiGraph, radius 1
    (children across the layers only, the switched analogue of one hop) reaches the N-1 bound
    where relaying through a second switch does not; a fat tree's leaves are two links apart.

    Either way no directed link carries two transfers in one step.
    """
    integer("multitree: k", k, minimum=2, error=ScheduleError)
    n = topo.nodes
    if topo.direct:
        return _grow(topo, k, [[(c, (p, c)) for c in topo.neighbors(p) if c < n] for p in range(n)], None)
    # every other rank, nearest first (own switch first): the order a parent tries children in
    nearest = [sorted((c for c in range(n) if c != p), key=lambda c, p=p: (len(topo.route(p, c)), c))
               for p in range(n)]
    if not topo.attach:   # a bus: one fixed route per pair
        return _grow(topo, k, nearest, None)
    switches = sorted(set(topo.attach.values()))
    fabric = topo.graph.subgraph(range(topo.nodes, topo.nodes + topo.switches))
    distance = {a: nx.single_source_shortest_path_length(fabric, a) for a in switches}
    all_paths = {(a, b): [tuple(zip(path, path[1:])) for path in sorted(nx.all_shortest_paths(fabric, a, b))]
                 for a in switches for b in switches if a != b}
    best = None
    for radius in range(1, max(d[b] for d in distance.values() for b in switches) + 1):
        paths = {pair: options for pair, options in all_paths.items() if distance[pair[0]][pair[1]] <= radius}
        reach = [[c for c in cs if topo.attach[c] == topo.attach[p] or (topo.attach[p], topo.attach[c]) in paths]
                 for p, cs in enumerate(nearest)]
        try:
            built = _grow(topo, k, reach, paths)
        except ScheduleError:
            continue   # the ranks' switches are not connected within this radius
        if best is None or built[1] < best[1]:
            best = built
    if best is None:
        raise ScheduleError(f"multitree: cannot connect the switches of {topo!r}")
    return best


def _grow(topo: Topology, k: int, reach: list[list], paths):
    """Grow the trees (the MultiTree paper's construction). ``reach[p]``: the children parent ``p`` tries, in order
    (on a direct network ``(child, link)`` pairs); ``paths``: the switch paths a switched
    network may use, ``None`` on a direct network or a bus (whose routes are fixed)."""
    n = topo.nodes
    members = [{r} for r in range(n)]
    active = [[r] for r in range(n)]           # per tree, its possible parents in join order
    edges: list[tuple[int, int, int, int, tuple]] = []
    saturated = [set() for _ in range(n)]      # parents whose candidates are all in tree r already
    t = 0
    while any(len(m) < n for m in members):
        joined, progress = _grow_step(topo, k, reach, paths, t, members, active, saturated, edges)
        if not progress:
            raise ScheduleError(f"multitree: no progress at step {t} on {topo!r}")
        # next step's parents: this step's, less the saturated, then the nodes that just joined
        active = [[p for p in active[r] if p not in saturated[r]] + joined[r] for r in range(n)]
        t += 1
    return edges, t


def _grow_step(topo: Topology, k: int, reach: list[list], paths, t: int, members: list[set], candidates: list[list],
               saturated: list[set], edges: list) -> tuple[list[list[int]], bool]:
    """Step ``t`` of :func:`_grow`: in rounds over the roots, each tree ``r`` attaches one child per
    turn to its first candidate parent (``candidates[r]``, in join order) with a free link, a parent
    taking at most ``k - 1`` children. ``members``, ``saturated`` and ``edges`` grow in place.
    Returns the ranks that joined each tree, and whether any did."""
    n = topo.nodes
    direct = topo.direct
    avail = set(topo.links)
    # a parent that finds no child cannot find one later in the same step (links only get used,
    # trees only grow), so a pointer moves past it: the same choices as rescanning from the first
    # parent each turn
    joined: list[list[int]] = [[] for _ in range(n)]
    position = [0] * n
    children: dict[tuple[int, int], int] = {}
    live = [r for r in range(n) if len(members[r]) < n]
    while live:  # rounds over the roots, one attachment per root and turn
        attached = []   # a root that attaches nothing in a round has run out of parents
        for r in live:
            if len(members[r]) == n:
                continue
            cand, tree = candidates[r], members[r]
            while position[r] < len(cand):
                p = cand[position[r]]
                c, links, outside = None, (), False
                if direct:  # the hot loop for big tori: one link per candidate, no lists
                    for c_, link in reach[p]:
                        if c_ not in tree:
                            outside = True
                            if link in avail:
                                c, links = c_, (link,)
                                break
                else:
                    free = [c_ for c_ in reach[p] if c_ not in tree]
                    outside = bool(free)
                    if free:
                        c, links = _switched_child(topo, p, free, avail, paths)
                if not outside:   # every candidate of p is in tree r already: for good
                    saturated[r].add(p)
                if c is None:
                    position[r] += 1
                    continue
                tree.add(c)
                joined[r].append(c)
                children[(r, p)] = children.get((r, p), 0) + 1
                if children[(r, p)] >= k - 1:
                    position[r] += 1
                avail.difference_update(links)
                edges.append((r, c, p, t, links))
                attached.append(r)
                break
        live = attached
    return joined, bool(children)


def _switched_child(topo: Topology, parent: int, free: list[int], avail: set, paths):
    """The first rank in ``free`` that ``parent`` can reach over links all still in ``avail``,
    and that route; ``(None, ())`` if none."""
    if paths is None:  # a bus: one fixed route per pair
        routes = ((c, topo.route(parent, c)) for c in free)
        return next(((c, route) for c, route in routes if all(link in avail for link in route)), (None, ()))
    a = topo.attach[parent]
    up = (parent, a)
    if up not in avail:
        return None, ()
    for c in free:
        b = topo.attach[c]
        down = (b, c)
        if down not in avail:
            continue
        if a == b:
            return c, (up, down)
        for middle in paths[(a, b)]:
            if all(link in avail for link in middle):
                return c, (up,) + middle + (down,)
    return None, ()


def multitree(topo: Topology, k: int = 2) -> Schedule:
    """MultiTree all-reduce on ``topo``: ``2T`` steps, chunk r along tree r. Every transfer is
    one hop on a direct network; on a switched one it is one rank-to-rank route through the
    switches (kept in ``params["routes"]``, which :func:`~workbench.netsim.simulator.simulate`
    follows), and no link carries two transfers in a step."""
    edges, T = multitree_edges(topo, k)
    steps: list[list[Transfer]] = [[] for _ in range(2 * T)]
    routes: dict[tuple[int, int, int], tuple[tuple[int, int], ...]] = {}
    for root, child, parent, t, links in edges:
        steps[T - 1 - t].append(Transfer(child, parent, root, True))   # reduce-scatter, up
        steps[T + t].append(Transfer(parent, child, root, False))      # all-gather, down
        if not topo.direct:
            routes[(T - 1 - t, child, parent)] = tuple((v, u) for u, v in reversed(links))
            routes[(T + t, parent, child)] = links
    extra = {"routes": routes, "network": topo} if routes else {}
    return make_schedule("multitree", topo.nodes, topo.nodes, steps, k=k, tree_steps=T, **extra)


def ring_2d(rows: int, cols: int, bidirectional: bool = False) -> Schedule:
    """TPU-style 2D ring: reduce-scatter along each row's ring, all-reduce each chunk along the
    column rings, all-gather along the rows. Rank ``i`` is at row ``i // cols``, column
    ``i % cols``; the buffer is split into ``rows * cols`` chunks.

    ``bidirectional=True`` uses the links the one-way version leaves idle: half the buffer goes
    rows first in the + directions, the other half columns first in the - directions, at the
    same time, so each half's transfers are on links of their own (``2 * rows * cols``
    chunks). On a torus this halves the bandwidth term."""
    for name, value in (("rows", rows), ("cols", cols)):
        integer(f"ring_2d: {name}", value, error=ScheduleError)
    n = rows * cols
    steps = _ring_2d_steps(rows, cols, lambda r, c: r * cols + c, 0)
    if not bidirectional:
        return make_schedule("ring_2d", n, n, steps, rows=rows, cols=cols)
    # the other half on the transposed, reversed grid: its "rows" are the columns, walked upwards
    other = _ring_2d_steps(cols, rows, lambda r, c: ((-c) % rows) * cols + (-r) % cols, n)
    merged = [list(a) + list(b) for a, b in itertools.zip_longest(steps, other, fillvalue=[])]
    return make_schedule("ring_2d", n, 2 * n, merged, rows=rows, cols=cols, bidirectional=True)


def _ring_2d_steps(rows: int, cols: int, rank, offset: int) -> list[list[Transfer]]:
    """One-way 2D ring on a ``rows x cols`` grid whose cell (r, c) is rank ``rank(r, c)``,
    moving chunks ``offset .. offset + rows*cols - 1``."""
    steps: list[list[Transfer]] = []
    # row reduce-scatter: column position c ends owning chunk group c (chunks c*rows .. c*rows+rows-1)
    for s in range(cols - 1):
        steps.append([Transfer(rank(r, c), rank(r, (c + 1) % cols), offset + g * rows + j, True)
                      for r in range(rows) for c in range(cols)
                      for g in [(c - s - 1) % cols] for j in range(rows)])
    # column ring all-reduce of each owned group: chunk g*rows + j, owner column g
    for s in range(rows - 1):  # reduce-scatter along the column
        steps.append([Transfer(rank(r, g), rank((r + 1) % rows, g), offset + g * rows + (r - s - 1) % rows, True)
                      for g in range(cols) for r in range(rows)])
    for s in range(rows - 1):  # all-gather along the column
        steps.append([Transfer(rank(r, g), rank((r + 1) % rows, g), offset + g * rows + (r - s) % rows, False)
                      for g in range(cols) for r in range(rows)])
    # row all-gather
    for s in range(cols - 1):
        steps.append([Transfer(rank(r, c), rank(r, (c + 1) % cols), offset + g * rows + j, False)
                      for r in range(rows) for c in range(cols)
                      for g in [(c - s) % cols] for j in range(rows)])
    return steps
