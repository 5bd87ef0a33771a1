"""Ending processes, one way, on psutil: every place that stops what it (or a kernel that died)
started calls :func:`stop_processes` (a job's mpiexec and ranks, a cluster's engines, a private
Slurm's daemons, a virtual cluster's processes, the ranks a cancelled Slurm step left).

A process counts as ended once it has exited or is a zombie (dead, its parent not reaping it: a
parent killed with it, or one that is not this process); our own children are reaped. Pure of
MPI and torch: the virtual cluster and the launcher use it.
"""
from __future__ import annotations

import signal
import time
from typing import Callable, Iterable

import psutil

#: seconds between two looks at the processes being stopped
POLL = 0.05


def alive(process: psutil.Process | int | None) -> bool:
    """``process`` (a psutil.Process or a pid) runs: it exists, is the same process (psutil checks
    the pid was not reused) and is not a zombie. No pid (None) is no process."""
    try:
        proc = _process(process)
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, TypeError, ValueError):  # gone, or no pid at all
        return False


def _process(process: psutil.Process | int) -> psutil.Process:
    """``process`` as a psutil.Process; a TypeError for anything but a pid (``psutil.Process(None)``
    would be this process)."""
    if isinstance(process, psutil.Process):
        return process
    if not isinstance(process, int) or isinstance(process, bool):
        raise TypeError(f"a pid or a psutil.Process, not {process!r}")
    return psutil.Process(process)


def stop_processes(processes: Iterable[psutil.Process | int], grace: float = 3.0, kill_wait: float = 5.0, *,
                   first: signal.Signals | None = signal.SIGTERM, hurry: Callable[[], bool] | None = None,
                   callback: Callable[[psutil.Process], object] | None = None) -> list[psutil.Process]:
    """End ``processes`` (psutil.Process objects or pids; those already gone are skipped):

    1. send ``first`` (SIGTERM) to each, unless ``grace`` is 0 (SIGKILL at once) or ``first`` is
       None (something else already asked them to end: ``scancel``, a cooperative cancel);
    2. wait up to ``grace`` seconds for them to end; ``hurry()``, asked at each look, cuts the wait
       short when it returns true (a second Ctrl-C);
    3. send SIGKILL to those still running and wait up to ``kill_wait`` seconds more.

    Waiting is ``psutil.wait_procs``: our own children are reaped, and ``callback(proc)`` is called
    once for each process that ended (psutil sets ``proc.returncode`` on our children: the exit code,
    or minus the signal). Returns the processes still running at the end: normally none; one in an
    uninterruptible sleep, or one this user may not signal (left alone), can outlive the wait.
    """
    procs, refused = [], []
    for process in processes:
        try:
            procs.append(_process(process))
        except psutil.NoSuchProcess:
            continue
    procs = [p for p in procs if alive(p)]
    if procs and grace > 0:
        refused += _send(procs, first) if first is not None else []
        procs = _wait([p for p in procs if p not in refused], grace, hurry, callback)
    if procs:
        refused += _send(procs, signal.SIGKILL)
        procs = _wait([p for p in procs if p not in refused], kill_wait, None, callback)
    return procs + refused


def _send(procs: list[psutil.Process], signum: int) -> list[psutil.Process]:
    """Send ``signum`` to each (psutil checks the pid was not reused); the ones refused."""
    refused = []
    for proc in procs:
        try:
            proc.send_signal(signum)
        except psutil.NoSuchProcess:  # ended meanwhile
            pass
        except psutil.AccessDenied:
            refused.append(proc)
    return refused


def _wait(procs: list[psutil.Process], timeout: float, hurry: Callable[[], bool] | None,
          callback: Callable[[psutil.Process], object] | None) -> list[psutil.Process]:
    """Wait up to ``timeout`` s (less if ``hurry()``) until ``procs`` ended; the ones still running."""
    deadline = time.monotonic() + timeout
    while procs and time.monotonic() < deadline and not (hurry is not None and hurry()):
        gone, procs = psutil.wait_procs(procs, timeout=min(POLL, max(deadline - time.monotonic(), 0.0)),
                                        callback=callback)
        zombies = [p for p in procs if not alive(p)]  # not ours to reap: dead all the same
        procs = [p for p in procs if p not in zombies]
        if callback is not None:
            for proc in zombies:
                callback(proc)
    return procs
