"""What a finished (or failed, or cancelled) run leaves behind: :class:`RunResult`.

A run directory holds ``config.json``, ``summary.json``, ``metrics.jsonl`` and ``trace.json``
(written by rank 0, see :mod:`workbench.runtime.rank.worker`). The results store
(:mod:`workbench.store`) holds the same things in SQLite; both load into a ``RunResult``, which
is what ``run.wait()`` returns and what the dashboard replays.

``history`` has one row per metric record: ``kind`` (``"train"``: one worker's loss at a step;
``"eval"``: test accuracy/loss of the center or the model at an evaluation point), ``rank``,
``t`` (seconds since the ranks' common start), and ``step``, ``loss``, ``lr`` (the learning rate of
that step, or of a master's arrival at an evaluation: ``RunConfig.lr_schedule``), ``test_accuracy``,
``test_loss``, ``epoch``, ``arrivals``, ``final`` where they apply.
"""
from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from .summary import STATUSES, Summary, status_of  # noqa: F401 - STATUSES re-exported
from .telemetry import chrome_trace

HISTORY_COLUMNS = ["kind", "rank", "step", "t", "loss", "lr", "test_accuracy", "test_loss", "epoch",
                   "arrivals", "final"]


def history_frame(records: list[dict]) -> pd.DataFrame:
    """Metric records (dicts as in ``metrics.jsonl``) as a DataFrame with the standard columns."""
    frame = pd.DataFrame.from_records(records) if records else pd.DataFrame()
    for column in HISTORY_COLUMNS:
        if column not in frame.columns:
            frame[column] = pd.NA
    extra = [c for c in frame.columns if c not in HISTORY_COLUMNS]
    return frame[HISTORY_COLUMNS + extra]


def time_to_accuracy(history: pd.DataFrame, target: float) -> float | None:
    """Seconds from the common start until an evaluation first reached ``target``, or None."""
    if history.empty:
        return None
    evals = history[(history["kind"] == "eval") & (history["final"] != True)]  # noqa: E712 - NA-safe
    reached = evals[evals["test_accuracy"].astype(float) >= target]
    return None if reached.empty else float(reached["t"].min())


def step_seconds(history: pd.DataFrame, skip: int = 0) -> list[float]:
    """Seconds of each step of a lock-step run, from its ``train`` records (``t``: when the step's
    backward ended on that rank): for each pair of consecutive steps that every rank recorded, the
    slowest rank's interval, in step order, leaving out the first ``skip`` (first messages, a peer's
    bucket rebuild). Evaluations after the last step fall outside; one between two steps (rank 0 at
    every ``eval_every``) falls inside: set ``eval_every`` past the run's steps to time steps alone."""
    train = history[history["kind"] == "train"]
    if train.empty:
        return []
    t = train.pivot_table(index="step", columns="rank", values="t", aggfunc="max").dropna().sort_index()
    consecutive = (t.index[1:] - t.index[:-1]) == 1
    return [float(v) for v in t.diff().max(axis=1).iloc[1:][consecutive]][skip:]


class RunObserver:
    """Base class for whoever watches a live run (dask-style: do-nothing hooks).

    A live :class:`~workbench.runtime.client.run.Run` calls the hooks from its receiver thread;
    keep them cheap (the dashboard only marks itself dirty and redraws at <= 2 Hz).
    """

    def on_data(self, run) -> None:
        """New metric records or spans arrived (``run.history`` / ``run.trace`` grew)."""

    def on_finish(self, run) -> None:
        """The run ended: ``run.status`` is ``finished``, ``failed`` or ``cancelled``."""


class LiveSource:
    """What a live run shares (:class:`~workbench.runtime.client.run.Run`,
    :class:`~workbench.runtime.client.watch.WatchedRun`): ``_done`` (a threading.Event set when
    it ends) and ``_observers``, told of data and of the end."""

    _done: threading.Event
    _observers: list[RunObserver]

    def done(self) -> bool:
        """Whether the run has ended (finished, failed or cancelled)."""
        return self._done.is_set()

    def add_observer(self, observer: RunObserver) -> None:
        """Call ``observer.on_data(run)`` when data arrives and ``on_finish(run)`` at the end (at once when
        the run has ended already), from the run's receiver thread.

        Args:
            observer: a :class:`RunObserver` (the dashboard is one); its hooks must be cheap.
        """
        self._observers.append(observer)
        if self.done():
            observer.on_finish(self)


@dataclass
class RunResult:
    """One run: its configuration, summary, per-step history and Chrome-trace spans.

    Attributes:
        run_id: the run's identifier, unique in its store (its directory's name unless the
            store already holds a run of that name: see ``runtime.rundir.run_id_for``).
        config: the :class:`~workbench.config.RunConfig` as a dict.
        summary: ``summary.json``, a dict with the keys of :class:`~workbench.summary.Summary`
            (None when the run failed before finishing).
        history: metrics as a DataFrame, one row per metric record: ``kind`` (``"train"``: one worker's
            loss at a step; ``"eval"``: test accuracy/loss of the center or the model at an evaluation
            point), ``rank``, ``t`` (seconds since the ranks' common start), and ``step``, ``loss``, ``lr``
            (of that step, or of a master's arrival at an evaluation), ``test_accuracy``, ``test_loss``,
            ``epoch``, ``arrivals``, ``final`` where they apply.
        trace: Chrome trace events (``ph == "X"`` spans, ``ts``/``dur`` in microseconds).
        status: one of ``running``, ``finished``, ``failed``, ``cancelled``.
        error: the failure (rank and traceback) for failed runs.
        run_dir: where the run's files are, if anywhere.
        resumed_from: the run this one continues from a checkpoint (its run id, or its
            directory when that run is not in the store), else None.
    """

    run_id: str
    config: dict[str, Any]
    summary: Summary | None = None
    history: pd.DataFrame = field(default_factory=lambda: history_frame([]))
    trace: list[dict] = field(default_factory=list)
    status: str = "finished"
    error: str | None = None
    run_dir: str | None = None
    resumed_from: str | None = None

    @classmethod
    def from_run_dir(cls, run_dir: str | os.PathLike, run_id: str | None = None) -> "RunResult":
        """Load a run directory written by the batch runner or a cluster run.

        Args:
            run_dir: the folder: ``config.json``, and ``summary.json``, ``metrics.jsonl`` and ``trace.json``
                where the run wrote them (a missing one leaves its part empty).
            run_id: the id to give it (default: the folder's name).

        Returns:
            (RunResult): The run; its status from the summary (``failed`` without one).

        Raises:
            FileNotFoundError: the folder has no ``config.json``.
            json.JSONDecodeError: one of its JSON files is not JSON (a ValueError).
        """
        run_dir = Path(run_dir)
        config = json.loads((run_dir / "config.json").read_text())
        summary_path = run_dir / "summary.json"
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
        metrics_path = run_dir / "metrics.jsonl"
        records = [json.loads(line) for line in metrics_path.read_text().splitlines()
                   if line.strip()] if metrics_path.exists() else []
        trace_path = run_dir / "trace.json"
        trace = [e for e in json.loads(trace_path.read_text())["traceEvents"] if e.get("ph") == "X"] \
            if trace_path.exists() else []
        return cls(run_id=run_id or run_dir.name, config=config, summary=summary,
                   history=history_frame(records), trace=trace, status=status_of(summary), run_dir=str(run_dir))

    @property
    def ranks(self) -> int:
        """The ranks the run was configured with (``config["ranks"]``), the master included."""
        return int(self.config["ranks"])

    @property
    def total_steps(self) -> int | None:
        """Training steps summed over the workers (the progress bar's 100%): the summary's
        ``steps``, None without a summary."""
        return None if self.summary is None else self.summary.get("steps")

    def done(self) -> bool:
        """Whether the run has ended: any status but ``running``."""
        return self.status != "running"

    def time_to_accuracy(self, target: float) -> float | None:
        """Seconds from the ranks' common start until an evaluation during training first reached ``target``
        test accuracy (the final evaluation not counted), or None if none did.

        Args:
            target: the test accuracy, a fraction in [0, 1].
        """
        return time_to_accuracy(self.history, target)

    def chrome_trace(self) -> dict:
        """The spans as a Chrome trace, ``{"traceEvents": [...]}``, with one named row group per rank (the
        master's named as such); times in microseconds."""
        from .optim.registry import known_definition
        spec = known_definition(self.config.get("algorithm"))
        return chrome_trace(self.trace, sorted({e["pid"] for e in self.trace}),
                            master=0 if spec is not None and spec.master_based else None)

    def save_trace(self, path: str | os.PathLike) -> Path:
        """Write the spans as Chrome-trace JSON (:meth:`chrome_trace`; opens in Perfetto), creating the
        folder, and return the path.

        Args:
            path: the file to write (replaced if it exists).
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.chrome_trace()))
        return path

    def __repr__(self) -> str:
        acc = (self.summary or {}).get("final_test_accuracy")
        acc_text = f", final_test_accuracy={acc:.3f}" if acc is not None else ""
        return (f"RunResult({self.run_id!r}, {self.config.get('algorithm')}, ranks={self.config.get('ranks')}, "
                f"status={self.status}{acc_text})")
