"""The store's tables, and how an older file is brought up to date.

``PRAGMA user_version`` holds the file's schema version: 0 for a new file (the tables are
created), :data:`SCHEMA_VERSION` for a current one, anything between is migrated step by step
with :data:`MIGRATIONS`; a file from a newer workbench is refused. Tables (see the package
docstring for why they look so)::

    runs     run_id PK, created (unix seconds), status (running/finished/failed/cancelled),
             algorithm, ranks, config JSON, summary JSON|NULL, error|NULL, run_dir|NULL,
             sweep_id|NULL, sweep_key|NULL, resumed_from|NULL (version 2: the run a resumed run
             continues)                                             index (sweep_id, sweep_key)
    metrics  (run_id -> runs ON DELETE CASCADE, seq) PK, kind, rank, step, t (seconds),
             record JSON                                            one row per metric record
    traces   run_id PK -> runs ON DELETE CASCADE, events JSON       Chrome-trace spans (us)
    sweeps   sweep_id PK, name, created (unix seconds), base_config JSON, grid JSON, seeds JSON
"""
from __future__ import annotations

import sqlite3
from pathlib import Path

from ..summary import STATUSES

SCHEMA_VERSION = 2

#: The statements that create a new file's tables (at :data:`SCHEMA_VERSION`).
TABLES = [
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
#: Statements that bring a file of version ``v`` (the key) to ``v + 1``.
MIGRATIONS = {1: ["ALTER TABLE runs ADD COLUMN resumed_from TEXT"]}


def ensure_schema(conn: sqlite3.Connection, path: Path) -> None:
    """Create the tables of a new file or migrate an older one, inside the caller's write
    transaction (so a failed migration leaves the file as it was). ``path`` is for messages."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise RuntimeError(f"results store {path} has schema version {version}; this "
                           f"workbench reads up to {SCHEMA_VERSION}: upgrade workbench")
    if version == 0:  # a new file
        for statement in TABLES:
            conn.execute(statement)
    elif version < SCHEMA_VERSION:  # an older file: migrate step by step, in this transaction
        for step in range(version, SCHEMA_VERSION):
            for statement in MIGRATIONS[step]:
                conn.execute(statement)
    if version < SCHEMA_VERSION:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
