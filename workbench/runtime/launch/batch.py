"""Batch training without a notebook: validate, launch mpiexec (srun inside a Slurm allocation),
collect the run directory.

``train(cfg)`` writes ``<run_dir>/config.json``, runs ``workbench.runtime.rank.worker`` on
``cfg.ranks`` ranks and returns the parsed ``summary.json``. Without ``run_dir`` the run goes
under ``data/runs/<run-id>/``.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

from ...config import RunConfig
from . import slurm
from .blame import NOT_ONE_JOB, MPILaunchError
from .mpiexec import default_launcher, run_mpi
from ..rundir import CANCEL_FILE, make_run_dir, new_run_id, runs_root


def train(cfg: RunConfig, run_dir: str | os.PathLike | None = None, *, resume: str | os.PathLike | None = None,
          timeout: float = 1800, stream: bool = False, grace: float = 10.0, launcher: str | None = None,
          srun_args: list[str] | tuple[str, ...] = ()) -> dict:
    """Run ``cfg`` under mpiexec and return its summary (also in ``run_dir/summary.json``).

    ``launcher``: ``"mpiexec"`` or ``"srun"`` (a job step of the current Slurm allocation, with
    ``srun_args``); default: ``srun`` when ``SLURM_JOB_ID`` is set, else ``mpiexec``.

    ``resume``: a run directory with a checkpoint; the run continues from its newest complete
    checkpoint (bit for bit for the synchronous algorithms; each rank from its own newest state
    for the asynchronous ones) as a new run in ``run_dir``; ``resume``'s files stay as they were.
    ``run_dir`` defaults to ``data/runs/<new run id>``; a directory that already holds a run is
    refused (:func:`make_run_dir`). Raises :class:`~workbench.runtime.launch.mpiexec.MPILaunchError`
    naming the failed rank.

    SIGINT, SIGTERM or SIGHUP while it runs (from the main thread) write ``run_dir/CANCEL``: the
    ranks stop at their next evaluation point or exchange and rank 0 writes a summary with
    ``"cancelled": true``; a job still running ``grace`` seconds later is killed. Either way
    :class:`~workbench.runtime.launch.signals.RunInterrupted` is raised once no process is left.
    """
    run_dir = make_run_dir(run_dir if run_dir is not None else runs_root() / new_run_id(cfg))
    (run_dir / "config.json").write_text(cfg.to_json())
    cancel_flag = run_dir / CANCEL_FILE  # the ranks' cooperative-cancel flag
    cancel_flag.unlink(missing_ok=True)  # left by an interrupted run that this one resumes
    args = ["-m", "workbench.runtime.rank.worker", "--run-dir", str(run_dir.resolve())]
    if resume is not None:
        args += ["--resume", str(Path(resume).resolve())]
    launcher = launcher or default_launcher()
    try:
        run_mpi(cfg.ranks, args, timeout=timeout, stream=stream, grace=grace, launcher=launcher,
                srun_args=srun_args,
                on_interrupt=lambda: cancel_flag.write_text("cancelled by a signal to the launcher\n"))
    except MPILaunchError as exc:
        if NOT_ONE_JOB not in exc.output:
            raise
        if launcher == "srun":
            sizes = [int(m) for m in re.findall(rf"{NOT_ONE_JOB}: this rank is rank \d+ of (\d+)", exc.output)]
            raise MPILaunchError(slurm.not_one_job_message(cfg.ranks, sizes or [1], "--srun-args"),
                                 exc.failed_ranks, exc.output) from None
        raise MPILaunchError(f"mpiexec started {cfg.ranks} ranks that are not one MPI job of {cfg.ranks}: mpi4py "
                             "does not use the MPI library of this mpiexec (set WORKBENCH_MPIEXEC)",
                             exc.failed_ranks, exc.output) from None
    finally:
        cancel_flag.unlink(missing_ok=True)
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["run_dir"] = str(run_dir)
    return summary


def time_to_accuracy(run_dir: str | os.PathLike, target: float) -> float | None:
    """Seconds from the common start until an evaluation first reached ``target``, or None."""
    from ...results import history_frame, time_to_accuracy as from_history
    lines = Path(run_dir, "metrics.jsonl").read_text().splitlines()
    return from_history(history_frame([json.loads(line) for line in lines if line.strip()]), target)
