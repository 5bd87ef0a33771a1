"""What one all-reduce of ``n`` bytes on ``N`` ranks costs, in seconds: the network side of the
scale-out predictor (:mod:`workbench.netsim.predict`).

Two models with one interface (``allreduce(nbytes, nranks) -> seconds``, ``point_to_point(nbytes)
-> seconds``, ``wire_bytes(nbytes, nranks) -> bytes one rank sends``, ``with_collective(name)``):

- :class:`AlphaBeta` (default): the closed-form alpha-beta cost of the schedules of
  :data:`~workbench.schedules.SCHEDULES` on a non-blocking network (every rank its own full-speed
  link, one hop per transfer). It is exactly what the lock-step simulator gives for them on
  ``fully_connected(N)`` (``tests/test_predict.py`` checks it), and costs nothing at 512 ranks:

  ============================  =========================================================
  ring                          ``2(N-1) (alpha + n/(N B))``
  halving_doubling              ``2 log2(p) alpha + 2 (p-1)/p n/B`` (+ ``2 (alpha + n/B)`` to
                                fold in and out the ``N - p`` ranks above the power of two p)
  recursive_doubling            ``log2(p) (alpha + n/B)`` (+ the same fold)
  binary_tree                   ``(8 + 2D - 1)(alpha + n/(8B))``, D = floor(log2 N), 8 chunks
  linear                        ``2(N-1)(alpha + n/B)``
  ============================  =========================================================

  ``B`` is ``bandwidth`` (bytes/s per link), ``alpha`` is ``latency`` (seconds per step; one hop).
  :func:`from_calibration` takes both from a fit of this machine's measurements, on the network
  the fit assumed: a fit on ``fully_connected`` gives an :class:`AlphaBeta`, a fit on ``bus`` (the
  CLI's default: ranks of one host share its memory bandwidth) or ``ring`` a :class:`Simulated`
  on that kind of network at every rank count (the closed forms would be several times too fast
  for links the fit made shared).
- :class:`Simulated`: the topology simulator itself (any schedule, any topology, lock-step or
  flow model), cached per ``(N, n)``. Exact where the closed form has none (double binary tree)
  or the network is not a crossbar, but slow at hundreds of ranks (seconds per size at 512).

Pure Python: no torch, no MPI.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable

from .. import schedules
from ..sizes import format_bytes

#: GradientFlow's network: 56 Gbit/s per link, in bytes/s
GRADIENTFLOW_BANDWIDTH = 56e9 / 8
#: seconds per all-reduce step (one hop): an InfiniBand round of a few microseconds (wire about
#: 1 us, plus MPI and GPU-copy overheads); the model's one free network parameter, so tables
#: should sweep it
DEFAULT_LATENCY = 5e-6
#: TCP payload bytes per byte an Ethernet link carries: 1448 of every 1514 (MTU 1500 less 20 bytes
#: of IP header, 20 of TCP header and 12 of timestamps; 14 of Ethernet header on top), so a link
#: shaped to R bit/s moves R / 8 x 1448 / 1514 bytes/s of a message (the virtual cluster's links)
TCP_PAYLOAD_SHARE = 1448 / 1514
#: the closed forms :class:`AlphaBeta` knows
CLOSED_FORMS = ("ring", "halving_doubling", "recursive_doubling", "binary_tree", "linear")
#: the pipeline chunks of the tree schedules (their generators' default)
TREE_CHUNKS = 8


class CostError(ValueError):
    """A network model or all-reduce it cannot cost; the message names the parameter."""


def _check_collective(collective: str, allowed) -> None:
    if collective not in allowed:
        raise CostError(f"collective must be one of {', '.join(allowed)}; got {collective!r}")


def _check_size(nbytes: float, nranks: int) -> None:
    if not isinstance(nranks, int) or isinstance(nranks, bool) or nranks < 1:
        raise CostError(f"nranks must be an integer >= 1; got {nranks!r}")
    if not isinstance(nbytes, (int, float)) or not nbytes >= 0:
        raise CostError(f"nbytes must be a number >= 0 (bytes); got {nbytes!r}")


def _power_of_two_below(n: int) -> int:
    return 1 << (n.bit_length() - 1)


def closed_form_seconds(collective: str, nranks: int, nbytes: float, bandwidth: float, latency: float) -> float:
    """Seconds to all-reduce ``nbytes`` bytes on ``nranks`` ranks with ``collective`` (one of
    :data:`CLOSED_FORMS`), ``bandwidth`` bytes/s per link and ``latency`` seconds per step."""
    _check_collective(collective, CLOSED_FORMS)
    _check_size(nbytes, nranks)
    n, size, beta = nranks, float(nbytes), 1.0 / bandwidth
    if n == 1:
        return 0.0
    p = _power_of_two_below(n)
    fold = 2 * (latency + size * beta) if n > p else 0.0
    if collective == "ring":
        return 2 * (n - 1) * (latency + size / n * beta)
    if collective == "halving_doubling":
        return 2 * math.log2(p) * latency + 2 * (p - 1) / p * size * beta + fold
    if collective == "recursive_doubling":
        return math.log2(p) * (latency + size * beta) + fold
    if collective == "binary_tree":
        depth = n.bit_length() - 1   # the heap's depth: that of its last rank, floor(log2 N)
        return (TREE_CHUNKS + 2 * depth - 1) * (latency + size / TREE_CHUNKS * beta)
    return 2 * (n - 1) * (latency + size * beta)   # linear


def wire_bytes(collective: str, nranks: int, nbytes: float) -> float:
    """Bytes one rank sends to all-reduce ``nbytes`` bytes, averaged over the ranks: ``2(N-1)/N n``
    for every schedule but recursive doubling (whole buffers: ``log2(p) n`` per rank of the power
    of two ``p``, plus the fold)."""
    _check_collective(collective, tuple(schedules.SCHEDULES))
    _check_size(nbytes, nranks)
    n = nranks
    if n == 1:
        return 0.0
    if collective == "recursive_doubling":
        p = _power_of_two_below(n)
        return (p * math.log2(p) + 2 * (n - p)) * nbytes / n
    return 2 * (n - 1) / n * nbytes


def _check_link(bandwidth, latency) -> None:
    if not isinstance(bandwidth, (int, float)) or isinstance(bandwidth, bool) or not 0 < bandwidth < math.inf:
        raise CostError(f"bandwidth must be a number > 0 (bytes/s per link); got {bandwidth!r}")
    if not isinstance(latency, (int, float)) or isinstance(latency, bool) or not 0 <= latency < math.inf:
        raise CostError(f"latency must be a number >= 0 (seconds per step); got {latency!r}")


@dataclass(frozen=True)
class AlphaBeta:
    """Closed-form costs (see the module's table): ``bandwidth`` bytes/s per link (default
    56 Gbit/s, GradientFlow's), ``latency`` seconds per step, ``collective`` a name of
    :data:`CLOSED_FORMS`.

    ``burst``: bytes a rank's link sends at once after an idle spell, a token bucket's depth
    (a shaped link's: the virtual cluster's HTB, :func:`workbench.vcluster.wiring.burst_bytes`;
    default 0, a link that never goes faster than ``bandwidth``). The bucket refills at
    ``bandwidth`` while the link is idle; :meth:`allreduce` is the cost with it empty, and
    :func:`~workbench.netsim.predict.predict`'s sync-SGD step spends it (:meth:`burst_saving`): on
    a 247 KB model at 200 Mbit/s a 64 KiB burst is a quarter of the step's bytes.

    ``socket_buffer``: bytes a connection carries to a receiver that has not asked for them yet (a
    TCP connection's send and receive buffers; default 0: a transfer waits for its receiver). Only
    the original EASGD's master feels it: the next worker's weights come in while it sends a reply
    (:func:`workbench.netsim.exchanges.easgd`)."""

    bandwidth: float = GRADIENTFLOW_BANDWIDTH
    latency: float = DEFAULT_LATENCY
    collective: str = "ring"
    burst: float = 0.0
    socket_buffer: float = 0.0

    def __post_init__(self) -> None:
        _check_link(self.bandwidth, self.latency)
        _check_bytes("burst", self.burst, "bytes a link sends at once after an idle spell")
        _check_bytes("socket_buffer", self.socket_buffer, "bytes a connection carries before its receiver asks")
        if self.collective not in CLOSED_FORMS:
            raise CostError(f"collective must be one of {', '.join(CLOSED_FORMS)} for the closed-form model "
                            f"(use Simulated for the others); got {self.collective!r}")

    @classmethod
    def from_calibration(cls, calibration, collective: str = "ring") -> "AlphaBeta":
        """Links like the ones a :class:`~workbench.netsim.calibration.Calibration` fitted on
        ``fully_connected`` (its per-hop latency and bandwidth), every rank with its own. A fit on
        another network is a :class:`CostError` (use :func:`from_calibration`)."""
        kind = _calibration_kind(calibration)
        if kind != "fully_connected":
            raise CostError(f"calibration was fitted on {kind!r}, not fully_connected: its link bandwidth is a "
                            f"shared link's; use costs.from_calibration(calibration) (a Simulated {kind})")
        return cls(calibration.link_bandwidth, calibration.link_latency, collective)

    def allreduce(self, nbytes: float, nranks: int) -> float:
        return closed_form_seconds(self.collective, nranks, nbytes, self.bandwidth, self.latency)

    def point_to_point(self, nbytes: float) -> float:
        """One message over one link: ``latency + nbytes / bandwidth`` seconds."""
        return self.latency + nbytes / self.bandwidth

    def wire_bytes(self, nbytes: float, nranks: int) -> float:
        return wire_bytes(self.collective, nranks, nbytes)

    def burst_saving(self, sent: float, tokens: float) -> tuple[float, float]:
        """(seconds saved, tokens left) when a rank whose bucket holds ``tokens`` bytes sends
        ``sent`` bytes: the first ``min(tokens, sent)`` go at once instead of at ``bandwidth``
        (every rank of a ring sends its share back to back on its own link, and they all burst
        together, so the whole all-reduce is shorter by as much)."""
        spent = min(max(tokens, 0.0), sent)
        return spent / self.bandwidth, tokens - spent

    def with_collective(self, collective: str) -> "AlphaBeta":
        return replace(self, collective=collective)

    def describe(self) -> str:
        burst = f", a {self.burst / 1024:.4g} KiB burst" if self.burst else ""
        burst += f", a {format_bytes(self.socket_buffer)} socket buffer" if self.socket_buffer else ""
        return (f"{self.collective}, closed form: {self.bandwidth * 8 / 1e9:.4g} Gbit/s per link{burst}, "
                f"{self.latency * 1e6:.4g} us per step")


def _check_bytes(name: str, value, meaning: str) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < math.inf:
        raise CostError(f"{name} must be a number >= 0 ({meaning}); got {value!r}")


def tcp_link(rate_bits: float, latency: float, collective: str = "ring", burst_bytes: float = 0,
             socket_buffer: float = 0) -> AlphaBeta:
    """The closed-form model of ranks that each own a TCP link of ``rate_bits`` bit/s (a switch
    port of the virtual cluster: every rank its own shaped uplink and downlink) and ``latency``
    seconds per all-reduce step (one hop, e.g. a TCP ping-pong's one-way time): bandwidth
    ``rate_bits / 8 x`` :data:`TCP_PAYLOAD_SHARE` bytes/s. ``burst_bytes``: the shaper's bucket
    on the wire (:func:`workbench.vcluster.wiring.burst_bytes`), the same payload share of it
    the model's ``burst``. ``socket_buffer``: bytes a connection's two sockets hold (the kernel's
    ``net.ipv4.tcp_wmem`` and ``tcp_rmem`` maxima, to which they grow), the model's ``socket_buffer``."""
    if not isinstance(rate_bits, (int, float)) or isinstance(rate_bits, bool) or not 0 < rate_bits < math.inf:
        raise CostError(f"rate_bits must be a number > 0 (bit/s on the wire); got {rate_bits!r}")
    _check_bytes("burst_bytes", burst_bytes, "a shaper's bucket, bytes on the wire")
    return AlphaBeta(rate_bits / 8 * TCP_PAYLOAD_SHARE, latency, collective, burst_bytes * TCP_PAYLOAD_SHARE,
                     socket_buffer)


@dataclass(frozen=True)
class Simulated:
    """The simulator (:func:`~workbench.netsim.simulator.simulate`) as the network model.

    ``topology``: a spelling for :func:`~workbench.network.topology.parse` with ``{n}`` for the
    rank count (default ``fully_connected:{n}``; e.g. ``fat_tree:{n}x8``) or a function
    ``n -> Topology``; ``mode``: ``lockstep`` or ``flow``. Results are cached per ``(N, n)``.
    """

    bandwidth: float = GRADIENTFLOW_BANDWIDTH
    latency: float = DEFAULT_LATENCY
    collective: str = "ring"
    topology: str | Callable = "fully_connected:{n}"
    mode: str = "lockstep"
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        _check_link(self.bandwidth, self.latency)
        _check_collective(self.collective, tuple(schedules.SCHEDULES))

    def network(self, nranks: int):
        from ..network.topology import parse
        key = ("topology", nranks)
        if key not in self._cache:
            topo = self.topology
            self._cache[key] = topo(nranks) if callable(topo) else parse(topo.format(n=nranks))
        return self._cache[key]

    def allreduce(self, nbytes: float, nranks: int) -> float:
        from .simulator import simulate
        _check_size(nbytes, nranks)
        if nranks == 1:
            return 0.0
        key = (self.collective, nranks, float(nbytes))
        if key not in self._cache:
            schedule = schedules.SCHEDULES[self.collective](nranks)
            self._cache[key] = simulate(schedule, self.network(nranks), nbytes, self.bandwidth, self.latency,
                                        mode=self.mode).seconds
        return self._cache[key]

    def point_to_point(self, nbytes: float) -> float:
        return self.latency + nbytes / self.bandwidth

    def wire_bytes(self, nbytes: float, nranks: int) -> float:
        return wire_bytes(self.collective, nranks, nbytes)

    def with_collective(self, collective: str) -> "Simulated":
        # the copy shares the cache: its keys carry the collective
        copy = replace(self, collective=collective)
        object.__setattr__(copy, "_cache", self._cache)
        return copy

    def describe(self) -> str:
        topo = self.topology if isinstance(self.topology, str) else getattr(self.topology, "__name__", "topology")
        return (f"{self.collective}, simulated ({self.mode}) on {topo}: {self.bandwidth * 8 / 1e9:.4g} Gbit/s "
                f"per link, {self.latency * 1e6:.4g} us per hop")


#: networks a calibration can be scaled to any rank count on (one number in their spelling)
SCALABLE_KINDS = ("fully_connected", "bus", "ring")


def _calibration_kind(calibration) -> str:
    topo = getattr(calibration, "topology", None)
    return getattr(topo, "kind", "fully_connected")


def from_calibration(calibration, collective: str = "ring"):
    """The network a :class:`~workbench.netsim.calibration.Calibration` describes, at any rank
    count: its fitted link bandwidth and latency on the *same kind* of network it was fitted on
    (``fully_connected``: :class:`AlphaBeta`; ``bus`` or ``ring``: :class:`Simulated` on
    ``bus:{n}`` / ``ring:{n}``). A fit on another kind (torus, fat tree...) has no rank-count-free
    spelling: :class:`CostError`."""
    kind = _calibration_kind(calibration)
    if kind == "fully_connected" and collective in CLOSED_FORMS:
        return AlphaBeta.from_calibration(calibration, collective)
    if kind not in SCALABLE_KINDS:
        raise CostError(f"calibration was fitted on {kind!r}; the predictor scales only a fit on "
                        f"{', '.join(SCALABLE_KINDS)} to other rank counts (calibrate on one of those)")
    return Simulated(calibration.link_bandwidth, calibration.link_latency, collective, topology=f"{kind}:{{n}}")


def network_model(network=None, collective: str | None = None):
    """The model ``predict`` uses: ``None`` (:class:`AlphaBeta` defaults), a model, or a
    :class:`~workbench.netsim.calibration.Calibration` (:func:`from_calibration`);
    ``collective`` (if given) replaces the model's own."""
    if network is None:
        network = AlphaBeta()
    elif not hasattr(network, "allreduce") and hasattr(network, "link_bandwidth"):
        return from_calibration(network, collective or "ring")
    elif not all(hasattr(network, name) for name in ("allreduce", "point_to_point", "wire_bytes", "with_collective")):
        raise CostError(f"network must be an AlphaBeta, a Simulated or a Calibration; got {type(network).__name__}")
    return network if collective is None else network.with_collective(collective)
