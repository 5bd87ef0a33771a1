"""The results store: every run (config, summary, per-step metrics, trace) and every sweep, in
one SQLite file: the ``path`` argument, else ``$WORKBENCH_STORE``, else ``data/workbench.sqlite``
under the current directory.

One module per concept: :mod:`~workbench.store.schema` (the tables, ``PRAGMA user_version`` =
:data:`SCHEMA_VERSION`, migrations), :mod:`~workbench.store.database` (the file and its
connections), :mod:`~workbench.store.encoding` (JSON in, JSON out), :mod:`~workbench.store.runs`
(runs: record, load, list) and :mod:`~workbench.store.sweeps` (sweeps and their points).
Pure: neither torch nor mpi4py is imported.

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
  unless ``WORKBENCH_SHARED=1`` (:func:`workbench.paths.shared_files`).
"""
from __future__ import annotations

from .database import BUSY_TIMEOUT_SECONDS, default_path
from .runs import RUN_COLUMNS, SUMMARY_COLUMNS
from .schema import SCHEMA_VERSION
from .sweeps import Sweeps

__all__ = ["Store", "default_path", "SCHEMA_VERSION", "RUN_COLUMNS", "SUMMARY_COLUMNS", "BUSY_TIMEOUT_SECONDS"]


class Store(Sweeps):
    """A SQLite results store, safe to use from several threads and processes at once.

    ``Store().runs()`` lists runs as a DataFrame; ``load(run_id)`` gives a
    :class:`~workbench.results.RunResult`; sweeps find their finished points with
    :meth:`finished_keys`. See the docstring of the package :mod:`workbench.store` for the file's shape
    and :mod:`workbench.store.schema` for the tables.

    Args:
        path: the SQLite file (created, with its folder, when missing); default ``$WORKBENCH_STORE``, else
            ``data/workbench.sqlite`` under the current directory.

    Raises:
        IsADirectoryError: ``path`` is a folder.
        RuntimeError: the file's schema is newer than this workbench reads (upgrade workbench).
        sqlite3.OperationalError: the file could not be switched to WAL mode within
            ``BUSY_TIMEOUT_SECONDS``, or is not an SQLite database.

    Attributes:
        path (Path): the store's file.
    """

    def __repr__(self) -> str:
        with self._read() as conn:
            count = conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
        return f"<workbench.Store {self.path}: {count} run{'s' * (count != 1)}>"
