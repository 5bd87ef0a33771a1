"""``wb.watch(run_id)``: follow, from a notebook, a run that something else launched and records in
the results store: ``workbench train`` in a terminal, or in an ``sbatch`` job.

``workbench train`` copies its ranks' metric records into the store's ``running`` row as they
come (:mod:`workbench.runtime.live`); a :class:`WatchedRun` reads what is new every ``interval``
seconds in a thread and, once the row leaves ``running``, the whole stored run (summary, history,
trace). It is a source for :class:`~workbench.dashboard.Dashboard` like a live ``Run``::

    watched = wb.watch("my-run")          # the id `workbench train` printed (its --out folder's name)
    wb.Dashboard(watched)                 # live loss, progress, accuracy; shares and timeline at the end
    result = watched.wait()               # the stored RunResult; RunError if the run failed

Watching only reads the store: it never stops the run (``scancel`` or Ctrl-C where it runs does).
"""
from __future__ import annotations

import threading
import time

from ...config import RunConfig
from ...results import history_frame
from .handle import RunError, RunHandle, expected_steps

#: seconds between looks at the store
WATCH_SECONDS = 1.0


def watch(run_id: str, store=None, interval: float = WATCH_SECONDS) -> "WatchedRun":
    """A :class:`WatchedRun` of ``run_id`` in ``store`` (a :class:`~workbench.store.Store`, a path,
    or None: the default store). FileNotFoundError when the store does not exist, KeyError naming it
    when the run is not in it (yet: a queued job's run is recorded when the job starts)."""
    return WatchedRun(run_id, store, interval)


class WatchedRun(RunHandle):
    """A run in the store as it goes (a :class:`~.handle.RunHandle` whose records come from the store's
    row): ``status``, ``history`` (DataFrame) grow; ``trace``, ``summary`` and ``result`` arrive when it
    ends. See the module's text."""

    kind = "WatchedRun"
    _stop_hint = ""  # watching never stops the run

    def __init__(self, run_id: str, store=None, interval: float = WATCH_SECONDS) -> None:
        from pathlib import Path

        from ...store import Store, default_path
        if not isinstance(store, Store):
            path = Path(store) if store is not None else default_path()
            if not path.exists():  # watching must not create an empty store
                raise FileNotFoundError(f"store: the results store {path} does not exist (workbench train creates "
                                        "it; pass store= the one the run is recorded in)")
            store = Store(path)
        self.interval = interval
        status, error, records, self._seq, config = store.follow(run_id, -1)
        # the store is read, never written: the handle records nothing (store=None); self.store reads
        super().__init__(run_id, config, None, None, _expected_steps(config))
        self.store, self.error, self._history = store, error, None
        self._records.extend(records)
        self._ended(status)
        if not self._done.is_set():
            threading.Thread(target=self._follow, name=f"watch-{run_id}", daemon=True).start()

    @property
    def history(self):
        with self._lock:
            if self._history is None:
                self._history = self.result.history if self.result is not None else history_frame(self._records)
            return self._history

    def _add(self, records=(), spans=()) -> None:
        with self._lock:
            self._history = None
        super()._add(records, spans)

    def _follow(self) -> None:
        while not self._done.is_set():
            time.sleep(self.interval)
            try:
                status, self.error, records, self._seq, _ = self.store.follow(self.run_id, self._seq)
                self._add(records)
            except Exception as exc:  # noqa: BLE001 - the run was deleted, the store moved: say so, end (wait() returns)
                status, self.error = "failed", f"workbench: watching run {self.run_id} stopped: {exc!r}"
            self._ended(status)

    def _ended(self, status: str) -> None:
        """When the row has left ``running``: the whole stored run, then the observers told."""
        if status == "running":
            return
        try:
            self.result = self.store.load(self.run_id)
            self.summary, self.error = self.result.summary, self.result.error
            with self._lock:
                self._spans[:] = self.result.trace
        except Exception:  # noqa: BLE001 - the records seen so far and the error stand
            pass
        with self._lock:
            self._history = None
        self._transition(status)
        self._done.set()
        for obs in list(self._observers):
            obs.on_finish(self)


def _expected_steps(config: dict) -> int | None:
    """The run's planned steps (the dashboard's 100%), or None when its data set cannot be read here."""
    try:
        return expected_steps(RunConfig.from_dict(config))
    except Exception:  # noqa: BLE001 - a data set on the cluster's file system only: no progress bar
        return None


__all__ = ["RunError", "WatchedRun", "watch"]
