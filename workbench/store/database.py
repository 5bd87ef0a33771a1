"""The store's SQLite file: where it is, how it is created, and the connections to it.

WAL journal mode, ``busy_timeout`` and ``BEGIN IMMEDIATE`` writes, a connection per operation:
see the package docstring for why.
"""
from __future__ import annotations

import os
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..config import shared_files
from .schema import ensure_schema

BUSY_TIMEOUT_SECONDS = 60.0  # how long a writer waits for another's transaction to end


def default_path() -> Path:
    """``$WORKBENCH_STORE`` or ``data/workbench.sqlite`` under the current directory."""
    return Path(os.environ.get("WORKBENCH_STORE") or "data/workbench.sqlite")


def unknown_run(run_id: str, path: Path) -> KeyError:
    """The error for a run id the store does not hold, saying how to list the ones it does."""
    return KeyError(f"run {run_id!r} is not in the store {path}; list the runs with "
                    f"Store({str(path)!r}).runs() or `workbench runs --store {path}`")


class Database:
    """An open store file: created (owner-only unless ``WORKBENCH_SHARED=1``) and brought to the
    current schema on construction; :meth:`_read` and :meth:`_write` give connections."""

    def __init__(self, path: str | os.PathLike | None = None) -> None:
        self.path = Path(path) if path is not None else default_path()
        if self.path.is_dir():
            raise IsADirectoryError(f"results store: {self.path} is a directory; give a file path")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not shared_files() and not self.path.exists():  # created owner-only before sqlite opens it
            os.close(os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600))
        self._use_wal()
        with self._write() as conn:
            ensure_schema(conn, self.path)

    def _use_wal(self) -> None:
        """Switch the file to WAL (persistent; only its first opener changes it). Openers racing on a
        new file can find it locked: SQLite answers the switch with "database is locked" at once,
        without its busy handler, so the switch is retried up to the busy timeout."""
        deadline = time.monotonic() + BUSY_TIMEOUT_SECONDS
        while True:
            try:
                with self._read() as conn:
                    if (conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
                            or conn.execute("PRAGMA journal_mode = WAL").fetchone()[0] == "wal"):
                        return
                if time.monotonic() > deadline:  # the switch answered with the old mode
                    raise sqlite3.OperationalError(f"results store: {self.path} could not switch to WAL mode")
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
            time.sleep(0.01)

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
