"""Batch training without a notebook: validate, launch mpiexec, collect the run directory.

``train(cfg)`` writes ``<run_dir>/config.json``, runs ``workbench.runtime.worker`` on
``cfg.ranks`` ranks and returns the parsed ``summary.json``. Without ``run_dir`` the run goes
under ``data/runs/<run-id>/``.
"""
from __future__ import annotations

import json
import os
import uuid
from datetime import datetime
from pathlib import Path

from ..config import RunConfig
from .launcher import run_mpi


def runs_root() -> Path:
    """``$WORKBENCH_RUNS`` or ``data/runs`` under the current directory."""
    return Path(os.environ.get("WORKBENCH_RUNS", "data/runs"))


def new_run_id(cfg: RunConfig) -> str:
    """``20261122-143501-sync-easgd-3fa2``: sortable, readable, unique."""
    return f"{datetime.now():%Y%m%d-%H%M%S}-{cfg.algorithm}-{uuid.uuid4().hex[:4]}"


def train(cfg: RunConfig, run_dir: str | os.PathLike | None = None, *, resume: str | os.PathLike | None = None,
          timeout: float = 1800, stream: bool = False) -> dict:
    """Run ``cfg`` under mpiexec and return its summary (also in ``run_dir/summary.json``).

    ``resume``: a run directory with a checkpoint; the run continues from its newest complete
    checkpoint (bit for bit for the synchronous algorithms; each rank from its own newest state
    for the asynchronous ones) and writes into ``run_dir`` (default: ``resume`` itself).
    Raises :class:`~workbench.runtime.launcher.MPILaunchError` naming the failed rank.
    """
    run_dir = Path(run_dir if run_dir is not None else (resume or runs_root() / new_run_id(cfg)))
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(cfg.to_json())
    args = ["-m", "workbench.runtime.worker", "--run-dir", str(run_dir.resolve())]
    if resume is not None:
        args += ["--resume", str(Path(resume).resolve())]
    run_mpi(cfg.ranks, args, timeout=timeout, stream=stream)
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["run_dir"] = str(run_dir)
    return summary


def time_to_accuracy(run_dir: str | os.PathLike, target: float) -> float | None:
    """Seconds from the common start until an evaluation first reached ``target``, or None."""
    from ..results import history_frame, time_to_accuracy as from_history
    lines = Path(run_dir, "metrics.jsonl").read_text().splitlines()
    return from_history(history_frame([json.loads(line) for line in lines if line.strip()]), target)
