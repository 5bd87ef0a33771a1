"""What a notebook's clusters leave on disk, and cleaning up after a kernel that died.

Every cluster started by :class:`~workbench.runtime.client.cluster.Cluster` is recorded
(:func:`write_record`: owner pid and start time, ipyparallel's cluster file) under ``$WORKBENCH_STATE_DIR/clusters`` (default
``~/.cache/workbench/clusters``). A kernel that dies leaves its controller, mpiexec and engines
running (and, for ``engines="slurm"``, its engines' batch job queued or running);
:func:`cleanup_stale_clusters` finds those records, cancels the Slurm jobs they name (``scancel``),
stops what they name, kills stray engines (found by the cluster id in their environment) and
removes the cluster's files and what its killed MPI jobs left (this user's only: :mod:`..launch.leftovers`).
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import psutil

from ...files import atomic_write
from ...paths import state_dir
from ..launch.leftovers import remove_leftovers
from ..processes import stop_processes

#: environment variable that marks every process of a cluster with its id
CLUSTER_ID_ENV = "WORKBENCH_CLUSTER_ID"


def guard_dir(cluster_id: str, base: Path | None = None) -> Path:
    """Where the guards of a cluster's engines record how each engine ended (under ``base``, the
    cluster's files: default :func:`state_dir`)."""
    return (base or state_dir()) / "exits" / cluster_id


def batch_dir(cluster_id: str, base: Path | None = None) -> Path:
    """Where a batch-system cluster's engine job script and the batch system's output go."""
    return (base or state_dir()) / "batch" / cluster_id


def record_path(cluster_id: str) -> Path:
    """Where a cluster is recorded: ``<state dir>/clusters/<cluster id>.json``."""
    return state_dir() / "clusters" / f"{cluster_id}.json"


def write_record(cluster_id: str, cluster_file: str | None, *, engines: str, n: int, files: Path,
                 slurm_jobs: list[str], sockets: str | None = None) -> None:
    """Record a cluster that this process (its owner, by pid and start time) started: what
    :func:`cleanup_stale_clusters` stops once the owner is gone. Written whole (a cleanup in another
    kernel never reads half a record, which it would take for a stale one)."""
    me = psutil.Process()
    path = record_path(cluster_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps({"cluster_id": cluster_id, "owner_pid": me.pid, "owner_started": me.create_time(),
                                   "cluster_file": cluster_file, "engines": engines, "n": n, "started": time.time(),
                                   "files": str(files), "slurm_jobs": slurm_jobs, "sockets": sockets}))


def _owner_alive(record: dict) -> bool:
    try:
        return psutil.Process(record["owner_pid"]).create_time() == record["owner_started"]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def processes_of(cluster_id: str) -> list[psutil.Process]:
    """Controller, engines, nannies and mpiexec of a cluster: this user's processes whose environment
    carries ``WORKBENCH_CLUSTER_ID`` (ipyparallel passes the cluster id in ways that vary by launcher);
    never another user's, whatever its environment says."""
    found, me = [], os.geteuid()
    for proc in psutil.process_iter():
        try:
            if proc.uids().real == me and proc.environ().get(CLUSTER_ID_ENV) == cluster_id:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return []


def kill(processes: list[psutil.Process]) -> None:
    """SIGKILL a cluster's ``processes`` at once (they hold no state worth a polite end: runs are in
    the store) and wait up to a second until they have ended."""
    stop_processes(processes, grace=0, kill_wait=1.0)


def cleanup_stale_clusters() -> list[str]:
    """Stop every recorded cluster whose owner process is gone; return their cluster ids."""
    stopped = []
    for path in sorted((state_dir() / "clusters").glob("*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            path.unlink(missing_ok=True)
            continue
        if _owner_alive(record):
            continue
        if record.get("slurm_jobs"):
            from ..launch import slurm
            slurm.cancel(record["slurm_jobs"])
            slurm.wait_gone(record["slurm_jobs"], timeout=10)
        kill(processes_of(record["cluster_id"]))
        remove_files_of(record["cluster_id"], record.get("cluster_file"), Path(record.get("files") or state_dir()))
        if record.get("sockets"):  # the folder of its Unix sockets (engines in a network of their own)
            shutil.rmtree(record["sockets"], ignore_errors=True)
        path.unlink(missing_ok=True)
        stopped.append(record["cluster_id"])
    if stopped:
        remove_leftovers()
    return stopped


def remove_files_of(cluster_id: str, cluster_file: str | None, base: Path | None = None) -> None:
    """Everything a cluster leaves in its files' folder (``base``, default the state folder):
    ipyparallel's cluster file, the controller's connection files (they hold the keys to the
    cluster), logs, exit records, batch files."""
    base = base or state_dir()
    profile = base / "ipython"
    paths = [*(profile / "security").glob(f"ipcontroller-{cluster_id}-*.json"),
             *(profile / "security").glob(f"ipcontroller-{cluster_id}-config.py"),
             *(profile / "log").glob(f"*{cluster_id}*"), *(profile / "pid").glob(f"*{cluster_id}*")]
    if cluster_file:
        paths.append(Path(cluster_file))
    for path in paths:
        path.unlink(missing_ok=True)
    shutil.rmtree(guard_dir(cluster_id, base), ignore_errors=True)
    shutil.rmtree(batch_dir(cluster_id, base), ignore_errors=True)


