"""Networks for the simulator: ranks (nodes ``0..n-1``), switches, directed links, routes.

    topology.torus(8, 8)      # 2D torus (torus(4, 4, 4): 3D), dimension-order routing
    topology.mesh(4, 4)       # 2D mesh, dimension-order routing
    topology.ring(16), topology.fully_connected(8)
    topology.fat_tree(64, nodes_per_leaf=8, spines=8)   # two-level leaf-spine, up-down routing
    topology.bigraph(32, switches_per_layer=4)          # two switch layers, complete bipartite
    topology.bus(4)           # ranks on one host: every transfer crosses one shared link
    topology.switch(4)        # every rank on one switch by its own link (a virtual cluster's default)
    topology.parse("torus:8x8")                         # the same from a string (CLI, sweeps)

A link is a directed pair ``(u, v)``; every physical cable is two links. Switches are vertices
``n, n+1, ...``. Bandwidth and latency are uniform and given to :func:`~workbench.collectives.
simulator.simulate`, so one topology serves any link speed.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from functools import lru_cache

import networkx as nx

from ..checks import integer



class TopologyError(ValueError):
    """A network that cannot be built or a spelling ``parse`` does not know; the message says why."""


@dataclass
class Topology:
    """A network: ``nodes`` ranks, ``switches`` switch vertices, directed ``links``.

    ``coords`` (torus/mesh) and ``router`` (how a packet goes from one rank to another) are set
    by the builders; ``kind`` is the builder's name.
    """

    kind: str
    nodes: int
    links: set[tuple[int, int]]
    switches: int = 0
    dims: tuple[int, ...] = ()
    wrap: bool = False
    attach: dict[int, int] = field(default_factory=dict)  # rank -> its switch (indirect networks)

    def __post_init__(self) -> None:
        self.graph = nx.DiGraph(sorted(self.links))
        self.graph.add_nodes_from(range(self.nodes + self.switches))
        if not nx.is_strongly_connected(self.graph):
            raise TopologyError(f"topology {self.kind}: the links do not connect every node")
        self._routes: dict[tuple[int, int], tuple[tuple[int, int], ...]] = {}
        self._neighbors = {v: sorted(self.graph.successors(v), key=self._direction_order(v))
                           for v in self.graph.nodes}

    @property
    def direct(self) -> bool:
        """True when ranks are linked to ranks (torus, mesh, ring, fully connected)."""
        return self.switches == 0

    def _direction_order(self, v: int):
        """Neighbours in a fixed, geometric order (+x, -x, +y, -y, ...) for grids, else by id."""
        if not self.dims:
            return lambda u: u
        here = self.coord(v)

        def key(u: int):
            there = self.coord(u)
            for axis, (a, b) in enumerate(zip(here, there)):
                if a != b:
                    forward = (b - a) % self.dims[axis] == 1 if self.wrap else b > a
                    return (axis, 0 if forward else 1)
            return (len(self.dims), 0)
        return key

    def coord(self, node: int) -> tuple[int, ...]:
        """Grid coordinates of a rank (row-major over ``dims``)."""
        out = []
        for size in reversed(self.dims):
            out.append(node % size)
            node //= size
        return tuple(reversed(out))

    def neighbors(self, node: int) -> list[int]:
        """Vertices one link away from ``node`` (ranks on direct networks, its switch otherwise)."""
        if node not in self._neighbors:
            raise TopologyError(f"node {node} is not in this {self.kind} (0..{self.nodes - 1})")
        return list(self._neighbors[node])

    def route(self, src: int, dst: int) -> tuple[tuple[int, int], ...]:
        """The directed links a message from rank ``src`` to rank ``dst`` crosses, in order."""
        return _route(self, src, dst)

    def ring_order(self) -> list[int]:
        """A ring embedding: a Hamiltonian cycle where the builder knows one (snake order on a
        grid, rank order on a ring), else rank order (switched networks route around it)."""
        if len(self.dims) == 2 and (self.wrap or self.dims[0] % 2 == 0):
            rows, cols = self.dims
            # boustrophedon over columns 1.., then back up column 0 (closes with an even row
            # count, or through the wrap-around link on a torus)
            order = [r * cols + c for r in range(rows)
                     for c in (range(1, cols) if r % 2 == 0 else range(cols - 1, 0, -1))]
            return order + [r * cols for r in reversed(range(rows))]
        return list(range(self.nodes))

    def __repr__(self) -> str:
        shape = "x".join(map(str, self.dims)) if self.dims else str(self.nodes)
        return (f"<Topology {self.kind} {shape}: {self.nodes} nodes, {self.switches} switches, "
                f"{len(self.links)} directed links>")


def _route(topo: Topology, src: int, dst: int) -> tuple[tuple[int, int], ...]:
    key = (src, dst)
    if key in topo._routes:
        return topo._routes[key]
    for node in (src, dst):
        if not 0 <= node < topo.nodes:
            raise TopologyError(f"rank {node} is not in this {topo.kind} (0..{topo.nodes - 1})")
    path = [src]
    if topo.dims:  # dimension order: fix the first coordinate, then the next, ...
        here = list(topo.coord(src))
        goal = topo.coord(dst)
        for axis, size in enumerate(topo.dims):
            while here[axis] != goal[axis]:
                diff = (goal[axis] - here[axis]) % size if topo.wrap else goal[axis] - here[axis]
                step = (1 if diff <= size // 2 else -1) if topo.wrap else (1 if diff > 0 else -1)
                here[axis] = (here[axis] + step) % size
                path.append(_index(here, topo.dims))
    elif topo.kind == "ring":
        n = topo.nodes
        step = 1 if (dst - src) % n <= n // 2 else -1
        while path[-1] != dst:
            path.append((path[-1] + step) % n)
    elif topo.direct:
        path.append(dst)
    elif topo.kind == "bus":  # up to the bus, across it, down
        path += [topo.nodes, topo.nodes + 1, dst]
    else:  # switched: up to the source's switch, across, down (deterministic spread over paths)
        a, b = topo.attach[src], topo.attach[dst]
        path.append(a)
        if a != b:
            middle = topo.graph.successors(a)
            if b in topo.graph.successors(a):
                path.append(b)
            else:
                options = sorted(u for u in middle if u >= topo.nodes and b in topo.graph.successors(u))
                path += [options[(src + dst) % len(options)], b]
        path.append(dst)
    route = tuple(zip(path, path[1:]))
    topo._routes[key] = route
    return route


def _index(coord, dims) -> int:
    index = 0
    for c, size in zip(coord, dims):
        index = index * size + c
    return index


def _both_ways(pairs) -> set[tuple[int, int]]:
    return {link for u, v in pairs for link in ((u, v), (v, u)) if u != v}


def _check(name: str, **values: int) -> None:
    for key, value in values.items():
        integer(f"{name}: {key}", value, error=TopologyError)


def ring(n: int) -> Topology:
    """``n`` ranks in a bidirectional ring."""
    _check("ring", n=n)
    return Topology("ring", n, _both_ways((i, (i + 1) % n) for i in range(n)))


def fully_connected(n: int) -> Topology:
    """Every rank linked to every other (a crossbar; also a single-switch cluster's model)."""
    _check("fully_connected", n=n)
    return Topology("fully_connected", n, _both_ways(itertools.combinations(range(n), 2)))


def _grid(kind: str, dims: tuple[int, ...], wrap: bool) -> Topology:
    _check(kind, **{f"dim{i}": d for i, d in enumerate(dims)})
    n = 1
    for d in dims:
        n *= d
    pairs = []
    for node in range(n):
        coord = []
        rest = node
        for size in reversed(dims):
            coord.append(rest % size)
            rest //= size
        coord.reverse()
        for axis, size in enumerate(dims):
            if coord[axis] + 1 < size or (wrap and size > 1):
                other = list(coord)
                other[axis] = (coord[axis] + 1) % size
                pairs.append((node, _index(other, dims)))
    return Topology(kind, n, _both_ways(pairs), dims=tuple(dims), wrap=wrap)


def torus(*dims: int) -> Topology:
    """A torus, ``torus(rows, cols)`` or ``torus(x, y, z)``: a grid with wrap-around links."""
    if len(dims) < 1:
        raise TopologyError("torus: give the size of each dimension, e.g. torus(4, 4)")
    return _grid("torus", dims, wrap=True)


def mesh(*dims: int) -> Topology:
    """A mesh, ``mesh(rows, cols)``: a grid without wrap-around links."""
    if len(dims) < 1:
        raise TopologyError("mesh: give the size of each dimension, e.g. mesh(4, 4)")
    return _grid("mesh", dims, wrap=False)


def fat_tree(nodes: int, nodes_per_leaf: int = 8, spines: int | None = None) -> Topology:
    """A two-level fat tree (leaf-spine): ``nodes`` ranks, ``nodes_per_leaf`` behind each leaf
    switch, every leaf linked to every spine (``spines`` defaults to ``nodes_per_leaf``: full
    bisection). Routing goes up to a spine chosen by (src + dst) and down."""
    _check("fat_tree", nodes=nodes, nodes_per_leaf=nodes_per_leaf)
    if nodes % nodes_per_leaf:
        raise TopologyError(f"fat_tree: nodes ({nodes}) must be a multiple of nodes_per_leaf ({nodes_per_leaf})")
    spines = nodes_per_leaf if spines is None else spines
    _check("fat_tree", spines=spines)
    leaves = nodes // nodes_per_leaf
    leaf = [nodes + i for i in range(leaves)]
    spine = [nodes + leaves + i for i in range(spines)]
    attach = {r: leaf[r // nodes_per_leaf] for r in range(nodes)}
    pairs = list(attach.items()) + [(lf, sp) for lf in leaf for sp in spine]
    return Topology("fat_tree", nodes, _both_ways(pairs), switches=leaves + spines, attach=attach)


def bigraph(nodes: int, switches_per_layer: int = 4) -> Topology:
    """The two-layer switch network (BiGraph): ``2 * switches_per_layer`` switches, every switch
    of one layer linked to every switch of the other, ranks spread evenly over all switches."""
    _check("bigraph", nodes=nodes, switches_per_layer=switches_per_layer)
    total = 2 * switches_per_layer
    if nodes % total:
        raise TopologyError(f"bigraph: nodes ({nodes}) must be a multiple of 2*switches_per_layer ({total})")
    per = nodes // total
    switch = [nodes + i for i in range(total)]
    attach = {r: switch[r // per] for r in range(nodes)}
    lower, upper = switch[:switches_per_layer], switch[switches_per_layer:]
    pairs = list(attach.items()) + [(a, b) for a in lower for b in upper]
    return Topology("bigraph", nodes, _both_ways(pairs), switches=total, attach=attach)


@lru_cache(maxsize=None)
def lower_bound_steps(nodes: int, directed_links: int) -> int:
    """ceil(N(N-1) / directed links): all-gather steps no one-hop schedule can beat."""
    return -(-nodes * (nodes - 1) // directed_links)


def bus(n: int) -> Topology:
    """``n`` ranks sharing one link: every transfer goes rank -> bus -> rank over the same
    directed bus link, so all transfers of a step share its bandwidth. The model of ranks on
    one host, whose copies share the memory bandwidth (it fits this machine's measured
    all-reduces; see :mod:`workbench.netsim.calibration`)."""
    _check("bus", n=n)
    up, down = n, n + 1
    links = {(r, up) for r in range(n)} | {(up, down)} | {(down, r) for r in range(n)}
    return Topology("bus", n, links, switches=2)


def switch(n: int) -> Topology:
    """``n`` ranks on one switch, each by its own link (both ways): a transfer crosses its
    sender's uplink and its receiver's downlink, so a rank's sends share one link's bandwidth and
    so do its receives. The model of a cluster of nodes on one Ethernet switch, and of the
    virtual cluster's ``switch`` topology (:mod:`workbench.vcluster`), whose ports are shaped so."""
    _check("switch", n=n)
    hub = n
    return Topology("switch", n, _both_ways((r, hub) for r in range(n)), switches=1,
                    attach={r: hub for r in range(n)})


#: ``parse`` spellings: kind -> (builder, what the numbers after the colon are, at most how many)
KINDS = {
    "ring": (ring, "n", 1), "fully_connected": (fully_connected, "n", 1), "bus": (bus, "n", 1),
    "switch": (switch, "n", 1),
    "torus": (torus, "ROWSxCOLS[xDEPTH]", 3), "mesh": (mesh, "ROWSxCOLS[xDEPTH]", 3),
    "fat_tree": (fat_tree, "NODES[xNODES_PER_LEAF[xSPINES]]", 3),
    "bigraph": (bigraph, "NODES[xSWITCHES_PER_LAYER]", 2),
}


def parse(spec: str) -> Topology:
    """A topology from ``"kind:AxB..."``, e.g. ``torus:8x8``, ``mesh:4x4``, ``ring:16``,
    ``fully_connected:4``, ``bus:4``, ``switch:4``, ``fat_tree:64x8`` (nodes x nodes per leaf),
    ``bigraph:32x4`` (nodes x switches per layer)."""
    allowed = ", ".join(f"{k}:{form}" for k, (_, form, _) in KINDS.items())
    kind, _, numbers = str(spec).partition(":")
    if kind not in KINDS:
        raise TopologyError(f"topology: unknown kind {kind!r} in {spec!r}; allowed: {allowed}")
    try:
        values = [int(x) for x in numbers.lower().split("x")] if numbers else []
    except ValueError:
        values = []
    builder, form, most = KINDS[kind]
    if not values or len(values) > most:
        raise TopologyError(f"topology: {spec!r} should look like {kind}:{form}")
    return builder(*values)
