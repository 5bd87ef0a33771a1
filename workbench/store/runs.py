"""Runs in the store: recording a run as it starts, lives, fails or finishes; loading it back
as a :class:`~workbench.results.RunResult`; listing runs as a DataFrame (:meth:`Runs.runs`)."""
from __future__ import annotations

import dataclasses
import json
import os
import time
from datetime import datetime
from pathlib import Path

import pandas as pd

from ..config import RunConfig
from ..results import RunResult, history_frame
from ..summary import STATUSES, STORE_COLUMNS
from .database import Database, unknown_run
from .encoding import METRIC_ROW, dumps, history_records, loads, metric_rows, plain

#: Figures taken from a run's summary into :meth:`Runs.runs` (:data:`workbench.summary.STORE_COLUMNS`).
SUMMARY_COLUMNS = list(STORE_COLUMNS)
#: The columns of :meth:`Runs.runs` before the flattened config fields.
RUN_COLUMNS = ["run_id", "created", "status", "algorithm", "ranks", *SUMMARY_COLUMNS, "time_to_target",
               "error", "sweep_id", "sweep_key", "run_dir", "resumed_from"]
_INT_COLUMNS = ("ranks", *(name for name, kind in STORE_COLUMNS.items() if kind is int))
_FLOAT_COLUMNS = (*(name for name, kind in STORE_COLUMNS.items() if kind is float), "time_to_target")
_DONE = ("finished", "cancelled")  # rows that hold a run's outcome: never overwritten


class Runs(Database):
    """The ``runs``, ``metrics`` and ``traces`` tables (the store's run methods)."""

    # -- writing runs ----------------------------------------------------------------------
    def start_run(self, run_id: str, config: dict, run_dir: str | os.PathLike | None = None,
                  sweep_id: str | None = None, sweep_key: str | None = None,
                  resumed_from: str | None = None) -> None:
        """Record a run as ``running`` before it starts, so a crash still leaves its row.

        Starting an id whose row is ``running`` or ``failed`` (a retry under the same id) resets
        its status and error and keeps its creation time, metrics and link.

        Args:
            run_id: the run's id.
            config: the run's :class:`~workbench.config.RunConfig` as a dict.
            run_dir: the run's folder, if it has one.
            sweep_id: the sweep the run belongs to, if any.
            sweep_key: the run's point in that sweep.
            resumed_from: the run (id, or directory) this one continues from a checkpoint.

        Raises:
            ValueError: the id's run finished or was cancelled: that row is never overwritten (pick a new
                id: :func:`workbench.runtime.rundir.run_id_for`).
        """
        values = (time.time(), config.get("algorithm"), plain(config.get("ranks")), dumps(config),
                  None if run_dir is None else os.fspath(run_dir), sweep_id, sweep_key, resumed_from, run_id)
        with self._write() as conn:
            row = self._row(conn, run_id, "status")
            if row is None:
                conn.execute("INSERT INTO runs (created, status, algorithm, ranks, config, run_dir, sweep_id, "
                             "sweep_key, resumed_from, run_id) VALUES (?, 'running', ?, ?, ?, ?, ?, ?, ?, ?)", values)
            elif row[0] in _DONE:
                raise ValueError(f"run {run_id!r} is already {row[0]} in the store {self.path}; its row is kept: "
                                 f"start the new run under another id")
            else:
                conn.execute("UPDATE runs SET status = 'running', summary = NULL, error = NULL, algorithm = ?, "
                             "ranks = ?, config = ?, run_dir = COALESCE(?, run_dir), sweep_id = COALESCE(?, "
                             "sweep_id), sweep_key = COALESCE(?, sweep_key), resumed_from = COALESCE(?, "
                             "resumed_from) WHERE run_id = ?", values[1:])

    def append_metrics(self, run_id: str, records: list[dict]) -> None:
        """Append live metric records to a stored run, after those it has.

        Args:
            run_id: the run's id.
            records: dicts as in ``metrics.jsonl`` (nothing to do when empty).

        Raises:
            KeyError: the store holds no run ``run_id`` (the message says how to list those it does).
        """
        if not records:
            return
        with self._write() as conn:
            if self._row(conn, run_id) is None:
                raise unknown_run(run_id, self.path)
            start = conn.execute("SELECT COALESCE(MAX(seq) + 1, 0) FROM metrics WHERE run_id = ?",
                                 (run_id,)).fetchone()[0]
            conn.executemany(METRIC_ROW, metric_rows(run_id, start, records))

    def add(self, result: RunResult, sweep_id: str | None = None, sweep_key: str | None = None) -> str:
        """Insert or replace a whole run (row, metrics, trace) in one transaction; return its id.

        A run already stored keeps its creation time, and its sweep id/key unless new ones are
        given. A new row's creation time is its ``config.json``'s time when ``run_dir`` has one.

        Args:
            result: the run.
            sweep_id: the sweep the run belongs to (None: the stored one's, if any).
            sweep_key: the run's point in that sweep (None: the stored one's, if any).

        Raises:
            ValueError: ``result.status`` is not a run status (``running``, ``finished``, ``failed``,
                ``cancelled``).
        """
        return self._put(result, sweep_id, sweep_key, keep_live_data=False)

    def finish(self, result: RunResult) -> str:
        """Store a run's final state, keeping its row's sweep id/key and creation time, and the
        live metrics and trace already stored when ``result`` has none (a run that died early).

        Args:
            result: the ended run.

        Returns:
            The run's id.

        Raises:
            ValueError: ``result.status`` is not a run status.
        """
        return self._put(result, None, None, keep_live_data=True)

    def _put(self, result: RunResult, sweep_id: str | None, sweep_key: str | None, keep_live_data: bool) -> str:
        if result.status not in STATUSES:
            raise ValueError(f"status must be one of {', '.join(STATUSES)}; got {result.status!r}")
        records = history_records(result.history)
        resumed_from = getattr(result, "resumed_from", None)
        config_file = Path(result.run_dir, "config.json") if result.run_dir else None
        created = config_file.stat().st_mtime if config_file and config_file.exists() else time.time()
        with self._write() as conn:
            old = self._row(conn, result.run_id, "created, sweep_id, sweep_key, resumed_from")
            if old is not None:
                created, sweep_id, sweep_key = old[0], sweep_id or old[1], sweep_key or old[2]
                resumed_from = resumed_from or old[3]
            conn.execute("INSERT INTO runs (run_id, created, status, algorithm, ranks, config, summary, error, "
                         "run_dir, sweep_id, sweep_key, resumed_from) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                         "ON CONFLICT (run_id) DO UPDATE SET created = excluded.created, status = excluded.status, "
                         "algorithm = excluded.algorithm, ranks = excluded.ranks, config = excluded.config, "
                         "summary = excluded.summary, error = excluded.error, run_dir = excluded.run_dir, "
                         "sweep_id = excluded.sweep_id, sweep_key = excluded.sweep_key, "
                         "resumed_from = excluded.resumed_from",
                         (result.run_id, created, result.status, result.config.get("algorithm"),
                          plain(result.config.get("ranks")), dumps(result.config), dumps(result.summary),
                          result.error, result.run_dir, sweep_id, sweep_key, resumed_from))
            if records or not keep_live_data:
                conn.execute("DELETE FROM metrics WHERE run_id = ?", (result.run_id,))
                conn.executemany(METRIC_ROW, metric_rows(result.run_id, 0, records))
            if result.trace or not keep_live_data:
                conn.execute("INSERT OR REPLACE INTO traces (run_id, events) VALUES (?, ?)",
                             (result.run_id, dumps(list(result.trace))))
        return result.run_id

    def add_run_dir(self, run_dir: str | os.PathLike, run_id: str | None = None, **kw) -> str:
        """Store a run directory written by ``workbench train`` or a cluster run (``kw``: as :meth:`add`).

        Args:
            run_dir: the run's folder (:meth:`RunResult.from_run_dir <workbench.results.RunResult.from_run_dir>`).
            run_id: the id to store it under (default: the folder's name).
            **kw (str | None): ``sweep_id`` and ``sweep_key``, as :meth:`add` takes them.

        Returns:
            The run's id.

        Raises:
            FileNotFoundError: the folder has no ``config.json``.
        """
        return self.add(RunResult.from_run_dir(run_dir, run_id), **kw)

    def fail(self, run_id: str, error: str, status: str = "failed") -> None:
        """Mark a stored run ``failed`` (or ``cancelled``) with its error; all else stays.

        Args:
            run_id: the run's id.
            error: why it failed (a traceback, a message).
            status: ``"failed"`` or ``"cancelled"``.

        Raises:
            ValueError: another ``status``, or the run already finished (its row is kept).
            KeyError: the store holds no run ``run_id``.
        """
        if status not in ("failed", "cancelled"):
            raise ValueError(f"status must be 'failed' or 'cancelled'; got {status!r}")
        with self._write() as conn:
            row = self._row(conn, run_id, "status")
            if row is None:
                raise unknown_run(run_id, self.path)
            if row[0] == "finished":
                raise ValueError(f"run {run_id!r} already finished in the store {self.path}; its row is kept "
                                 f"(not marked {status})")
            conn.execute("UPDATE runs SET status = ?, error = ? WHERE run_id = ?", (status, error, run_id))

    def __contains__(self, run_id: object) -> bool:
        """``run_id in store``: whether a run of that id is stored."""
        if not isinstance(run_id, str):
            return False
        with self._read() as conn:
            return self._row(conn, run_id) is not None

    def run_id_of(self, run_dir: str | os.PathLike) -> str | None:
        """The id of the newest stored run whose directory is ``run_dir`` (resolved), or None.

        Args:
            run_dir: a run's folder.
        """
        with self._read() as conn:
            row = conn.execute("SELECT run_id FROM runs WHERE run_dir = ? ORDER BY created DESC LIMIT 1",
                               (str(Path(run_dir).resolve()),)).fetchone()
        return None if row is None else row[0]

    def delete(self, run_id: str) -> None:
        """Remove a run with its metrics and trace (not its run directory).

        Args:
            run_id: the run's id.

        Raises:
            KeyError: the store holds no run ``run_id``.
        """
        with self._write() as conn:
            if conn.execute("DELETE FROM runs WHERE run_id = ?", (run_id,)).rowcount == 0:
                raise unknown_run(run_id, self.path)

    # -- reading runs ----------------------------------------------------------------------
    def follow(self, run_id: str, after: int) -> tuple[str, str | None, list[dict], int, dict | None]:
        """A look at a run as it goes (one snapshot of the file).

        Args:
            run_id: the run's id.
            after: the sequence number of the last record already seen (-1: none; the first look).

        Returns:
            ``(status, error, records, last, config)``: the run's status and error, the metric records stored
                after ``after``, the newest record's sequence number (``after`` when none is new), and its
                config as a dict on the first look (``after`` -1; None on the later ones, which a watch
                takes every second).

        Raises:
            KeyError: the store holds no run ``run_id`` (the message names the store).
        """
        with self._read() as conn:
            conn.execute("BEGIN")
            row = self._row(conn, run_id, "status, error, config" if after < 0 else "status, error, NULL")
            if row is None:
                raise unknown_run(run_id, self.path)
            rows = conn.execute("SELECT seq, record FROM metrics WHERE run_id = ? AND seq > ? ORDER BY seq",
                                (run_id, after)).fetchall()
        config = json.loads(row[2]) if row[2] is not None else None
        return row[0], row[1], [json.loads(r) for _, r in rows], rows[-1][0] if rows else after, config

    def progress(self, run_ids: list[str]) -> dict[str, dict]:
        """How far each of ``run_ids`` got by its stored metric records (a running run's live ones).

        Args:
            run_ids: the runs' ids.

        Returns:
            run id -> ``{"steps": the most training steps one rank recorded, "test_accuracy": the newest
                evaluation's (None without one)}``; a run without training records is left out.
        """
        marks = ", ".join("?" * len(run_ids))
        with self._read() as conn:
            conn.execute("BEGIN")
            steps = conn.execute(f"SELECT run_id, MAX(step) + 1 FROM metrics WHERE kind = 'train' AND run_id IN ({marks}) "
                                 "GROUP BY run_id", run_ids).fetchall()
            accuracy = dict(conn.execute(
                f"SELECT run_id, json_extract(record, '$.test_accuracy') FROM metrics AS m WHERE kind = 'eval' AND "
                f"run_id IN ({marks}) AND seq = (SELECT MAX(seq) FROM metrics WHERE run_id = m.run_id AND "
                "kind = 'eval')", run_ids).fetchall())
        return {run_id: {"steps": n, "test_accuracy": accuracy.get(run_id)} for run_id, n in steps}

    def load(self, run_id: str) -> RunResult:
        """The stored run as a :class:`RunResult` (one snapshot: row, metrics and trace).

        Args:
            run_id: the run's id.

        Raises:
            KeyError: the store holds no run ``run_id`` (the message names the id and says how to list
                the runs).
        """
        with self._read() as conn:
            conn.execute("BEGIN")  # one snapshot for the three reads
            row = self._row(conn, run_id, "config, summary, status, error, run_dir, resumed_from")
            if row is None:
                raise unknown_run(run_id, self.path)
            metrics = conn.execute("SELECT record FROM metrics WHERE run_id = ? ORDER BY seq", (run_id,)).fetchall()
            trace = conn.execute("SELECT events FROM traces WHERE run_id = ?", (run_id,)).fetchone()
        config, summary, status, error, run_dir, resumed_from = row
        return RunResult(run_id=run_id, config=json.loads(config), summary=loads(summary),
                         history=history_frame([json.loads(m) for (m,) in metrics]),
                         trace=json.loads(trace[0]) if trace else [], status=status, error=error, run_dir=run_dir,
                         resumed_from=resumed_from)

    def runs(self, algorithm: str | None = None, status: str | None = None, sweep_id: str | None = None,
             target_accuracy: float | None = None) -> pd.DataFrame:
        """One row per run, newest first (see :data:`RUN_COLUMNS`), then the config's fields.

        ``created`` is a local-time Timestamp; ``wall_seconds`` and ``time_to_target`` are
        seconds, ``bytes_sent`` bytes, ``comm_fraction`` a share of wall time in [0, 1].
        Config fields keep their names (``lr``, ``tau``, ...) unless they collide with a column
        above (``cfg_algorithm``, ``cfg_ranks``); a dict field ``extra`` gives ``extra_<key>``.
        ``time_to_target`` is NaN unless ``target_accuracy`` is given: then it is the seconds
        until an evaluation first reached it (NaN if none did).

        Args:
            algorithm: only the runs of this algorithm (None: all).
            status: only the runs with this status (``running``, ``finished``, ``failed``, ``cancelled``).
            sweep_id: only the runs of this sweep.
            target_accuracy: test accuracy (a fraction in [0, 1]) for ``time_to_target``; evaluations
                during training only, the final one not counted.
        """
        where, args = [], []
        for column, value in (("algorithm", algorithm), ("status", status), ("sweep_id", sweep_id)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        condition = " WHERE " + " AND ".join(where) if where else ""
        with self._read() as conn:
            conn.execute("BEGIN")
            rows = conn.execute("SELECT run_id, created, status, algorithm, ranks, summary, error, sweep_id, "
                                f"sweep_key, run_dir, resumed_from, config FROM runs{condition} ORDER BY created DESC, run_id DESC",
                                args).fetchall()
            reached = {} if target_accuracy is None else dict(conn.execute(
                "SELECT run_id, MIN(t) FROM metrics WHERE kind = 'eval' AND "
                "json_extract(record, '$.test_accuracy') >= ? AND COALESCE(json_extract(record, '$.final'), 0) = 0 "
                f"AND run_id IN (SELECT run_id FROM runs{condition}) GROUP BY run_id",
                [target_accuracy, *args]).fetchall())
        config_columns = {_config_column(f.name): None for f in dataclasses.fields(RunConfig) if f.name != "extra"}
        records = []
        for run_id, created, st, algo, ranks, summary, error, sid, key, run_dir, resumed, config in rows:
            summary = loads(summary) or {}
            record = {"run_id": run_id, "created": datetime.fromtimestamp(created), "status": st,
                      "algorithm": algo, "ranks": ranks, **{k: summary.get(k) for k in SUMMARY_COLUMNS},
                      "time_to_target": reached.get(run_id), "error": error, "sweep_id": sid, "sweep_key": key,
                      "run_dir": run_dir, "resumed_from": resumed}
            config = json.loads(config)
            for name, value in _flatten(config).items():
                record[_config_column(name)] = value
                config_columns.setdefault(_config_column(name))
            record.update(_hyper_columns(config))
            records.append(record)
        frame = pd.DataFrame.from_records(records, columns=RUN_COLUMNS + list(config_columns))
        frame["created"] = pd.to_datetime(frame["created"])
        for column in _INT_COLUMNS:
            frame[column] = pd.to_numeric(frame[column]).astype("Int64")
        for column in _FLOAT_COLUMNS:
            frame[column] = frame[column].astype("float64")
        return frame


def _hyper_columns(config: dict) -> dict[str, float]:
    """lr, momentum and rho as the run used them (the config keeps None for the algorithm's defaults)."""
    from ..config import hyper_of
    try:
        return {_config_column(k): v for k, v in hyper_of(config)._asdict().items()}
    except (KeyError, TypeError, ZeroDivisionError):  # a config of another version, or no algorithm
        return {}


def _config_column(name: str) -> str:
    return f"cfg_{name}" if name in RUN_COLUMNS else name


def _flatten(config: dict) -> dict:
    """Config fields as columns; a dict field (``extra``) becomes ``<field>_<key>`` columns."""
    flat = {}
    for name, value in config.items():
        if isinstance(value, dict):
            flat.update({f"{name}_{key}": inner for key, inner in value.items()})
        else:
            flat[name] = value
    return flat
