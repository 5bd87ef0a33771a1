"""Sweeps in the store: a sweep's definition under an id derived from it, and which of its
points finished or failed (what a re-run skips or retries)."""
from __future__ import annotations

import hashlib
import json
import time
from datetime import datetime

import pandas as pd

from .encoding import dumps, json_default
from .runs import Runs


class Sweeps(Runs):
    """The ``sweeps`` table and the sweep columns of ``runs`` (the store's sweep methods)."""

    def create_sweep(self, name: str, base_config: dict, grid: dict, seeds: list) -> str:
        """Register a sweep and return its id, ``sweep-<12 hex>``: a hash of the definition, so
        the same (name, base_config, grid, seeds) always gives the same id and a sweep re-run
        after a kernel restart finds its finished points. Registering it again changes nothing.

        Args:
            name: the sweep's label.
            base_config: the RunConfig fields every point starts from (a dict).
            grid: field name -> the values it takes.
            seeds: the seeds each configuration runs with.
        """
        definition = {"name": name, "base_config": base_config, "grid": grid, "seeds": list(seeds)}
        canonical = json.dumps(definition, sort_keys=True, separators=(",", ":"), default=json_default)
        sweep_id = "sweep-" + hashlib.sha1(canonical.encode()).hexdigest()[:12]
        with self._write() as conn:
            conn.execute("INSERT OR IGNORE INTO sweeps (sweep_id, name, created, base_config, grid, seeds) "
                         "VALUES (?, ?, ?, ?, ?, ?)", (sweep_id, name, time.time(), dumps(base_config),
                                                       dumps(grid), dumps(list(seeds))))
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
        """The runs of one sweep, as :meth:`runs` gives them.

        Args:
            sweep_id: the sweep's id (:meth:`create_sweep`).
            target_accuracy: test accuracy for the ``time_to_target`` column (None: NaN throughout).
        """
        return self.runs(sweep_id=sweep_id, target_accuracy=target_accuracy)

    def _keys(self, sweep_id: str, status: str) -> set[str]:
        with self._read() as conn:
            return {key for (key,) in conn.execute(
                "SELECT DISTINCT sweep_key FROM runs WHERE sweep_id = ? AND status = ? AND sweep_key IS NOT NULL",
                (sweep_id, status))}

    def finished_keys(self, sweep_id: str) -> set[str]:
        """``sweep_key`` of every run of the sweep that finished.

        Args:
            sweep_id: the sweep's id (:meth:`create_sweep`).
        """
        return self._keys(sweep_id, "finished")

    def failed_keys(self, sweep_id: str) -> set[str]:
        """``sweep_key`` of the sweep's points that failed and have not finished since (retry those).

        Args:
            sweep_id: the sweep's id (:meth:`create_sweep`).
        """
        return self._keys(sweep_id, "failed") - self.finished_keys(sweep_id)
