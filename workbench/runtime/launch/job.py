"""One launched MPI job seen from this host: its output (captured, echoed when streaming), the
processes under the launcher, the signals this process got while it ran, the ranks' heartbeats,
and stopping all of it. Used by :func:`workbench.runtime.launch.launcher.run_mpi`."""
from __future__ import annotations

import codecs
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from ..processes import alive, stop_processes
from .blame import ended_badly, rank_records
from .heartbeat import Listener
from .signals import handling_signals


class Job:
    """One ``mpiexec`` (or ``srun``): its output (captured, and echoed when streaming), the processes
    under it, the signals this process got while it ran, its ranks' heartbeats, and stopping all of it."""

    POLL = 0.05  # seconds between two looks at the job
    TERM_GRACE = 3.0  # seconds from SIGTERM to SIGKILL when stopping
    #: seconds the ranks' guards on this host get, after mpiexec ended, to record how their ranks
    #: ended (:meth:`settle`): more than the guard's grace for a rank whose launcher died
    SETTLE = 8.0
    #: seconds the launcher gets to end the job once a rank ended badly by itself (its guard recorded a
    #: signal or a non-zero exit): MPICH and Open MPI end it within about a second, while Intel MPI's
    #: hydra was seen waiting for good on the other ranks (a rank killed while they started up), so the
    #: job is then stopped (:meth:`wait`'s outcome ``abandoned``) and blamed from the records
    ABANDONED_GRACE = 20.0

    def __init__(self, cmd: list[str], env: dict[str, str], cwd, stream: bool, tmp: Path,
                 status_dir: Path, listener: Listener | None = None) -> None:
        self.stream, self.tmp, self.status_dir, self.listener = stream, tmp, status_dir, listener
        self.lost: list[dict] = []  # ranks whose heartbeats stopped
        # with heartbeats (ranks on a virtual cluster's nodes, which share this host's process table),
        # when each rank's process and its guard were first seen gone: a rank whose guard died with it
        # (its node's processes killed) leaves no record of how it ended
        self.guard_ended: dict[int, float] = {}
        self._stop_watching = threading.Event()
        self.signals: list[int] = []
        self._chunks: list[str] = []
        self._lock = threading.Lock()
        self._echo_broken = False
        self._offsets: dict[Path, int] = {}
        self._decoders: dict[Path, object] = {}
        self._known: dict[int, object] = {}  # pid -> psutil.Process of the job's processes
        self._starts_seen = 0
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE if stream else subprocess.STDOUT,
            encoding="utf-8", errors="replace", env=env, cwd=cwd, start_new_session=True)
        if listener is not None and hasattr(os, "pidfd_open"):
            threading.Thread(target=self._watch_guards, name="guards", daemon=True).start()
        pipes = [(self.proc.stdout, sys.stdout)] + ([(self.proc.stderr, sys.stderr)] if stream else [])
        self._readers = [threading.Thread(target=self._pump, args=(pipe, echo), daemon=True)
                         for pipe, echo in pipes]
        for reader in self._readers:
            reader.start()

    # -- output ----------------------------------------------------------------------------
    def _echo(self, stream, text: str) -> None:
        if not self.stream or self._echo_broken or not text:
            return
        try:
            stream.write(text)
            stream.flush()
        except (OSError, ValueError):  # the terminal is gone (SIGHUP) or stdout was closed
            self._echo_broken = True

    def _pump(self, pipe, echo) -> None:
        for line in pipe:
            with self._lock:
                self._chunks.append(line)
                self._echo(echo, line)

    def _follow(self, final: bool = False) -> None:
        """Show what the ranks wrote to their output files since the last look."""
        if not self.stream:
            return
        for path in sorted(self.tmp.glob("rank*.out")) + sorted(self.tmp.glob("rank*.err")):
            try:
                with open(path, "rb") as f:
                    f.seek(self._offsets.get(path, 0))
                    data = f.read()
            except OSError:
                continue
            self._offsets[path] = self._offsets.get(path, 0) + len(data)
            decoder = self._decoders.setdefault(path, codecs.getincrementaldecoder("utf-8")("replace"))
            text = decoder.decode(data, final=final)
            with self._lock:
                self._echo(sys.stdout if path.suffix == ".out" else sys.stderr, text)

    def finish_output(self) -> None:
        self._stop_watching.set()
        for reader in self._readers:
            reader.join(timeout=5)  # at EOF: every process that held mpiexec's output has ended
        for pipe, reader in zip((self.proc.stdout, self.proc.stderr), self._readers):
            if pipe is not None and not reader.is_alive():
                pipe.close()
        self._follow(final=True)

    def launcher_output(self) -> str:
        with self._lock:
            return "".join(self._chunks)

    # -- waiting ---------------------------------------------------------------------------
    def _on_signal(self, signum: int, frame) -> None:
        self.signals.append(signum)

    def wait(self, timeout: float, on_interrupt, grace: float) -> str:
        """Wait until mpiexec ends: ``exited`` (by itself, after a signal or not), ``interrupted``
        (stopped after a signal), ``lost`` (a rank's heartbeats stopped: killed), ``abandoned`` (a rank
        ended badly and the launcher did not end the job within :data:`ABANDONED_GRACE`: killed) or
        ``timeout`` (killed)."""
        deadline = time.monotonic() + timeout
        stop_at = bad_since = None
        next_look = 0.0
        with handling_signals(self._on_signal):
            while self.proc.poll() is None:
                now = time.monotonic()
                if self.signals and stop_at is None:
                    stop_at = now
                    if on_interrupt is not None:
                        try:
                            on_interrupt()
                            stop_at = now + max(0.0, grace)
                        except Exception:  # noqa: BLE001 - cannot ask nicely: stop it
                            pass
                if stop_at is not None and (now >= stop_at or len(self.signals) > 1):
                    self.stop(immediate=len(self.signals) > 1)
                    return "interrupted"
                if now >= deadline:
                    self.stop(immediate=True)
                    return "timeout"
                if self.listener is not None:
                    for end in self.status_dir.glob("*.status"):  # ended ranks beat no more
                        rank = end.stem.removeprefix("rank")
                        if rank.isdigit():
                            self.listener.forget(int(rank))
                    self.lost = self.listener.silent()
                    if self.lost:
                        self.stop(immediate=True)
                        return "lost"
                if now >= next_look:  # a rank ended badly and the launcher has not ended the job
                    next_look = now + 1.0
                    if bad_since is None and any(ended_badly(e) for e in rank_records(self.status_dir)[1]):
                        bad_since = now
                    if bad_since is not None and now - bad_since > self.ABANDONED_GRACE:
                        self.stop(immediate=True)
                        return "abandoned"
                self._remember_processes()
                self._follow()
                time.sleep(self.POLL)
        return "exited"

    def _watch_guards(self) -> None:
        """(A thread, with heartbeats only: the ranks' pids are this host's.) When each rank's guard
        process ends, to the millisecond (``pidfd``): a guard that ends without writing how its rank
        ended was killed from outside, with its rank (a node's processes killed); the first of those is
        the cause, the others (killed by the launcher after it) consequences."""
        import select
        poller, fds, watched = select.poll(), {}, set()
        try:
            while not self._stop_watching.is_set():
                for path in self.status_dir.glob("rank*.start"):
                    rank = path.stem.removeprefix("rank")
                    if not rank.isdigit() or int(rank) in watched:
                        continue
                    try:
                        fd = os.pidfd_open(json.loads(path.read_text())["guard_pid"])
                    except (OSError, ValueError, KeyError):
                        continue  # half-written record, or the guard is gone already
                    watched.add(int(rank))
                    fds[fd] = int(rank)
                    poller.register(fd, select.POLLIN)
                for fd, _ in poller.poll(20):
                    rank = fds.pop(fd)
                    poller.unregister(fd)
                    os.close(fd)
                    self.guard_ended.setdefault(rank, time.monotonic())
        finally:
            for fd in fds:
                os.close(fd)

    @property
    def vanished(self) -> dict[int, float]:
        """Ranks whose guard ended without a record of how the rank ended, with when (monotonic s)."""
        return {r: t for r, t in self.guard_ended.items() if not (self.status_dir / f"rank{r}.status").exists()}

    def settle(self, timeout: float = SETTLE) -> None:
        """After mpiexec ended by itself: wait, at most ``timeout`` s, until each rank guard of this job
        seen on this host has recorded how its rank ended or has ended. (On an ``MPI_Abort`` hydra kills
        the process groups it started and exits; each guard, in its own session, outlives that kill to
        record its rank's end, which may come after: a killed rank whose guard woke late.)"""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            starts, _ = rank_records(self.status_dir)
            if not any(s.get("guard_pid") in self._known and alive(self._known[s["guard_pid"]])
                       and not (self.status_dir / f"rank{r}.status").exists() for r, s in starts.items()):
                return
            time.sleep(self.POLL)

    def _remember_processes(self, force: bool = False) -> None:
        """Note mpiexec's descendants (each rank runs in its own session, so a process group
        does not hold them): looked at again whenever another rank has started."""
        starts = len(list(self.status_dir.glob("*.start")))
        if not force and starts == self._starts_seen and self._known:
            return
        self._starts_seen = starts
        try:
            import psutil
            root = psutil.Process(self.proc.pid)
            self._known.setdefault(root.pid, root)  # mpiexec itself, whatever its children tell
            for p in root.children(recursive=True):
                self._known.setdefault(p.pid, p)
        except Exception:  # noqa: BLE001 - psutil missing, or mpiexec just ended
            pass

    def stop(self, immediate: bool = False, settle: bool = False) -> None:
        """End every process of the job (mpiexec and its descendants, each rank in its own session):
        SIGTERM (mpiexec passes it on, each rank's guard too), SIGKILL after ``TERM_GRACE`` s, at once
        with ``immediate`` or when another signal comes meanwhile; then wait up to 10 s for the ends.
        ``settle`` (mpiexec ended by itself): first give the guards time to record (:meth:`settle`)."""
        if settle:
            self.settle()
        if self.proc.poll() is None:
            self._remember_processes(force=True)
        signals_before = len(self.signals)
        stop_processes(self._known.values(), grace=0 if immediate else self.TERM_GRACE, kill_wait=10.0,
                       hurry=lambda: len(self.signals) != signals_before, callback=self._reaped)
        self.proc.poll()

    def _reaped(self, process) -> None:
        """psutil reaped mpiexec (our child) while stopping it: keep its exit status for the Popen,
        which would otherwise read 0 (``ECHILD``)."""
        if process.pid == self.proc.pid and self.proc.returncode is None and process.returncode is not None:
            self.proc.returncode = int(process.returncode)
