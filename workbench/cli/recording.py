"""Every run the CLI launches is recorded in the results store, whatever ends it."""
from __future__ import annotations

from .common import signals_ignored


def recorded_train(store, run_id: str, cfg, run_dir, resumed_from: str | None = None, progress: bool = False,
                   **options):
    """``runtime.batch.train`` with the run recorded in ``store``: a ``running`` row before mpiexec
    starts (so a crash leaves a trace), the ranks' metric records as they come
    (:mod:`workbench.runtime.live`), then the finished run, or the failure and its error (the
    records so far kept). ``progress``: a progress bar on stderr while it runs.
    Returns the finished run's :class:`~workbench.results.RunResult`.

    Interrupted (SIGINT, SIGTERM, SIGHUP: ``batch.train`` has stopped the job), the run is recorded
    as its folder says: with its summary when rank 0 wrote one in this run (``cancelled``, or
    ``finished`` if it ended before the signal took effect), else ``cancelled`` with the signal as
    its error; never left ``running``. The exception goes on with ``recorded_status`` set. Store
    writes are not cut short by a signal."""
    import time
    from pathlib import Path

    from ..results import RunResult
    from ..runtime.launch.batch import train
    from ..runtime.launch.signals import deferred_signals
    from ..runtime.live import ProgressBar
    started = time.time()
    bar = ProgressBar(f"{run_id} ({cfg.algorithm})") if progress else None
    watch = [lambda _, records: store.append_metrics(run_id, records), *([bar] if bar else [])]
    try:
        with deferred_signals():
            store.start_run(run_id, cfg.to_dict(), run_dir=str(Path(run_dir).resolve()), resumed_from=resumed_from)
        try:
            train(cfg, run_dir, watch=watch, **options)
        finally:
            if bar is not None:
                bar.close()
        result = RunResult.from_run_dir(run_dir, run_id)
        with deferred_signals():
            store.finish(result)
        return result
    except KeyboardInterrupt as exc:
        with signals_ignored():  # stopping already: a second signal must not leave the row running
            exc.recorded_status = record_interrupted(store, run_id, run_dir, started, exc)
        raise
    except BaseException as exc:
        with signals_ignored():
            store.fail(run_id, str(exc))
        raise


def record_interrupted(store, run_id: str, run_dir, started: float, exc: BaseException) -> str:
    """Record an interrupted run from its folder; returns the status recorded."""
    from pathlib import Path

    from ..results import RunResult
    try:
        # written by this run (a few seconds' slack: rank 0 may write on another host's clock)
        if Path(run_dir, "summary.json").stat().st_mtime >= started - 5:
            result = RunResult.from_run_dir(run_dir, run_id)
            store.finish(result)
            return result.status
    except (OSError, ValueError, KeyError):  # no summary, or one cut short by the kill
        pass
    store.fail(run_id, str(exc) or "interrupted from the keyboard", status="cancelled")
    return "cancelled"
