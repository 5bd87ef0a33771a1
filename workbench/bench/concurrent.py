"""N processes measuring at once on this machine, as N ranks would: :func:`run` starts them
(``spawn``), each runs the same top-level measure function with a :class:`Sync` of its own, and
their answers come back in one list; :func:`skew` reads how far apart lock-step processes finish.

    from workbench.bench.concurrent import run, skew
    answers = run(measure, args, processes=4, lockstep=True)   # measure(*args, sync=...) -> dict, in 4 processes
    skew([a["totals"] for a in answers])

:func:`workbench.bench.step.profile_step` (``processes=N``) is its user: the measure function is
passed in, so this module imports nothing of the step's (no import circle).

**Concurrent profiles**: N processes (``spawn``) measure at once, to see the compute the way N
ranks on this machine see it (N ranks on fewer cores share them). Every phase starts at a barrier
(:meth:`Sync.barrier`), and a process that has finished its timed repetitions keeps running
untimed ones until every process has finished (:meth:`Sync.hooks`), so the load is N processes
throughout.

Each process runs in a session of its own (``os.setsid``), as every rank (with its guard) under
MPICH's ``mpiexec`` does: where Linux groups the scheduling by session (autogroup, on here), a
busy machine's cores are shared between sessions first, so N processes of one session would get
one share where N ranks get N (on the virtual cluster, 18 other busy processes on the 2 cores,
two such processes took 136 ms per lenet step, with the pauses below, where the ranks' compute
took 53 ms). Each answer names its session (``"session"``) and ``"paused_s"``.

**Lock-step** (``lockstep=True``): every repetition starts at a barrier whose waiters spin
(``os.sched_yield`` between looks, as a rank waiting in MPI keeps polling), the way ``sync-sgd``'s
ranks meet at each step's all-reduce (:attr:`Sync.before`). Then the processes finish a
repetition at different times: :func:`skew` is the mean over repetitions of (the slowest
process's repetition) - (the mean process's). That is the straggler term of
:func:`workbench.netsim.predict.predict` (``skew_s``): on dedicated devices it is near zero; with
4 ranks time-sliced on 2 cores it is not.

**Pauses** (``pause_s``, with ``lockstep``): before each barrier every process first spends
``pause_s`` seconds yielding the CPU in a loop (``os.sched_yield``), as a rank does while its
all-reduce is on the network (:func:`workbench.deadline.poll`), so the profile computes in the
same rhythm as the run: compute, wait, compute. Give it the step's predicted communication time.
On cores shared with other work the rhythm changes the compute: on the virtual cluster at 200
Mbit/s, with about 20 other busy processes on the 2 cores, two processes profiling lenet took
47.5 ms per step back to back and 76.5 ms with 28.9 ms pauses, against 74-76 ms of compute in the
runs' traces (wide_mlp: 141 and 173 ms, against 151-159 ms); scheduler or caches, these runs do
not separate.

Standard library only here (the measure function brings torch into the processes).
"""
from __future__ import annotations

import os
import statistics
import time
from typing import Callable

from ..checks import integer
from ..deadline import yield_cpu
from .layers import LayerProfileError


class Sync:
    """Phase barriers, the 'keep the load on until everyone is done' counter of N processes and,
    with ``lockstep``, a spinning barrier before every repetition (:attr:`before`; None without)."""

    def __init__(self, barrier, done, processes: int, step=None, timeout: float = 600, pause: float = 0.0) -> None:
        self._barrier, self._done, self.processes = barrier, done, processes
        self._step, self.timeout = step, timeout   # step: (arrived, generation) shared counters
        self.pause, self.paused = pause, 0.0   # paused: seconds spent in pauses so far
        self.before = self._meet if step is not None else None

    def _meet(self) -> None:
        """Yield the CPU for :attr:`pause` seconds (a rank waiting for its all-reduce), then wait,
        spinning with ``sched_yield``, until every process has arrived."""
        if self.pause > 0:
            start = time.monotonic()
            while time.monotonic() < start + self.pause:
                yield_cpu()
            self.paused += time.monotonic() - start
        arrived, generation = self._step
        with arrived.get_lock():
            mine = generation.value
            arrived.value += 1
            if arrived.value == self.processes:
                arrived.value = 0
                generation.value += 1
                return
        deadline = time.monotonic() + self.timeout
        while generation.value == mine:
            os.sched_yield()
            if time.monotonic() > deadline:
                raise TimeoutError(f"profile_step: a lock-step barrier waited more than {self.timeout} s")

    def barrier(self) -> None:
        """Every process at the start of a phase (and the 'done' counter back to 0)."""
        self._barrier.wait()
        with self._done.get_lock():
            self._done.value = 0
        self._barrier.wait()

    def hooks(self):
        """``(keep_going, done)`` for :func:`workbench.bench.layers.time_calls`: untimed calls go
        on until every process has said ``done()``."""
        def done():
            with self._done.get_lock():
                self._done.value += 1
        return (lambda: self._done.value < self.processes), done


def check_processes(processes: int, lockstep: bool, pause_s: float) -> None:
    """LayerProfileError unless ``processes`` >= 1, ``lockstep`` with >= 2 of them and ``pause_s``
    seconds in [0, 3600) only with ``lockstep``."""
    integer("processes", processes, 1, LayerProfileError)
    if lockstep and processes < 2:
        raise LayerProfileError(f"lockstep needs processes >= 2 (ranks that wait for each other); got {processes}")
    if not isinstance(pause_s, (int, float)) or isinstance(pause_s, bool) or not 0 <= pause_s < 3600:
        raise LayerProfileError(f"pause_s must be seconds in [0, 3600); got {pause_s!r}")
    if pause_s and not lockstep:
        raise LayerProfileError("pause_s needs lockstep=True (the pause comes before each lock-step meeting)")


def _child(queue, barrier, done, processes: int, step, timeout: float, pause: float, measure: Callable,
           args: tuple) -> None:
    try:
        os.setsid()   # a session of its own, as mpiexec starts each rank (see the module's text)
        sync = Sync(barrier, done, processes, step, timeout, pause)
        queue.put(("ok", {**measure(*args, sync=sync), "session": os.getsid(0), "paused_s": sync.paused}))
    except BaseException as exc:   # noqa: BLE001 - reported to the parent, which raises it
        barrier.abort()
        queue.put(("error", f"{type(exc).__name__}: {exc}"))


def _collect(queue, children, timeout: float) -> list[tuple[str, object]]:
    """One answer per child; a child that died without answering (or the timeout) is an error."""
    import queue as queues
    answers, deadline = [], time.monotonic() + timeout
    while len(answers) < len(children):
        try:
            answers.append(queue.get(timeout=0.5))
            continue
        except queues.Empty:
            pass
        dead = [c.exitcode for c in children if c.exitcode not in (None, 0)]
        if dead:
            raise RuntimeError(f"profile_step: a profiling process died (exit code {dead[0]}) before answering")
        if time.monotonic() > deadline:
            raise TimeoutError(f"profile_step: the profiling processes did not finish within {timeout} s")
    return answers


def run(measure: Callable[..., dict], args: tuple, processes: int, *, lockstep: bool = False, pause_s: float = 0.0,
        timeout: float = 600) -> list[dict]:
    """``measure(*args, sync=Sync)`` in ``processes`` ``spawn`` processes at once (see the
    module's text), their answers (dicts, with ``"session"`` and ``"paused_s"`` added) in the
    order they came. ``measure`` must be a module's top-level function (a spawn process imports
    it by name) that returns a picklable dict. A process that fails, dies or outlives
    ``timeout`` seconds is a RuntimeError (or TimeoutError) here."""
    check_processes(processes, lockstep, pause_s)
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    queue, barrier, done = ctx.Queue(), ctx.Barrier(processes, timeout=timeout), ctx.Value("i", 0)
    step = (ctx.Value("i", 0), ctx.Value("q", 0)) if lockstep else None
    children = [ctx.Process(target=_child, args=(queue, barrier, done, processes, step, timeout, pause_s, measure,
                                                 args), daemon=True)
                for _ in range(processes)]
    for child in children:
        child.start()
    try:
        answers = _collect(queue, children, timeout)
    finally:
        for child in children:
            child.join(timeout=10)
            if child.is_alive():
                child.terminate()
    errors = [text for status, text in answers if status == "error"]
    if errors:
        raise RuntimeError(f"profile_step: a profiling process failed: {errors[0]}")
    return [payload for _, payload in answers]


def skew(totals: list[list[float]]) -> float:
    """Mean over repetitions of (slowest process) - (mean process), from each process's
    repetitions' seconds: repetitions are aligned by the lock-step barrier, so repetition k of
    every process ran between the same two meetings."""
    return statistics.fmean(max(reps) - statistics.fmean(reps) for reps in zip(*totals))
