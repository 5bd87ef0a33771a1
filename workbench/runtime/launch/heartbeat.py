"""Heartbeats from the ranks' guards over the network, so a node that stops answering is named.

A rank whose node is cut off (a partition, a node that hangs) neither exits nor writes anything:
its peers wait in MPI for bytes that never come, the launcher's connections stall without an
error, and nothing ends before the job's timeout. So each rank's guard
(:mod:`workbench.runtime.launch.rankguard`) sends a small UDP datagram every
:data:`PERIOD` seconds to a :class:`Listener` on the head (``WORKBENCH_HEARTBEAT=ADDR:PORT:TOKEN``
in its environment), and the launcher asks :meth:`Listener.silent` whether a rank has been quiet
for longer than the timeout: that rank's node is lost, and the job is stopped with its name.

Datagrams are ``TOKEN RANK HOST PID`` (ASCII), the token the listener's random one (others are
ignored); the guard (which sends them, in a thread, standard library only: it runs by path) is
the rank's parent, so it keeps beating while the rank computes or waits in MPI.
"""
from __future__ import annotations

import math
import os
import secrets
import socket
import threading
import time

#: environment variable that tells a guard where to send its heartbeats
ENV = "WORKBENCH_HEARTBEAT"
#: seconds between two heartbeats of a guard
PERIOD = 1.0
#: seconds of silence after which a rank's node counts as lost, unless :data:`TIMEOUT_ENV` says otherwise
TIMEOUT = 10.0
#: environment variable: the seconds of silence after which a rank's node counts as lost (a site whose nodes
#: may stall longer raises it; a shorter one names a lost node sooner, and risks naming a node that was only slow)
TIMEOUT_ENV = "WORKBENCH_HEARTBEAT_TIMEOUT"
#: seconds a rank may take to send its first heartbeat (mpiexec starting the node's proxy)
FIRST_TIMEOUT = 30.0


def timeout_seconds() -> float:
    """The seconds of silence after which a rank's node counts as lost: ``$WORKBENCH_HEARTBEAT_TIMEOUT``, else
    :data:`TIMEOUT`.

    Raises:
        ConfigError: the variable is not a number of seconds of at least three heartbeat periods (one line,
            naming it); the front ends ask before anything starts.
    """
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    if not text:
        return TIMEOUT
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 3 * PERIOD):
        from ...config import ConfigError
        raise ConfigError(f"{TIMEOUT_ENV}={text!r}: the seconds of silence after which a node counts as lost, a "
                          f"number >= {3 * PERIOD:g} (default {TIMEOUT:g}); set it so, or unset it")
    return seconds


class Listener:
    """Receives the guards' heartbeats on ``address`` (a port the OS picks) for ranks ``0..nranks-1``; a rank
    silent for ``timeout`` seconds (default :func:`timeout_seconds`) is lost."""

    def __init__(self, address: str, nranks: int | None = None, timeout: float | None = None,
                 first_timeout: float = FIRST_TIMEOUT) -> None:
        self.timeout = timeout_seconds() if timeout is None else timeout
        self.first_timeout, self.nranks = first_timeout, nranks
        self.token = secrets.token_hex(8)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind((address, 0))
        self._sock.settimeout(0.2)
        self.address = f"{address}:{self._sock.getsockname()[1]}"
        self.started = time.monotonic()
        self.last: dict[int, tuple[float, str, int]] = {}  # rank -> (when, host, pid)
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._receive, name="heartbeats", daemon=True)
        self._thread.start()

    @property
    def env(self) -> dict[str, str]:
        """What the ranks' environment needs so that their guards beat here."""
        return {ENV: f"{self.address}:{self.token}"}

    def _receive(self) -> None:
        while not self._closed:
            try:
                data = self._sock.recv(512)
            except socket.timeout:
                continue
            except OSError:
                return
            words = data.decode("ascii", "replace").split()
            if len(words) == 4 and words[0] == self.token and words[1].isdigit() and words[3].isdigit():
                with self._lock:
                    self.last[int(words[1])] = (time.monotonic(), words[2], int(words[3]))

    def restart(self, nranks: int | None = None) -> None:
        """Forget every rank (a new set of ranks is about to start)."""
        with self._lock:
            self.last.clear()
            self.started = time.monotonic()
            if nranks is not None:
                self.nranks = nranks

    def forget(self, rank: int) -> None:
        """Stop watching ``rank`` (it has ended)."""
        with self._lock:
            self.last.pop(rank, None)
            self.last[rank] = (float("inf"), "", 0)

    def silent(self) -> list[dict]:
        """Ranks quiet for longer than the timeout (or never heard ``first_timeout`` s after the
        start): dicts with ``rank``, ``host``, ``pid`` (when known) and ``seconds`` of silence."""
        now = time.monotonic()
        with self._lock:
            last = dict(self.last)
        out = []
        for rank, (when, host, pid) in sorted(last.items()):
            if now - when > self.timeout:
                out.append({"rank": rank, "host": host, "pid": pid, "seconds": now - when})
        if self.nranks is not None and now - self.started > self.first_timeout:
            out += [{"rank": r, "host": None, "pid": None, "seconds": now - self.started}
                    for r in range(self.nranks) if r not in last]
        return out

    def close(self) -> None:
        self._closed = True
        self._sock.close()

    def __enter__(self) -> "Listener":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def describe(silent: list[dict], nodes: dict[int, str] | None = None) -> str:
    """One line for lost ranks: ``node vc-2 stopped answering: no heartbeat from rank 2 (pid 4242) for 10 s``."""
    from .blame import who_is
    parts = []
    for s in silent:
        host = s.get("host") or (nodes or {}).get(s["rank"])
        parts.append(f"{who_is(s['rank'], host, s.get('pid'))}: no heartbeat for {s['seconds']:.0f} s")
    hosts = sorted({s.get("host") or (nodes or {}).get(s["rank"]) or "?" for s in silent})
    return (f"node{'s' if len(hosts) > 1 else ''} {', '.join(hosts)} stopped answering (a network partition, or the "
            f"node is down): {'; '.join(parts)}")
