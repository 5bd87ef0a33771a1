"""Slurm seen from the workbench: job state, cancelling, the MPI plugins ``srun`` offers, and the
one-line message for ranks that do not form one MPI job.

Used by ``wb.Cluster(engines="slurm")`` (the engines' batch job) and by ``workbench train``
inside an allocation (ranks started with ``srun``). Only Slurm's client commands (``squeue``,
``scancel``, ``srun``) are run; everything here is a no-op that returns quickly where they are
missing. Standard library only.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from typing import Iterable, Sequence

#: states of a job that still holds (or waits for) resources
ACTIVE_STATES = {"UNKNOWN", "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING",
                 "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD", "REQUEUE_FED", "REQUEUE_HOLD"}

#: reasons a pending job keeps while nothing changes in the cluster's configuration: it will never
#: start (squeue's %r), with what they mean
NEVER_REASONS = {
    "PartitionConfig": "more CPUs, nodes or memory than the partition has",
    "PartitionNodeLimit": "more nodes than the partition allows",
    "PartitionTimeLimit": "a longer time limit than the partition allows",
    "BadConstraints": "constraints no node satisfies",
    "InvalidAccount": "an account that does not exist or is not yours",
    "InvalidQOS": "a QOS that does not exist or is not yours",
}

#: what a user passes when srun started every rank as its own singleton
#: every srun this project starts: all tasks killed when one fails (as mpiexec does: an MPI job that
#: lost a rank is stuck); a user's srun_args come after it, so they win
KILL_ON_BAD_EXIT = "--kill-on-bad-exit=1"
PMI_HINT = '["--mpi=pmix"] or ["--mpi=pmi2"]'


def in_allocation() -> bool:
    """This process runs inside a Slurm allocation (``salloc``, an ``sbatch`` script, ``srun``)."""
    return bool(os.environ.get("SLURM_JOB_ID"))


def find_srun() -> str:
    """Path of ``srun``: ``$WORKBENCH_SRUN`` or the first on ``PATH``."""
    found = os.environ.get("WORKBENCH_SRUN") or shutil.which("srun")
    if not found:
        raise FileNotFoundError("srun not found on PATH: load your site's Slurm module, or use --launcher mpiexec")
    return found


def _run(argv: Sequence[str], timeout: float = 15.0) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None


def job_state(job_id: str) -> tuple[str, str] | None:
    """``(state, reason)`` of a job (``("PENDING", "Resources")``), or None when Slurm no longer
    knows it. ``("UNKNOWN", why)`` when ``squeue`` could not tell (not found, timed out, the
    controller did not answer): counted as active, so a slow controller is not a dead job."""
    proc = _run(["squeue", "-h", "-t", "all", "-j", str(job_id), "-o", "%T|%r"])
    if proc is None:
        return "UNKNOWN", "squeue could not be run"
    if proc.returncode != 0:
        if "invalid job id" in proc.stderr.lower():
            return None
        return "UNKNOWN", " ".join(proc.stderr.split()) or f"squeue exited with code {proc.returncode}"
    for line in proc.stdout.splitlines():
        if "|" in line:
            state, reason = line.strip().split("|", 1)
            return state, reason
    return None


def job_active(job_id: str) -> bool:
    state = job_state(job_id)
    return state is not None and state[0] in ACTIVE_STATES


def cancel(job_ids: Iterable[str], signal: str | None = None) -> None:
    """``scancel`` the jobs (or steps, ``JOB.STEP``); one that has ended already is not an error."""
    ids = [str(j) for j in job_ids if j]
    if ids:
        _run(["scancel", *(["-s", signal] if signal else []), *ids])


def cancel_named(name: str) -> None:
    """``scancel --name``: the jobs called ``name`` (one that srun allocated for itself)."""
    if name:
        _run(["scancel", f"--name={name}"])


def steps_named(job_id: str, name: str) -> list[str]:
    """The steps (``JOB.STEP``) of a job that are called ``name``."""
    proc = _run(["squeue", "-h", "-s", "-j", str(job_id), "-o", "%i|%j"])
    if proc is None or proc.returncode != 0:
        return []
    return [line.split("|", 1)[0].strip() for line in proc.stdout.splitlines()
            if "|" in line and line.split("|", 1)[1].strip() == name]


def wait_gone(job_ids: Iterable[str], timeout: float = 15.0) -> list[str]:
    """Wait until the jobs have left ``squeue``'s active states; returns those still there."""
    left = [str(j) for j in job_ids if j]
    if not shutil.which("squeue"):
        return left
    deadline = time.monotonic() + timeout
    while left:
        left = [j for j in left if job_active(j)]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return left


def allocation_nodes() -> list[str]:
    """The nodes of the current allocation (``SLURM_JOB_NODELIST`` expanded by ``scontrol``)."""
    return _hostnames(os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST"))


def _hostnames(nodelist: str | None) -> list[str]:
    """A Slurm node list (``n[0-2]``) expanded by ``scontrol show hostnames``; [] for none or when it fails."""
    proc = _run(["scontrol", "show", "hostnames", nodelist]) if nodelist else None
    return proc.stdout.split() if proc is not None and proc.returncode == 0 else []


def held_nodes() -> list[str]:
    """The nodes the current allocation holds now (``scontrol show job``'s NodeList, expanded): fewer than
    :func:`allocation_nodes` once a node of a ``--no-kill`` job has failed (Slurm takes it out of the job);
    [] outside an allocation or when Slurm cannot tell."""
    job = os.environ.get("SLURM_JOB_ID")
    proc = _run(["scontrol", "show", "job", "-o", job]) if job else None
    found = re.search(r"(?:^|\s)NodeList=(\S+)", proc.stdout) if proc is not None and proc.returncode == 0 else None
    return [] if found is None or found.group(1) == "(null)" else _hostnames(found.group(1))


def failed_nodes(names) -> dict[str, str]:
    """Of the nodes ``names``, those Slurm has taken out of service (down, drained, failed, not
    responding): node -> ``"Slurm: down*, Not responding"``; {} when none is or Slurm cannot tell."""
    names = set(names)
    proc = _run(["sinfo", "-h", "-N", "-n", ",".join(sorted(names)), "-o", "%N|%T|%E"]) if names else None
    if proc is None or proc.returncode != 0:
        return {}
    out = {}
    for line in proc.stdout.splitlines():
        node, _, rest = line.partition("|")
        state, _, reason = rest.partition("|")
        bad = state.rstrip("*~#!%$@^-") in ("down", "drained", "draining", "fail", "failing") or state.endswith("*")
        if node in names and bad:
            why = f"Slurm: {state}" + (f", {reason.strip()}" if reason.strip() and reason.strip() != "none" else "")
            out[node] = why + (" - its slurmd stopped answering" if "respond" in reason.lower() else "")
    return out


def mpi_plugins() -> list[str]:
    """What ``srun --mpi=list`` offers here (``["none", "pmi2", "cray_shasta"]``), [] if unknown."""
    try:
        srun = find_srun()
    except FileNotFoundError:
        return []
    proc = _run([srun, "--mpi=list"])
    if proc is None:
        return []
    names = []
    for line in (proc.stdout + proc.stderr).splitlines():
        line = line.strip()
        m = re.match(r"^(?:srun:\s*)?([A-Za-z0-9_]+)$", line)
        if m and m.group(1).lower() not in ("srun",):
            names.append(m.group(1))
        for version in re.findall(r"\b(pmix_v\d+)\b", line):  # "specific pmix plugin versions available: pmix_v4"
            if version not in names:
                names.append(version)
    return names


def not_one_job_message(count: int, sizes: Sequence[int], option: str) -> str:
    """One line for engines or ranks that srun started as singletons (each rank 0 of 1):
    ``option`` is how the user passes srun arguments (``srun_args=`` or ``--srun-args``)."""
    offered = mpi_plugins()
    where = (f"`srun --mpi=list` offers here: {', '.join(offered)}" if offered
             else "`srun --mpi=list` shows what this cluster offers")
    hint = (f"pass srun_args={PMI_HINT}" if option == "srun_args"
            else "pass --srun-args=--mpi=pmix or --srun-args=--mpi=pmi2")
    size = f"of size {sorted(set(sizes))[0]}" if len(set(sizes)) == 1 else f"of sizes {sorted(set(sizes))}"
    from ...mpilib import FLAVOURS, rank_library
    library = rank_library().get("flavour")
    speaks = (f"; the ranks load {FLAVOURS[library].title}, which speaks {FLAVOURS[library].srun_mpi.upper()}: "
              f"--mpi={FLAVOURS[library].srun_mpi}") if library else ""
    return (f"srun started {count} ranks that are not one MPI job (each is rank 0 {size}): srun gave "
            f"them no process-management interface this MPI library uses; {hint} ({where}){speaks}")


def srun_command(nranks: int, srun_args: Sequence[str] = ()) -> list[str]:
    """``srun -n N`` for a job step inside the allocation: every task is killed when one fails
    (as mpiexec does), output labelled with the task's rank; ``srun_args`` come last so a user's
    choice wins."""
    return [find_srun(), "-n", str(nranks), KILL_ON_BAD_EXIT, "--label", *srun_args]


def check_engine_job(job: str, n: int, registered: int, timed_out: bool, start_timeout: float, output_file,
                     output) -> None:
    """While a cluster's engines come up as Slurm job ``job`` (``n`` tasks, ``registered`` so far):
    a job that ended is an error with its output (``output()``, the text of ``output_file``); one that
    can never start, or is still pending at the timeout, is cancelled and named with Slurm's reason."""
    state = job_state(job)
    if state is None or state[0] not in ACTIVE_STATES:
        raise RuntimeError(
            f"the engines' Slurm job {job} ended ({state[0] if state else 'gone from squeue'}) "
            f"after {registered} of {n} engines registered; its output ({output_file}):\n{output()}")
    if state[0] == "PENDING" and state[1] in NEVER_REASONS:
        cancel([job])
        raise RuntimeError(
            f"the engines' Slurm job {job} ({n} tasks) can never start: Slurm's reason "
            f"{state[1]} ({NEVER_REASONS[state[1]]}); the job was cancelled. Ask for fewer engines (n) "
            "or another partition (queue)")
    if timed_out and state[0] == "PENDING":
        cancel([job])
        raise TimeoutError(
            f"the engines' Slurm job {job} ({n} tasks) was still pending after "
            f"{start_timeout:g} s (start_timeout), Slurm's reason: {state[1]}; the job was cancelled. "
            "Ask for fewer engines (n), another partition (queue) or a longer start_timeout")
