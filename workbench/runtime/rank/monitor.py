"""What is seen of a rank from outside, and what comes in from there: its telemetry spans, the
metric records its observers see, the clock of the ranks' common start, and the cancel flag."""
from __future__ import annotations

import os
import time
from contextlib import nullcontext
from pathlib import Path

from ...telemetry import Telemetry
from ..rundir import CANCEL_FILE


class Monitor:
    """One rank's telemetry, metrics and cancellation; made at the ranks' common start (``t0``).

    Args:
        rank: this rank.
        out_dir: the run directory (its ``CANCEL`` file asks the run to stop), or None.
        observers: telemetry Observers: they see the spans and the metric records.
        steps: the steps this rank plans (``steps_completed`` until a cancel says fewer).
        telemetry: record spans (``RunConfig.telemetry``).

    Attributes:
        t0: ``time.perf_counter()`` seconds at the common start.
        telemetry: the span recorder, or None when telemetry is off.
        metrics: the metric records kept so far.
        cancelled, steps_completed: whether the run was cancelled, and after how many steps.
    """

    #: seconds between two looks at the cancel flag (a stat call; cheap, but not free per step)
    STOP_CHECK_SECONDS = 0.1

    def __init__(self, rank: int, out_dir: Path | None, observers=(), steps: int = 0, telemetry: bool = True) -> None:
        self.t0 = time.perf_counter()
        self.telemetry = Telemetry(rank, time.perf_counter_ns()) if telemetry else None
        self.observers = list(observers)
        if self.telemetry:
            self.telemetry.observers.extend(self.observers)
        self.metrics: list[dict] = []
        self.cancelled, self.steps_completed = False, steps
        self._cancel_flag = Path(out_dir) / CANCEL_FILE if out_dir is not None else None
        self._next_stop_check = 0.0

    def span(self, name: str, cat: str, **args):
        """A telemetry span, or nothing when telemetry is off."""
        return self.telemetry.span(name, cat, **args) if self.telemetry else nullcontext(args)

    def now(self) -> float:
        """Seconds since the ranks started together."""
        return time.perf_counter() - self.t0

    def add_metric(self, record: dict) -> None:
        """Keep a metric record and show it to the observers (the live stream)."""
        self.metrics.append(record)
        for obs in self.observers:
            obs.on_metric(record)

    def flush(self) -> None:
        """Send what the observers hold now (a live channel's pending records): before a checkpoint, so that
        a run restarted from it has every record up to it (the channel sends at most every second)."""
        for obs in self.observers:
            if callable(getattr(obs, "flush", None)):
                obs.flush()

    def stop_requested(self) -> bool:
        """Whether someone asked this run to stop (``cancel()`` writes ``<run_dir>/CANCEL``).

        Local to this rank and looked at no more than every ``STOP_CHECK_SECONDS``; synchronous
        algorithms agree on it (:meth:`~workbench.runtime.rank.context.Context.agree_to_stop`).
        """
        if self._cancel_flag is None:
            return False
        now = time.perf_counter()
        if now < self._next_stop_check:
            return False
        self._next_stop_check = now + self.STOP_CHECK_SECONDS
        return os.path.exists(self._cancel_flag)
