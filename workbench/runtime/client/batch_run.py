"""A batch run: ``workbench train`` and ``workbench compare`` hold the run they launch as a
:class:`BatchRun`, the same :class:`~.handle.RunHandle` a notebook's run is, with its ranks under a batch
launcher (:mod:`workbench.runtime.launch.launcher`: mpiexec on this machine or a virtual cluster's
nodes, srun inside a Slurm allocation) and its records coming from the ranks' live files
(:mod:`workbench.runtime.live`). It runs in the foreground (:meth:`BatchRun.run`: the launcher handles
SIGINT, SIGTERM and SIGHUP from the main thread) and is recorded in the store whatever ends it: a
``running`` row before the ranks start (a crash leaves a trace), the records as they come, then the
finished run, or the failure and its error with the records so far.

No MPI in this process.
"""
from __future__ import annotations

import time
from pathlib import Path

from ...config import RunConfig
from ...results import RunResult
from ..launch.signals import deferred_signals, signals_ignored
from .handle import RunHandle, expected_steps


class BatchRun(RunHandle):
    """``cfg`` run in ``run_dir`` under a batch launcher (``launch``: the keyword arguments of
    :func:`workbench.runtime.launch.batch.train`: ``launcher``, ``srun_args``, ``vcluster``, ``ppn``,
    ``resume``, ``timeout``), recorded in ``store`` as ``run_id``. ``resumed_from``: the run it continues
    (its id, or its folder); ``progress``: a progress bar on stderr while it runs."""

    kind = "BatchRun"

    def __init__(self, store, run_id: str, cfg: RunConfig, run_dir, *, resumed_from: str | None = None,
                 progress: bool = False, **launch) -> None:
        try:
            total = expected_steps(cfg)
        except Exception:  # noqa: BLE001 - a data set only the nodes read: no total known here
            total = None
        super().__init__(run_id, cfg.to_dict(), Path(run_dir).resolve(), store, total)
        self.cfg, self.resumed_from, self.show_progress, self.launch = cfg, resumed_from, progress, launch

    def _on_messages(self, messages: list[dict]) -> None:
        """A consumer of :func:`~workbench.runtime.live.following`: the new messages received, their
        records stored."""
        self.receive(messages)
        self._store_records()

    def run(self) -> RunResult:
        """Start the ranks, wait for them (in this thread), record the end; the finished run's
        :class:`~workbench.results.RunResult`.

        Raises what the launch raised (:class:`~workbench.runtime.launch.blame.MPILaunchError` naming the
        rank, ...) with the run recorded as failed. Interrupted (SIGINT, SIGTERM, SIGHUP: the launcher has
        stopped the job), the run is recorded as its folder says: with its summary when rank 0 wrote one in
        this run (``cancelled``, or ``finished`` if it ended before the signal took effect), else
        ``cancelled`` with the signal as its error; never left ``running``. The exception goes on with
        ``recorded_status`` set. Store writes are not cut short by a signal."""
        from ..launch.batch import train
        from ..live import ProgressBar
        started = time.time()
        bar = ProgressBar(f"{self.run_id} ({self.cfg.algorithm})") if self.show_progress else None
        try:
            with deferred_signals():
                self._record_start(resumed_from=self.resumed_from)
            try:
                train(self.cfg, self.run_dir, watch=[self._on_messages, *([bar] if bar else [])], **self.launch)
            finally:
                if bar is not None:
                    bar.close()
            result = RunResult.from_run_dir(self.run_dir, self.run_id)
            with deferred_signals():
                self._transition(result.status)
                self._end(result)
            return result
        except KeyboardInterrupt as exc:
            with signals_ignored():  # stopping already: a second signal must not leave the row running
                exc.recorded_status = self._interrupted(started, exc)
            raise
        except BaseException as exc:
            with signals_ignored():
                # the launcher's blame names the rank (the first to end), not the first to report an error
                ranks = getattr(exc, "failed_ranks", None)
                self.failed_rank = ranks[0] if ranks else None
                self._failed(str(exc))
            raise

    def _failed(self, error: str, status: str = "failed") -> None:
        """The run ended without a result: ``status`` with ``error``, in the store too (its records kept)."""
        self._transition(status, error, if_running=True)
        try:
            if self.store is not None:
                self._store_records()
                self.store.fail(self.run_id, error, status=status)
        finally:
            self._done.set()
            for obs in list(self._observers):
                obs.on_finish(self)

    def _interrupted(self, started: float, exc: BaseException) -> str:
        """Record an interrupted run from its folder; returns the status recorded."""
        try:
            # written by this run (a few seconds' slack: rank 0 may write on another host's clock)
            if Path(self.run_dir, "summary.json").stat().st_mtime >= started - 5:
                result = RunResult.from_run_dir(self.run_dir, self.run_id)
                self._transition(result.status, if_running=True)
                self._end(result)
                return result.status
        except (OSError, ValueError, KeyError):  # no summary, or one cut short by the kill
            pass
        self._failed(str(exc) or "interrupted from the keyboard", status="cancelled")
        return "cancelled"
