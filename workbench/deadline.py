"""One deadline for every wait: a rank, the notebook or the CLI never waits without one.

Pure (standard library only). :class:`Deadline` is a point in ``time.monotonic()`` (or none, for
"wait forever"); :func:`poll` spins on a completion test until it passes or the deadline
expires, letting the peers it waits for run in between (ranks often outnumber cores).
"""
from __future__ import annotations

import os
import time
from typing import Callable

#: give the core to another runnable process (the peers we wait for); no sched_yield on macOS
yield_cpu: Callable[[], None] = getattr(os, "sched_yield", lambda: time.sleep(0))


class Deadline:
    """``timeout`` seconds from now; ``None`` never expires."""

    __slots__ = ("timeout", "at")

    def __init__(self, timeout: float | None) -> None:
        self.timeout = timeout
        self.at = None if timeout is None else time.monotonic() + timeout

    def expired(self) -> bool:
        return self.at is not None and time.monotonic() >= self.at

    def left(self) -> float | None:
        """Seconds left (never negative), or ``None`` when there is no deadline: pass it on as
        the timeout of the next wait of several that share this deadline."""
        return None if self.at is None else max(self.at - time.monotonic(), 0.0)

    def __repr__(self) -> str:
        return f"Deadline({self.timeout!r}, left={self.left()!r})"


def poll(done: Callable[[], bool], timeout: float | Deadline | None, expired: Callable[[], BaseException], *,
         spin: float | None = None, nap: float = 5e-5) -> None:
    """Call ``done()`` until it returns true; raise ``expired()`` once ``timeout`` (seconds, or a
    shared :class:`Deadline`) has passed. Between tries the CPU is yielded; with ``spin``
    seconds, only for the first ``spin`` seconds, then the caller naps ``nap`` seconds a try."""
    deadline = timeout if isinstance(timeout, Deadline) else Deadline(timeout)
    start = time.monotonic()
    while not done():
        if deadline.expired():
            raise expired()
        if spin is None or time.monotonic() - start < spin:
            yield_cpu()
        else:
            time.sleep(nap)
