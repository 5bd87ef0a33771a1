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
from contextlib import nullcontext
from pathlib import Path

from ...config import RunConfig
from . import slurm
from .blame import NOT_ONE_JOB, MPILaunchError, describe_end, who_is
from .launcher import run_mpi
from .mpiexec import default_launcher
from .signals import RunInterrupted
from ..live import LiveFiles, following, records_in
from ..rundir import CANCEL_FILE, make_run_dir, new_run_id, runs_root


def train(cfg: RunConfig, run_dir: str | os.PathLike | None = None, *, resume: str | os.PathLike | None = None,
          timeout: float = 1800, stream: bool = False, grace: float = 10.0, launcher: str | None = None,
          srun_args: list[str] | tuple[str, ...] = (), vcluster=None, ppn: int = 1, nodes=None, watch=(),
          restart: bool = False) -> dict:
    """Run ``cfg`` under mpiexec and return its summary (also in ``run_dir/summary.json``).

    ``launcher``: ``"mpiexec"`` or ``"srun"`` (a job step of the current Slurm allocation, with
    ``srun_args``); default: ``srun`` when ``SLURM_JOB_ID`` is set, else ``mpiexec``.
    ``vcluster``: a :class:`~workbench.vcluster.VirtualCluster` (or its name): the ranks run on its
    nodes (``nodes``: those of its node indices, in order; default all), ``ppn`` per node; the run
    directory must be one the nodes see (its shared folder, or
    anywhere outside ``/tmp`` and ``/dev/shm``). The job's own files (each rank's output, how each
    rank ended) go into ``<run_dir>/job`` on every launcher, so ranks on other nodes can write them.

    ``watch``: consumers of the ranks' live channel (:func:`workbench.runtime.live.following`: each
    called with the new messages about every second while the job runs, and once after it ends); the
    CLI's run handle (its store row) and its progress bar.

    ``restart``: this is a restart of the run in ``run_dir`` itself (``resume`` is ``run_dir``): its folder,
    which holds the run, is used again (:class:`~workbench.runtime.client.batch_run.BatchRun`, ``max_restarts``).

    ``resume``: a run directory with a checkpoint; the run continues from its newest complete
    checkpoint (bit for bit for the synchronous algorithms; each rank from its own newest state
    for the asynchronous ones) as a new run in ``run_dir``; ``resume``'s files stay as they were.
    ``run_dir`` defaults to ``data/runs/<new run id>``; a directory that already holds a run is
    refused (:func:`make_run_dir`). Raises :class:`~workbench.runtime.launch.blame.MPILaunchError`
    naming the failed rank.

    SIGINT, SIGTERM or SIGHUP while it runs (from the main thread) write ``run_dir/CANCEL``: the
    ranks stop at their next evaluation point or exchange and rank 0 writes a summary with
    ``"cancelled": true``; a job still running ``grace`` seconds later is killed. Either way
    :class:`~workbench.runtime.launch.signals.RunInterrupted` is raised once no process is left.
    """
    run_dir, options = _on_vcluster(cfg, run_dir, resume, vcluster, ppn, nodes) if vcluster is not None else (run_dir, {})
    if restart:
        run_dir = Path(run_dir)
    else:
        run_dir = make_run_dir(run_dir if run_dir is not None else runs_root() / new_run_id(cfg))
    (run_dir / "config.json").write_text(cfg.to_json())
    cancel_flag = run_dir / CANCEL_FILE  # the ranks' cooperative-cancel flag
    cancel_flag.unlink(missing_ok=True)  # left by an interrupted run that this one resumes
    args = ["-m", "workbench.runtime.rank.worker", "--run-dir", str(run_dir.resolve())]
    if resume is not None:
        args += ["--resume", str(Path(resume).resolve())]
    launcher = launcher or default_launcher()
    try:
        with following(run_dir, list(watch)) if watch else nullcontext():
            result = run_mpi(cfg.ranks, args, timeout=timeout, stream=stream, grace=grace, launcher=launcher,
                             srun_args=srun_args, **{"job_dir": run_dir / JOB_FOLDER, **options},
                             on_interrupt=lambda: cancel_flag.write_text("cancelled by a signal to the launcher\n"),
                             survive=survivors(cfg))
    except RunInterrupted as exc:
        failed = _node_failure(exc)
        if failed is None:
            raise
        raise failed from None
    except MPILaunchError as exc:
        if NOT_ONE_JOB not in exc.output:
            raise
        raise _not_one_job(exc, launcher, cfg.ranks) from None
    finally:
        cancel_flag.unlink(missing_ok=True)
        try:
            (run_dir / JOB_FOLDER).rmdir()  # the job's own files are gone with it
        except OSError:
            pass
    if not (run_dir / "summary.json").exists():  # the launcher said all was well, but rank 0 never finished
        raise MPILaunchError(f"the MPI job on {cfg.ranks} ranks ended without a summary: rank 0 wrote no "
                             f"{run_dir / 'summary.json'} (a rank ended early without an error the launcher saw)",
                             [], "")
    summary = json.loads((run_dir / "summary.json").read_text())
    if result.survived:  # workers the master went on without: how each ended, as blame names a rank
        summary["workers_lost"] = [{"rank": e.get("rank"), "node": e.get("host"),
                                    "cause": f"{who_is(e.get('rank'), e.get('host'), e.get('pid'))} {describe_end(e)}"}
                                   for e in result.survived]
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
        _keep_records_of(run_dir, [e.get("rank") for e in result.survived])
    summary["run_dir"] = str(run_dir)
    return summary


def _keep_records_of(run_dir: Path, ranks: list) -> None:
    """Append to ``metrics.jsonl`` what the ``ranks`` lost mid-run recorded (their live files: rank 0 wrote
    the others' records from their reports, which a lost rank never sent)."""
    kept = records_in(m for m in LiveFiles(run_dir).read() if m.get("rank") in ranks)[0]
    if kept:
        with open(run_dir / "metrics.jsonl", "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in kept)


def survivors(cfg: RunConfig) -> range:
    """The ranks whose loss ``cfg``'s job goes on without, where the MPI library can: a master-based run with
    ``min_ranks`` serves on without a lost worker (:class:`~workbench.optim.master.Master`), while at least
    ``min_ranks`` ranks are left; none for the others (a lock-step collective needs every rank)."""
    return range(1, cfg.ranks) if cfg.spec.master_based and cfg.min_ranks is not None else range(0)


def _on_vcluster(cfg: RunConfig, run_dir, resume, vcluster, ppn: int, nodes=None) -> tuple[Path, dict]:
    """The run directory (checked: the nodes of ``vcluster`` see it and ``resume``) and the options of
    ``run_mpi`` that place the ranks on ``vcluster`` (on ``nodes``, default all), ``ppn`` per node."""
    from ...vcluster import VirtualCluster
    vcluster = VirtualCluster.attach(vcluster) if isinstance(vcluster, str) else vcluster
    run_dir = Path(run_dir if run_dir is not None else runs_folder(vcluster) / new_run_id(cfg))
    check_visible(vcluster, {"run_dir": run_dir, "resume": resume})
    return run_dir, vcluster.run_options(cfg.ranks, ppn, job_dir=run_dir / JOB_FOLDER, nodes=nodes)


def _node_failure(exc: RunInterrupted) -> MPILaunchError | None:
    """Inside a Slurm job, SIGTERM may be Slurm ending the job because a node failed: that is a
    failure, named with the failed nodes and the ranks that ran there, and not one to restart from
    (``restartable`` False: the allocation goes); None for any other signal."""
    lost = slurm.failed_nodes(slurm.allocation_nodes()) if slurm.in_allocation() and exc.signum == 15 else {}
    if not lost:
        return None
    ranks = {node: sorted(r for r, h in exc.hosts.items() if h == node) for node in lost}
    error = MPILaunchError("; ".join(f"node {node} failed ({why})" + (f": rank {', '.join(map(str, ranks[node]))} ran "
                                     "there" if ranks[node] else "") for node, why in lost.items())
                           + f"; Slurm cancelled job {os.environ.get('SLURM_JOB_ID')} and with it the run (sbatch "
                           "--no-kill keeps the allocation when a node fails, and --max-restarts then restarts the run "
                           "on the nodes left)", sorted(r for rs in ranks.values() for r in rs), "")
    error.restartable = False  # the allocation is going: nothing to restart on
    return error


def _not_one_job(exc: MPILaunchError, launcher: str, nranks: int) -> MPILaunchError:
    """The error for ranks that are not one MPI job (mpi4py's MPI is not the launcher's)."""
    if launcher == "srun":
        sizes = [int(m) for m in re.findall(rf"{NOT_ONE_JOB}: this rank is rank \d+ of (\d+)", exc.output)]
        return MPILaunchError(slurm.not_one_job_message(nranks, sizes or [1], "--srun-args"),
                              exc.failed_ranks, exc.output)
    return MPILaunchError(f"mpiexec started {nranks} ranks that are not one MPI job of {nranks}: mpi4py "
                          "does not use the MPI library of this mpiexec (set WORKBENCH_MPIEXEC)",
                          exc.failed_ranks, exc.output)


#: the job's own folder inside a run directory (ranks' output, their guards' records), removed at the end
JOB_FOLDER = "job"


def runs_folder(vcluster) -> Path:
    """Where runs on ``vcluster`` go by default: the usual runs folder when its nodes see it, else
    ``runs/`` in its shared folder."""
    return runs_root() if vcluster.visible(runs_root()) else vcluster.shared / "runs"


def check_visible(vcluster, paths: dict) -> None:
    """ConfigError naming the first of ``paths`` (name -> path or None) the nodes do not see."""
    from ...config import ConfigError
    for name, path in paths.items():
        if path is not None and not vcluster.visible(path):
            raise ConfigError(f"{name}: {path} is not seen by the nodes of vcluster {vcluster.name} (each node has its "
                              f"own /tmp and /dev/shm); use a folder under its shared folder {vcluster.shared} or "
                              "outside /tmp")


def time_to_accuracy(run_dir: str | os.PathLike, target: float) -> float | None:
    """Seconds from the common start until an evaluation first reached ``target``, or None."""
    from ...results import history_frame, time_to_accuracy as from_history
    lines = Path(run_dir, "metrics.jsonl").read_text().splitlines()
    return from_history(history_frame([json.loads(line) for line in lines if line.strip()]), target)
