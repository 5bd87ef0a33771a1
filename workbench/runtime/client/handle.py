"""One run as whoever started or follows it holds it: the notebook's :class:`~.run.Run` (ranks that are
ipyparallel engines), ``workbench train``'s :class:`~.batch_run.BatchRun` (ranks under mpiexec or srun)
and :class:`~.watch.WatchedRun` (a run something else launched, followed through the store) are one
:class:`RunHandle`: a status that changes one way (:class:`~.run_state.RunState`), the metric records and
spans as they come (``history``, ``trace``), observers told of both (the dashboard, a progress bar), the
store's row kept with it (``running`` before the ranks start, the records as they come, the end once),
``wait()`` that returns the :class:`~workbench.results.RunResult` or raises :class:`RunError` naming the
rank. The ranks' live channel (:mod:`workbench.runtime.live`) is read in one place, :meth:`RunHandle.receive`,
whichever transport brought its messages (the ranks' live files, or a signed ZeroMQ stream to the
notebook); what differs between the three is that transport (the store's rows, for a watched run) and what
starts the ranks (a :class:`~workbench.runtime.launch.launcher.Launcher`).

No MPI, no torch.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path

from ...config import RunConfig
from ...results import LiveSource, RunObserver, RunResult, history_frame
from ..live import Progress, records_in
from .run_state import RunState


class RunError(RuntimeError):
    """A run failed; ``rank`` is the failing rank (None if unknown), ``traceback`` its traceback."""

    def __init__(self, message: str, rank: int | None = None, traceback: str | None = None) -> None:
        super().__init__(message)
        self.rank, self.traceback = rank, traceback


def expected_steps(cfg: RunConfig) -> int:
    """The run's steps, for the progress bar: from the data set's size, without loading it."""
    from ... import data as data_mod
    from ...summary import planned_steps
    train_samples = data_mod.describe(cfg.dataset, **cfg.data_sizes).train_samples
    return sum(planned_steps(train_samples, cfg.workers, cfg.batch_size, cfg.epochs, cfg.spec.synchronous))


def open_store(store):
    """``store`` as a :class:`~workbench.store.Store`: one already, a path, None (the default store);
    False: None (nothing recorded)."""
    if store is False:
        return None
    from ...store import Store
    return store if isinstance(store, Store) else Store(store)


class RunHandle(LiveSource):
    """A run: ``run_id``, ``config`` (a dict), ``run_dir``, ``status``, ``history`` and ``trace`` as they
    grow, ``error`` and ``failed_rank`` when it failed, ``summary`` and ``result`` when it ended; recorded
    in ``store`` (None: nowhere). See the module's text."""

    #: the class name a repr shows
    kind = "Run"

    def __init__(self, run_id: str, config: dict, run_dir=None, store=None, total_steps: int | None = None) -> None:
        self.run_id, self.config, self.store, self.total_steps = run_id, config, store, total_steps
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self._state = RunState(run_id)
        self.error: str | None = None
        self.failed_rank: int | None = None
        self.summary, self.result = None, None
        self._records: list[dict] = []
        self._spans: list[dict] = []
        self._stored = 0  # records already in the store
        self.progress = Progress()  # each rank's planned and recorded steps, from the live channel
        self._observers: list[RunObserver] = []
        self._lock = threading.Lock()
        self._done = threading.Event()

    # -- status ----------------------------------------------------------------------------------
    @property
    def status(self) -> str:
        """``running``, then ``finished``, ``cancelled`` or ``failed`` (:mod:`.run_state`)."""
        return self._state.status

    @property
    def ended(self) -> float | None:
        """When the run's status left ``running`` (unix seconds), or None while it runs."""
        return self._state.ended

    def _transition(self, new: str, error: str | None = None, *, if_running: bool = False) -> None:
        """The one place the status changes (:meth:`RunState.move`: an illegal change raises
        :class:`RunStateError`; ``if_running``: only a running run); ``error``, when given and the
        status changed, becomes the run's error. Recording the end is :meth:`_end`'s, once."""
        if self._state.move(new, if_running=if_running) and error is not None:
            self.error = error

    # -- what came ---------------------------------------------------------------------------------
    @property
    def history(self):
        """Metric records so far as a DataFrame, one row per record (a snapshot; the columns: those of
        :class:`~workbench.results.RunResult`'s ``history``)."""
        with self._lock:
            records = list(self._records)
        return history_frame(records)

    @property
    def trace(self) -> list[dict]:
        """Chrome-trace spans so far (a snapshot): dicts with ``ts`` and ``dur`` in microseconds."""
        with self._lock:
            return list(self._spans)

    def receive(self, messages: list[dict]) -> None:
        """The ranks' live-channel messages (:mod:`workbench.runtime.live`), whatever brought them: their
        records and spans kept and the observers told, the progress noted, and the first rank that
        reported an error (its traceback) taken as the run's failing rank until a launcher's blame says
        otherwise.

        Args:
            messages: the messages as the channel carries them (dicts, each with its ``rank``).
        """
        self.progress.note(messages)
        for message in messages:
            if "error" in message and self.failed_rank is None:
                self.failed_rank, self.error = message["rank"], message["error"]
        self._add(*records_in(messages))

    def _add(self, records=(), spans=()) -> None:
        """New metric records and spans: kept, and the observers told."""
        if not records and not spans:
            return
        with self._lock:
            self._records.extend(records)
            self._spans.extend(spans)
        for obs in list(self._observers):
            obs.on_data(self)

    # -- the store's row ---------------------------------------------------------------------------
    def _record_start(self, **row) -> None:
        """The store's ``running`` row, before any rank starts (``row``: ``resumed_from``, ``sweep_id``, ...)."""
        if self.store is not None:
            self.store.start_run(self.run_id, self.config,
                                 run_dir=str(self.run_dir) if self.run_dir is not None else None, **row)

    def _store_records(self) -> None:
        """Append the records not in the store yet to the run's row."""
        if self.store is None:
            return
        with self._lock:
            new = self._records[self._stored:]
        if new:
            self.store.append_metrics(self.run_id, new)
            self._stored += len(new)

    def _end(self, result: RunResult | None = None) -> None:
        """The run has ended (its status set): its result (``result``, else what came live), the store's
        row, ``wait()`` woken, the observers told. Once."""
        if result is not None:
            self.result, self.summary = result, result.summary
        if self.result is None:  # no summary: what the live records brought is the record
            self.result = RunResult(run_id=self.run_id, config=self.config, history=self.history, trace=self.trace,
                                    error=self.error, run_dir=str(self.run_dir) if self.run_dir else None)
        self.result.status = self.status
        try:
            if self.store is not None:  # the result's history replaces the records stored live
                self.store.finish(self.result)
        finally:
            self._done.set()
            for obs in list(self._observers):
                obs.on_finish(self)

    # -- waiting -----------------------------------------------------------------------------------
    def wait(self, timeout: float | None = None) -> RunResult:
        """Block until the run ends and return its :class:`~workbench.results.RunResult`. Raises
        :class:`TimeoutError` after ``timeout`` seconds (the run goes on) and :class:`RunError` naming the
        rank when the run failed."""
        self._wait_done(timeout)
        return self._outcome()

    def _wait_done(self, timeout: float | None) -> None:
        """Until the run ends; TimeoutError after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._done.wait(0.1):  # short waits: KeyboardInterrupt gets through
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"run {self.run_id} still {self.status} after {timeout:g} s "
                                   f"(it goes on; wait() again{self._stop_hint})")

    def _outcome(self) -> RunResult:
        """An ended run's result; RunError naming the rank when it failed."""
        if self.status == "failed":
            raise RunError(self.error or "the run failed", rank=self.failed_rank, traceback=self.error)
        return self.result

    #: what a TimeoutError adds to "wait() again"
    _stop_hint = " or cancel() it"

    def __repr__(self) -> str:
        algorithm = self.config.get("algorithm") if self.config else None
        return f"<workbench.{self.kind} {self.run_id}{' ' + algorithm if algorithm else ''} {self.status}: " \
               f"{', '.join(self._said())}>"

    def _said(self) -> list[str]:
        """What the repr says after the status: the steps so far, or once ended the steps each worker took (a
        restart at fewer ranks leaves fewer records than planned) and the accuracy."""
        summary = (self.result.summary or {}) if self.result is not None else {}
        if summary.get("steps_per_worker") is not None:
            said = [f"{summary['steps_per_worker']} steps a worker"]
        else:
            with self._lock:
                steps = sum(1 for r in self._records if r.get("kind") == "train")
            said = [f"{steps}/{self.total_steps if self.total_steps is not None else '?'} steps"]
        if summary.get("final_test_accuracy") is not None:
            said.append(f"accuracy {summary['final_test_accuracy']:.3f}")
        return said
