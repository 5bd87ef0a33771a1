"""A virtual cluster on paper: names, addresses, links, routes and rates, before anything exists.

Pure (standard library and :mod:`workbench.network`): validated here, so a bad name, topology,
rate or node count is a one-line error that names the option before any namespace or process is
made. :mod:`.wiring` turns a :class:`Plan` into namespaces, links and shaping.

The layout of cluster ``vc`` with 4 nodes on a ``switch`` (subnet slot 0)::

    head (the host)        bridge wbvvc-br    198.18.0.1/24
    node vc-0 .. vc-3      netns  wbv-vc-0 .. wbv-vc-3, each with eth0 = 198.18.0.2 .. .5
                           host side of its cable: wbvvc-0 .. wbvvc-3 (on the bridge)

Every node's cable to the bridge is shaped both ways (its ``eth0`` for what it sends, the host
end for what it receives), as a switch port of that rate. On ``ring``, ``torus:RxC``, ``mesh:RxC``
and ``fully_connected:N`` the bridge stays as the management network (the head's controller,
Slurm, the launcher's control connections; not shaped), and the data network is point-to-point
cables between neighbours (``to<j>`` inside node ``i`` is its cable to node ``j``), each shaped
both ways; node ``i`` reaches node ``j`` through a host route along the topology's route, so
traffic between nodes crosses, and is forwarded by, the nodes in between.
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

from ..network.topology import Topology, TopologyError, parse

#: every interface, namespace and folder of a virtual cluster starts with this
PREFIX = "wbv"
#: a cluster's name: short, because interface names have at most 15 characters ("wbv" + name + "-" + node)
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9]{0,7}$")
#: the benchmarking range (RFC 2544): the only addresses a virtual cluster uses
RANGE = ipaddress.ip_network("198.18.0.0/15")
#: one /24 of RANGE per cluster: the head is .1, node i is .(i + 2)
SLOTS = RANGE.num_addresses // 256
#: one /24 a cluster: .1 the head, .2-.253 the nodes, .254 the head's launcher network (issue 45)
MAX_NODES = 252
#: the topologies a virtual cluster can wire (switched networks other than one switch would need
#: switches as namespaces and loop-free forwarding between them)
KINDS = ("switch", "ring", "torus", "mesh", "fully_connected")
#: tc's rate units (SI, bits per second)
RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
#: time units for --latency
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}


class PlanError(ValueError):
    """A virtual cluster that cannot be planned; the one-line message names the option."""


def check_name(name) -> str:
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise PlanError(f"name: {name!r} must be 1-8 characters, a lower-case letter then letters or digits "
                        "(it goes into interface names, which have at most 15 characters)")
    return name


def parse_rate(text) -> int:
    """``"100mbit"``, ``"1gbit"``, ``"25gbit"`` (tc's units, SI) or plain bits/s -> bits per second."""
    value = str(text).strip().lower()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value)
    if m and (m.group(2) in RATE_UNITS or m.group(2) == ""):
        bits = float(m.group(1)) * RATE_UNITS.get(m.group(2), 1)
        if 8_000 <= bits <= 10**13:
            return int(bits)
    raise PlanError(f"bandwidth: {text!r} is not a rate between 8kbit and 10tbit like 100mbit, 1gbit, 25gbit "
                    f"(units: {', '.join(RATE_UNITS)}; a plain number is bits/s)")


def format_rate(bits: int) -> str:
    """1e9 -> '1gbit', 1e8 -> '100mbit' (tc's spelling, exact)."""
    for unit in ("tbit", "gbit", "mbit", "kbit"):
        if bits % RATE_UNITS[unit] == 0:
            return f"{bits // RATE_UNITS[unit]}{unit}"
    return f"{bits}bit"


def parse_latency(text) -> float:
    """``"50us"``, ``"1ms"``, ``"0.001s"`` or plain seconds -> seconds (>= 0)."""
    value = str(text).strip().lower()
    m = re.fullmatch(r"(\d+(?:\.\d+)?(?:e-?\d+)?)\s*(s|ms|us)?", value)
    if m:
        seconds = float(m.group(1)) * TIME_UNITS[m.group(2) or "s"]
        if seconds < 10:
            return seconds
    raise PlanError(f"latency: {text!r} is not a time under 10 s like 50us, 1ms (units: s, ms, us)")


def parse_queue(text) -> int:
    """A link's queue: bytes (``131072``) or with a K/M suffix (``128K``, ``1M``), 4 KiB to 1 GiB."""
    from ..sizes import parse_size
    try:
        value = parse_size(str(text)) if not isinstance(text, int) else text
    except ValueError:
        value = 0
    if not 4096 <= value <= 1 << 30:
        raise PlanError(f"queue: {text!r} is not a size from 4K to 1G like 128K or 1M (bytes each link may queue)")
    return value


def parse_topology(spec, nodes: int) -> Topology:
    """The network of ``nodes`` nodes named by ``spec``: ``switch``, ``ring``, ``fully_connected``
    (their size is ``nodes``), ``torus:RxC`` or ``mesh:RxC`` (R x C must equal ``nodes``)."""
    text = str(spec).strip()
    kind = text.partition(":")[0]
    if kind not in KINDS:
        raise PlanError(f"topology: {text!r} is not one of switch, ring, fully_connected, torus:RxC, mesh:RxC")
    if kind in ("switch", "ring", "fully_connected") and ":" not in text:
        text = f"{kind}:{nodes}"
    if kind in ("torus", "mesh") and ":" not in text:
        raise PlanError(f"topology: {kind} needs its shape, like {kind}:2x2 ({kind}:RxC with R x C = --nodes)")
    try:
        topo = parse(text)
    except TopologyError as exc:
        raise PlanError(f"topology: {exc}") from None
    if topo.nodes != nodes:
        raise PlanError(f"topology: {text} has {topo.nodes} nodes but --nodes is {nodes}")
    return topo


@dataclass(frozen=True, order=True)
class Cable:
    """A point-to-point cable between nodes ``a`` and ``b`` (``a < b``): ``to<b>`` in node a, ``to<a>`` in b."""

    a: int
    b: int

    def device(self, node: int) -> str:
        """The cable's interface inside ``node``."""
        return f"to{self.b if node == self.a else self.a}"


@dataclass(frozen=True)
class Route:
    """Node-side host route: to ``dst`` (an address) via ``via`` (the next node's address) on ``device``."""

    dst: str
    via: str
    device: str


@dataclass
class Plan:
    """What ``up`` builds. ``topology``: a spelling :func:`parse_topology` accepts; ``bandwidth``:
    bits/s of every shaped link; ``latency``: seconds added per link (None: the kernel's own);
    ``queue``: bytes each link may queue (None: :data:`~workbench.vcluster.wiring.QUEUE_SECONDS` at
    the rate, at least 128 KiB);
    ``slot``: which /24 of 198.18.0.0/15 the cluster uses (chosen free by :mod:`.wiring`)."""

    name: str
    nodes: int
    topology: str = "switch"
    bandwidth: int = 10**9
    latency: float | None = None
    slurm: bool = False
    slot: int = 0
    shared: str = ""
    queue: int | None = None
    _topo: Topology | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_name(self.name)
        if not isinstance(self.nodes, int) or isinstance(self.nodes, bool) or not 1 <= self.nodes <= MAX_NODES:
            raise PlanError(f"nodes: must be an integer 1..{MAX_NODES} (one /24 per cluster); got {self.nodes!r}")
        if isinstance(self.bandwidth, str):
            self.bandwidth = parse_rate(self.bandwidth)
        else:
            self.bandwidth = parse_rate(str(int(self.bandwidth)))
        if self.latency is not None and not isinstance(self.latency, (int, float)):
            self.latency = parse_latency(self.latency)
        if self.queue is not None:
            self.queue = parse_queue(self.queue)
        if not (isinstance(self.slot, int) and 0 <= self.slot < SLOTS):
            raise PlanError(f"slot: must be 0..{SLOTS - 1}; got {self.slot!r}")
        self._topo = parse_topology(self.topology, self.nodes)
        self.topology = self.topology if ":" in str(self.topology) else f"{self.topology}:{self.nodes}"

    # -- names -----------------------------------------------------------------------------
    @property
    def topo(self) -> Topology:
        return self._topo

    @property
    def switched(self) -> bool:
        """Nodes meet on the bridge (``switch``); otherwise on point-to-point cables."""
        return self.topo.kind == "switch"

    @property
    def bridge(self) -> str:
        return f"{PREFIX}{self.name}-br"

    def netns(self, node: int) -> str:
        return f"{PREFIX}-{self.name}-{node}"

    @property
    def launcher_netns(self) -> str:
        """The network namespace the head's launchers (mpiexec) run in: one cable to the bridge, nothing else."""
        return f"{PREFIX}-{self.name}-launch"

    @property
    def launcher_end(self) -> str:
        """The host side of the launcher network's cable to the bridge."""
        return f"{PREFIX}{self.name}-L"

    def host_end(self, node: int) -> str:
        """The host side of node ``node``'s cable to the bridge."""
        return f"{PREFIX}{self.name}-{node}"

    def hostname(self, node: int) -> str:
        return f"{self.name}-{node}"

    @property
    def head_hostname(self) -> str:
        return f"{self.name}-head"

    # -- addresses -------------------------------------------------------------------------
    @property
    def subnet(self) -> ipaddress.IPv4Network:
        return ipaddress.ip_network(f"{RANGE.network_address + 256 * self.slot}/24")

    @property
    def head_address(self) -> str:
        return str(self.subnet.network_address + 1)

    @property
    def launcher_address(self) -> str:
        """The launcher network's address on the bridge (the nodes' proxies connect to it)."""
        return str(self.subnet.network_address + 254)

    def address(self, node: int) -> str:
        return str(self.subnet.network_address + 2 + node)

    def node_of(self, host: str) -> int | None:
        """The node called ``host`` (its hostname or address), or None."""
        for i in range(self.nodes):
            if host in (self.hostname(i), self.address(i)):
                return i
        return None

    # -- the data network ------------------------------------------------------------------
    @property
    def cables(self) -> list[Cable]:
        """Point-to-point cables (none on a switch): one per pair of neighbours."""
        if self.switched:
            return []
        return sorted({Cable(min(u, v), max(u, v)) for u, v in self.topo.links})

    def routes(self, node: int) -> list[Route]:
        """Host routes of ``node`` to every other node along the topology (none on a switch)."""
        if self.switched:
            return []
        out = []
        for dst in range(self.nodes):
            if dst == node:
                continue
            nxt = self.topo.route(node, dst)[0][1]
            out.append(Route(self.address(dst), self.address(nxt), Cable(min(node, nxt), max(node, nxt)).device(node)))
        return out

    def shaped_links(self) -> list[tuple[int | None, str]]:
        """``(node or None for the host, device)`` of every shaped interface: both ends of every
        cable that carries traffic between nodes."""
        if self.switched:
            return [(i, "eth0") for i in range(self.nodes)] + [(None, self.host_end(i)) for i in range(self.nodes)]
        return [(n, c.device(n)) for c in self.cables for n in (c.a, c.b)]

    def hosts_file(self) -> str:
        """``/etc/hosts`` of the nodes (and of the head's Slurm): every node and the head."""
        lines = ["127.0.0.1\tlocalhost", f"{self.head_address}\t{self.head_hostname}"]
        lines += [f"{self.address(i)}\t{self.hostname(i)}" for i in range(self.nodes)]
        return "\n".join(lines) + "\n"

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in FIELDS}

    @classmethod
    def from_dict(cls, record: dict) -> "Plan":
        return cls(**{k: record[k] for k in FIELDS if k in record})


#: what a Plan is made of (its record in the cluster's folder)
FIELDS = ("name", "nodes", "topology", "bandwidth", "latency", "slurm", "slot", "shared", "queue")
