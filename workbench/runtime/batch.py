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
from .rundir import CANCEL_FILE


def runs_root() -> Path:
    """``$WORKBENCH_RUNS`` or ``data/runs`` under the current directory."""
    return Path(os.environ.get("WORKBENCH_RUNS", "data/runs"))


def new_run_id(cfg: RunConfig) -> str:
    """``20261122-143501-sync-easgd-3fa2``: sortable, readable, unique."""
    return f"{datetime.now():%Y%m%d-%H%M%S}-{cfg.algorithm}-{uuid.uuid4().hex[:4]}"


def run_id_for(run_dir: str | os.PathLike | None, cfg: RunConfig, store=None, name: str | None = None) -> str:
    """The id under which a run writing into ``run_dir`` is stored: unique in ``store``.

    It is ``name`` (default: the directory's name, or :func:`new_run_id` without a directory)
    when ``store`` (a :class:`~workbench.store.Store`, or None: no store to collide with) holds
    no run of that id, else that name with ``-`` and 4 random hex digits: ``--out a/myrun`` and
    then ``--out b/myrun`` are two runs, ``myrun`` and ``myrun-3fa2``.
    """
    base = name or (Path(run_dir).resolve().name if run_dir is not None else new_run_id(cfg))
    run_id = base
    while store is not None and run_id in store:
        run_id = f"{base}-{uuid.uuid4().hex[:4]}"
    return run_id


def make_run_dir(run_dir: str | os.PathLike, option: str = "run_dir") -> Path:
    """Create ``run_dir`` for a new run and return it; ConfigError if it is a file or already holds
    a run (``config.json``: a finished run's files are never overwritten; a resumed run writes
    into a new directory). The directory is created ``0700`` (owner only) unless
    ``WORKBENCH_SHARED=1``; ``option`` names the argument in the message (``--out``)."""
    from ..config import ConfigError, shared_files
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"{option}: {str(run_dir)!r} is a file, not a directory")
    if (run_dir / "config.json").exists():
        raise ConfigError(f"{option}: {str(run_dir)!r} already holds a run ({run_dir / 'config.json'}); give a "
                          f"new directory (to continue that run: --resume {run_dir} --out NEW_DIR)")
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    run_dir.mkdir(mode=0o777 if shared_files() else 0o700, exist_ok=True)
    return run_dir


def train(cfg: RunConfig, run_dir: str | os.PathLike | None = None, *, resume: str | os.PathLike | None = None,
          timeout: float = 1800, stream: bool = False, grace: float = 10.0) -> dict:
    """Run ``cfg`` under mpiexec and return its summary (also in ``run_dir/summary.json``).

    ``resume``: a run directory with a checkpoint; the run continues from its newest complete
    checkpoint (bit for bit for the synchronous algorithms; each rank from its own newest state
    for the asynchronous ones) as a new run in ``run_dir``; ``resume``'s files stay as they were.
    ``run_dir`` defaults to ``data/runs/<new run id>``; a directory that already holds a run is
    refused (:func:`make_run_dir`). Raises :class:`~workbench.runtime.launcher.MPILaunchError`
    naming the failed rank.

    SIGINT, SIGTERM or SIGHUP while it runs (from the main thread) write ``run_dir/CANCEL``: the
    ranks stop at their next evaluation point or exchange and rank 0 writes a summary with
    ``"cancelled": true``; a job still running ``grace`` seconds later is killed. Either way
    :class:`~workbench.runtime.launcher.RunInterrupted` is raised once no process is left.
    """
    run_dir = make_run_dir(run_dir if run_dir is not None else runs_root() / new_run_id(cfg))
    (run_dir / "config.json").write_text(cfg.to_json())
    cancel_flag = run_dir / CANCEL_FILE  # the ranks' cooperative-cancel flag
    cancel_flag.unlink(missing_ok=True)  # left by an interrupted run that this one resumes
    args = ["-m", "workbench.runtime.worker", "--run-dir", str(run_dir.resolve())]
    if resume is not None:
        args += ["--resume", str(Path(resume).resolve())]
    try:
        run_mpi(cfg.ranks, args, timeout=timeout, stream=stream, grace=grace,
                on_interrupt=lambda: cancel_flag.write_text("cancelled by a signal to the launcher\n"))
    finally:
        cancel_flag.unlink(missing_ok=True)
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["run_dir"] = str(run_dir)
    return summary


def time_to_accuracy(run_dir: str | os.PathLike, target: float) -> float | None:
    """Seconds from the common start until an evaluation first reached ``target``, or None."""
    from ..results import history_frame, time_to_accuracy as from_history
    lines = Path(run_dir, "metrics.jsonl").read_text().splitlines()
    return from_history(history_frame([json.loads(line) for line in lines if line.strip()]), target)
