"""The results store: every run (config, summary, per-step metrics, trace) and every sweep, in
one SQLite file: the ``path`` argument, else ``$WORKBENCH_STORE``, else ``data/workbench.sqlite``
under the current directory.

Schema (``PRAGMA user_version`` = :data:`SCHEMA_VERSION`; a later version migrates from it)::

    runs     run_id PK, created (unix seconds), status (running/finished/failed/cancelled),
             algorithm, ranks, config JSON, summary JSON|NULL, error|NULL, run_dir|NULL,
             sweep_id|NULL, sweep_key|NULL, resumed_from|NULL (version 2: the run a resumed run
             continues)                                             index (sweep_id, sweep_key)
    metrics  (run_id -> runs ON DELETE CASCADE, seq) PK, kind, rank, step, t (seconds),
             record JSON                                            one row per metric record
    traces   run_id PK -> runs ON DELETE CASCADE, events JSON       Chrome-trace spans (us)
    sweeps   sweep_id PK, name, created (unix seconds), base_config JSON, grid JSON, seeds JSON

Why this shape:

- WAL journal mode: a reader (the dashboard, a second notebook, ``workbench runs``) never blocks
  the writer (a run's receiver thread appending metrics every second) and the writer never
  blocks readers.
- ``busy_timeout`` and ``BEGIN IMMEDIATE``: concurrent writers (CLI processes, kernel threads)
  queue for the write lock instead of failing with "database is locked"; taking the lock at the
  start of the transaction avoids the read-then-upgrade deadlock that a deferred one can hit.
- A connection per operation: sqlite3 connections must not be shared between threads, and
  opening one costs well under a millisecond next to a training step.
- JSON text for everything structured, never pickle: the file is readable from any language
  and loading it cannot execute code. ``kind``/``rank``/``step``/``t`` are also plain columns
  so SQL can filter metrics (time to accuracy) without parsing every record.
- ``sweep_id`` is not a foreign key: a run may name a sweep registered in another store file.
- A finished (or cancelled) run's row is never overwritten by :meth:`Store.start_run` or
  :meth:`Store.fail`: a resumed run is a new run whose ``resumed_from`` names the old one.
  (:meth:`Store.add` still replaces a whole run on purpose: importing a run directory again.)
- A new store file is created ``0600`` (SQLite gives its ``-wal``/``-shm`` files the same mode)
  unless ``WORKBENCH_SHARED=1`` (:func:`workbench.config.shared_files`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import sqlite3
import time
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

import pandas as pd

from .config import RunConfig, shared_files
from .results import STATUSES, RunResult, history_frame

SCHEMA_VERSION = 2
BUSY_TIMEOUT_SECONDS = 60.0  # how long a writer waits for another's transaction to end

_SCHEMA = [
    f"""CREATE TABLE IF NOT EXISTS runs (
        run_id TEXT PRIMARY KEY, created REAL NOT NULL,
        status TEXT NOT NULL CHECK (status IN ({", ".join(repr(s) for s in STATUSES)})),
        algorithm TEXT, ranks INTEGER, config TEXT NOT NULL, summary TEXT, error TEXT,
        run_dir TEXT, sweep_id TEXT, sweep_key TEXT, resumed_from TEXT)""",
    "CREATE INDEX IF NOT EXISTS runs_by_sweep ON runs (sweep_id, sweep_key)",
    """CREATE TABLE IF NOT EXISTS metrics (
        run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE, seq INTEGER NOT NULL,
        kind TEXT, rank INTEGER, step INTEGER, t REAL, record TEXT NOT NULL,
        PRIMARY KEY (run_id, seq))""",  # the primary key is the index by run_id
    """CREATE TABLE IF NOT EXISTS traces (
        run_id TEXT PRIMARY KEY REFERENCES runs (run_id) ON DELETE CASCADE, events TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS sweeps (
        sweep_id TEXT PRIMARY KEY, name TEXT NOT NULL, created REAL NOT NULL,
        base_config TEXT NOT NULL, grid TEXT NOT NULL, seeds TEXT NOT NULL)""",
]

#: Figures taken from a run's summary into :meth:`Store.runs`.
SUMMARY_COLUMNS = ["final_test_accuracy", "final_loss", "wall_seconds", "comm_fraction", "steps",
                   "bytes_sent"]
#: The columns of :meth:`Store.runs` before the flattened config fields.
RUN_COLUMNS = ["run_id", "created", "status", "algorithm", "ranks", *SUMMARY_COLUMNS, "time_to_target",
               "error", "sweep_id", "sweep_key", "run_dir", "resumed_from"]
_INT_COLUMNS = ("ranks", "steps", "bytes_sent")
_FLOAT_COLUMNS = ("final_test_accuracy", "final_loss", "wall_seconds", "comm_fraction", "time_to_target")
#: Statements that bring a file of version ``v`` (the key) to ``v + 1``.
_MIGRATIONS = {1: ["ALTER TABLE runs ADD COLUMN resumed_from TEXT"]}
_DONE = ("finished", "cancelled")  # rows that hold a run's outcome: never overwritten
_METRIC_ROW = "INSERT INTO metrics (run_id, seq, kind, rank, step, t, record) VALUES (?, ?, ?, ?, ?, ?, ?)"


def default_path() -> Path:
    """``$WORKBENCH_STORE`` or ``data/workbench.sqlite`` under the current directory."""
    return Path(os.environ.get("WORKBENCH_STORE") or "data/workbench.sqlite")


def _plain(value: Any) -> Any:
    """numpy scalars and arrays as Python values (what json can write)."""
    if hasattr(value, "tolist") and type(value).__module__ == "numpy":
        return value.tolist()
    return value


def _missing(value: Any) -> bool:
    return value is None or value is pd.NA or value is pd.NaT or (isinstance(value, float) and math.isnan(value))


def _json_default(value: Any) -> Any:
    if type(value).__module__ == "numpy":
        return _plain(value)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"the results store keeps JSON only; {type(value).__name__} {value!r} is not JSON")


def _dumps(value: Any) -> str | None:
    return None if value is None else json.dumps(value, default=_json_default)


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _history_records(history: pd.DataFrame) -> list[dict]:
    """A history DataFrame back to metric records (the missing fields left out, as in metrics.jsonl)."""
    return [{key: value for key, value in ((k, _plain(v)) for k, v in row.items()) if not _missing(value)}
            for row in history.to_dict("records")]


def _metric_rows(run_id: str, start: int, records: list[dict]) -> list[tuple]:
    return [(run_id, start + i, r.get("kind"), _plain(r.get("rank")), _plain(r.get("step")), _plain(r.get("t")),
             _dumps(r)) for i, r in enumerate(records)]


def _unknown(run_id: str, path: Path) -> KeyError:
    return KeyError(f"run {run_id!r} is not in the store {path}; list the runs with "
                    f"Store({str(path)!r}).runs() or `workbench runs --store {path}`")


class Store:
    """A SQLite results store, safe to use from several threads and processes at once.

    ``Store().runs()`` lists runs as a DataFrame; ``load(run_id)`` gives a
    :class:`~workbench.results.RunResult`; sweeps find their finished points with
    :meth:`finished_keys`. See the module docstring for the schema.
    """

    def __init__(self, path: str | os.PathLike | None = None) -> None:
        self.path = Path(path) if path is not None else default_path()
        if self.path.is_dir():
            raise IsADirectoryError(f"results store: {self.path} is a directory; give a file path")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not shared_files() and not self.path.exists():  # created owner-only before sqlite opens it
            os.close(os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600))
        with self._read() as conn:  # persistent in the file; only its first opener changes it
            if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                conn.execute("PRAGMA journal_mode = WAL")
        with self._write() as conn:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise RuntimeError(f"results store {self.path} has schema version {version}; this "
                                   f"workbench reads up to {SCHEMA_VERSION}: upgrade workbench")
            if version == 0:  # a new file
                for statement in _SCHEMA:
                    conn.execute(statement)
            elif version < SCHEMA_VERSION:  # an older file: migrate step by step, in this transaction
                for step in range(version, SCHEMA_VERSION):
                    for statement in _MIGRATIONS[step]:
                        conn.execute(statement)
            if version < SCHEMA_VERSION:
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    # -- connections -----------------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        # timeout= is sqlite's busy_timeout; isolation_level=None: transactions are explicit
        conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_SECONDS, isolation_level=None)
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("PRAGMA synchronous = NORMAL")  # durable at checkpoints; safe with WAL
        return conn

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        conn = self._connect()
        try:
            yield conn
        finally:
            conn.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One transaction holding the write lock from its start; rolled back on any error."""
        conn = self._connect()
        try:
            conn.execute("BEGIN IMMEDIATE")
            with conn:  # commit on success, roll back on an exception
                yield conn
        finally:
            conn.close()

    @staticmethod
    def _row(conn: sqlite3.Connection, run_id: str, columns: str = "run_id") -> tuple | None:
        return conn.execute(f"SELECT {columns} FROM runs WHERE run_id = ?", (run_id,)).fetchone()

    # -- writing runs ----------------------------------------------------------------------
    def start_run(self, run_id: str, config: dict, run_dir: str | os.PathLike | None = None,
                  sweep_id: str | None = None, sweep_key: str | None = None,
                  resumed_from: str | None = None) -> None:
        """Record a run as ``running`` before it starts, so a crash still leaves its row.

        ``resumed_from``: the run (id, or directory) this one continues from a checkpoint.
        Starting an id whose row is ``running`` or ``failed`` (a retry under the same id) resets
        its status and error and keeps its creation time, metrics and link. Starting an id whose
        run finished or was cancelled raises ValueError: that row is never overwritten (pick a
        new id: :func:`workbench.runtime.batch.run_id_for`).
        """
        values = (time.time(), config.get("algorithm"), _plain(config.get("ranks")), _dumps(config),
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
        """Append live metric records (dicts as in ``metrics.jsonl``) to a stored run."""
        if not records:
            return
        with self._write() as conn:
            if self._row(conn, run_id) is None:
                raise _unknown(run_id, self.path)
            start = conn.execute("SELECT COALESCE(MAX(seq) + 1, 0) FROM metrics WHERE run_id = ?",
                                 (run_id,)).fetchone()[0]
            conn.executemany(_METRIC_ROW, _metric_rows(run_id, start, records))

    def add(self, result: RunResult, sweep_id: str | None = None, sweep_key: str | None = None) -> str:
        """Insert or replace a whole run (row, metrics, trace) in one transaction; return its id.

        A run already stored keeps its creation time, and its sweep id/key unless new ones are
        given. A new row's creation time is its ``config.json``'s time when ``run_dir`` has one.
        """
        return self._put(result, sweep_id, sweep_key, keep_live_data=False)

    def finish(self, result: RunResult) -> str:
        """Store a run's final state, keeping its row's sweep id/key and creation time, and the
        live metrics and trace already stored when ``result`` has none (a run that died early)."""
        return self._put(result, None, None, keep_live_data=True)

    def _put(self, result: RunResult, sweep_id: str | None, sweep_key: str | None, keep_live_data: bool) -> str:
        if result.status not in STATUSES:
            raise ValueError(f"status must be one of {', '.join(STATUSES)}; got {result.status!r}")
        records = _history_records(result.history)
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
                          _plain(result.config.get("ranks")), _dumps(result.config), _dumps(result.summary),
                          result.error, result.run_dir, sweep_id, sweep_key, resumed_from))
            if records or not keep_live_data:
                conn.execute("DELETE FROM metrics WHERE run_id = ?", (result.run_id,))
                conn.executemany(_METRIC_ROW, _metric_rows(result.run_id, 0, records))
            if result.trace or not keep_live_data:
                conn.execute("INSERT OR REPLACE INTO traces (run_id, events) VALUES (?, ?)",
                             (result.run_id, _dumps(list(result.trace))))
        return result.run_id

    def add_run_dir(self, run_dir: str | os.PathLike, run_id: str | None = None, **kw) -> str:
        """Store a run directory written by ``workbench train`` or a cluster run (``kw``: as :meth:`add`)."""
        return self.add(RunResult.from_run_dir(run_dir, run_id), **kw)

    def fail(self, run_id: str, error: str, status: str = "failed") -> None:
        """Mark a stored run ``failed`` (or ``cancelled``) with its error; all else stays.
        A run that already finished keeps its row: ValueError."""
        if status not in ("failed", "cancelled"):
            raise ValueError(f"status must be 'failed' or 'cancelled'; got {status!r}")
        with self._write() as conn:
            row = self._row(conn, run_id, "status")
            if row is None:
                raise _unknown(run_id, self.path)
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
        """The id of the newest stored run whose directory is ``run_dir`` (resolved), or None."""
        with self._read() as conn:
            row = conn.execute("SELECT run_id FROM runs WHERE run_dir = ? ORDER BY created DESC LIMIT 1",
                               (str(Path(run_dir).resolve()),)).fetchone()
        return None if row is None else row[0]

    def delete(self, run_id: str) -> None:
        """Remove a run with its metrics and trace (not its run directory)."""
        with self._write() as conn:
            if conn.execute("DELETE FROM runs WHERE run_id = ?", (run_id,)).rowcount == 0:
                raise _unknown(run_id, self.path)

    # -- reading runs ----------------------------------------------------------------------
    def load(self, run_id: str) -> RunResult:
        """The stored run as a :class:`RunResult`; ``KeyError`` naming the id if there is none."""
        with self._read() as conn:
            conn.execute("BEGIN")  # one snapshot for the three reads
            row = self._row(conn, run_id, "config, summary, status, error, run_dir, resumed_from")
            if row is None:
                raise _unknown(run_id, self.path)
            metrics = conn.execute("SELECT record FROM metrics WHERE run_id = ? ORDER BY seq", (run_id,)).fetchall()
            trace = conn.execute("SELECT events FROM traces WHERE run_id = ?", (run_id,)).fetchone()
        config, summary, status, error, run_dir, resumed_from = row
        return RunResult(run_id=run_id, config=json.loads(config), summary=_loads(summary),
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
            summary = _loads(summary) or {}
            record = {"run_id": run_id, "created": datetime.fromtimestamp(created), "status": st,
                      "algorithm": algo, "ranks": ranks, **{k: summary.get(k) for k in SUMMARY_COLUMNS},
                      "time_to_target": reached.get(run_id), "error": error, "sweep_id": sid, "sweep_key": key,
                      "run_dir": run_dir, "resumed_from": resumed}
            for name, value in _flatten(json.loads(config)).items():
                record[_config_column(name)] = value
                config_columns.setdefault(_config_column(name))
            records.append(record)
        frame = pd.DataFrame.from_records(records, columns=RUN_COLUMNS + list(config_columns))
        frame["created"] = pd.to_datetime(frame["created"])
        for column in _INT_COLUMNS:
            frame[column] = pd.to_numeric(frame[column]).astype("Int64")
        for column in _FLOAT_COLUMNS:
            frame[column] = frame[column].astype("float64")
        return frame

    # -- sweeps ----------------------------------------------------------------------------
    def create_sweep(self, name: str, base_config: dict, grid: dict, seeds: list) -> str:
        """Register a sweep and return its id, ``sweep-<12 hex>``: a hash of the definition, so
        the same (name, base_config, grid, seeds) always gives the same id and a sweep re-run
        after a kernel restart finds its finished points."""
        definition = {"name": name, "base_config": base_config, "grid": grid, "seeds": list(seeds)}
        canonical = json.dumps(definition, sort_keys=True, separators=(",", ":"), default=_json_default)
        sweep_id = "sweep-" + hashlib.sha1(canonical.encode()).hexdigest()[:12]
        with self._write() as conn:
            conn.execute("INSERT OR IGNORE INTO sweeps (sweep_id, name, created, base_config, grid, seeds) "
                         "VALUES (?, ?, ?, ?, ?, ?)", (sweep_id, name, time.time(), _dumps(base_config),
                                                       _dumps(grid), _dumps(list(seeds))))
        return sweep_id

    def sweeps(self) -> pd.DataFrame:
        """One row per sweep, newest first: id, name, created, its definition and run counts."""
        with self._read() as conn:
            rows = conn.execute(
                "SELECT s.sweep_id, s.name, s.created, s.base_config, s.grid, s.seeds, COUNT(r.run_id), "
                "COALESCE(SUM(r.status = 'finished'), 0), COALESCE(SUM(r.status = 'failed'), 0) FROM sweeps s "
                "LEFT JOIN runs r ON r.sweep_id = s.sweep_id GROUP BY s.sweep_id "
                "ORDER BY s.created DESC, s.sweep_id").fetchall()
        columns = ["sweep_id", "name", "created", "base_config", "grid", "seeds", "runs", "finished", "failed"]
        frame = pd.DataFrame.from_records(
            [(i, n, datetime.fromtimestamp(c), json.loads(b), json.loads(g), json.loads(s), *counts)
             for i, n, c, b, g, s, *counts in rows], columns=columns)
        frame["created"] = pd.to_datetime(frame["created"])
        return frame

    def sweep_runs(self, sweep_id: str, target_accuracy: float | None = None) -> pd.DataFrame:
        """The runs of one sweep, as :meth:`runs` gives them."""
        return self.runs(sweep_id=sweep_id, target_accuracy=target_accuracy)

    def _keys(self, sweep_id: str, status: str) -> set[str]:
        with self._read() as conn:
            return {key for (key,) in conn.execute(
                "SELECT DISTINCT sweep_key FROM runs WHERE sweep_id = ? AND status = ? AND sweep_key IS NOT NULL",
                (sweep_id, status))}

    def finished_keys(self, sweep_id: str) -> set[str]:
        """``sweep_key`` of every run of the sweep that finished."""
        return self._keys(sweep_id, "finished")

    def failed_keys(self, sweep_id: str) -> set[str]:
        """``sweep_key`` of the points that failed and have not finished since (retry those)."""
        return self._keys(sweep_id, "failed") - self.finished_keys(sweep_id)

    def __repr__(self) -> str:
        with self._read() as conn:
            count = conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
        return f"<workbench.Store {self.path}: {count} runs>"


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
