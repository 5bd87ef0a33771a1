"""What a virtual cluster's network does to a small message: the one-way latency between two nodes,
measured as half a TCP ping-pong's round trip (the per-hop latency of the scale-out predictor's
network model, :func:`workbench.netsim.costs.tcp_link`; ``benchmarks/vcluster.py`` and
``benchmarks/predict_check.py --vcluster`` use it).

    from workbench.vcluster.probe import one_way_latency
    one_way_latency(vc)            # seconds, nodes 0 -> 1 -> 0, median of 2000 round trips / 2

The kernel's own latency (this kernel has no netem), one way on an idle machine: benchmarks/README.md,
"A virtual cluster" (each all-reduce's heading gives it); on a loaded one the wake-ups of the two
processes are in it too, as they are in a rank's all-reduce.
"""
from __future__ import annotations

import subprocess
import sys

from .tools import VirtualClusterError

#: the port the echo server listens on, inside the server node's own network namespace
PORT = 5997

_SERVER = ("import socket\ns = socket.socket()\ns.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
           "s.bind(('0.0.0.0', {port}))\ns.listen()\nc, _ = s.accept()\n"
           "c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)\n"
           "while (d := c.recv(64)):\n    c.sendall(d)\n")
# the client retries its connection for 30 s: the server's interpreter may start slowly on a busy machine
_CLIENT = ("import socket, statistics, time\ndeadline = time.monotonic() + 30\nwhile True:\n    try:\n"
           "        c = socket.create_connection(({address!r}, {port}), timeout=5)\n        break\n"
           "    except OSError:\n        if time.monotonic() > deadline:\n            raise\n"
           "        time.sleep(0.05)\nc.settimeout(None)\n"
           "c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)\nt = []\nfor _ in range({rounds}):\n"
           "    s = time.perf_counter()\n    c.sendall(b'x' * 8)\n    c.recv(64)\n"
           "    t.append(time.perf_counter() - s)\nprint(statistics.median(t))\n")


def one_way_latency(vc, source: int = 0, target: int = 1, rounds: int = 2000, timeout: float = 120) -> float:
    """Seconds one small TCP message takes from node ``source`` to node ``target`` of ``vc`` (a
    :class:`~workbench.vcluster.VirtualCluster` that is up): half the median round trip of ``rounds``
    8-byte ping-pongs over one connection, Nagle off. :class:`VirtualClusterError` when the probe
    fails (its output in the message)."""
    if source == target:
        raise VirtualClusterError(f"target must be another node than source ({source}); got {target}")
    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 1:
        raise VirtualClusterError(f"rounds must be an integer >= 1; got {rounds!r}")
    server = subprocess.Popen([*vc.enter(target), sys.executable, "-c", _SERVER.format(port=PORT)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = vc.exec(source, [sys.executable, "-c", _CLIENT.format(address=vc.addresses[target], port=PORT,
                                                                        rounds=rounds)], timeout=timeout)
    finally:
        server.kill()
        server.wait()
    if client.returncode != 0:
        last = (client.stderr.strip().splitlines() or ["no output"])[-1]
        raise VirtualClusterError(f"vcluster {vc.name}: the ping-pong from node {source} to node {target} failed: "
                                  f"{last}")
    return float(client.stdout) / 2
