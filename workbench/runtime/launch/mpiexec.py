"""Launch Python programs under ``mpiexec`` (or ``srun`` inside a Slurm allocation): batch runs,
benchmarks and the MPI tests.

Ranks run ``python -m mpi4py ...`` so that an uncaught exception in any rank calls
``MPI_Abort`` and brings the whole job down instead of leaving the others waiting. Each
rank's output is captured separately so a failure can be reported as "rank R failed" with
that rank's traceback. Each rank runs under a small guard process (:mod:`.rankguard`) that
records how it ended, so the rank whose process died first is the one named, with its signal
or exit code. Every launch has a timeout, after which every process of the job is killed;
SIGINT, SIGTERM and SIGHUP stop the job (cooperatively first) and raise :class:`RunInterrupted`.

``launcher="srun"`` starts the same ranks as a job step of the current Slurm allocation
(``srun -n N --kill-on-bad-exit=1 --label [srun_args]``): output is told apart by srun's labels
(which work across nodes), the guards' records name the rank that died, and stopping the job also
cancels its step (``scancel``), whose tasks are not this process's descendants.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Sequence

from ...checks import integer
from . import slurm
from .heartbeat import Listener, describe as describe_silent
from ..processes import alive as running, stop_processes
from .job import Job
from .blame import MPILaunchError, MPIResult, collect_output, failed_ranks, failure, rank_records, tail
from .shm import remove_orphaned_shm
from .signals import RunInterrupted

#: Environment for every rank: one thread each. Two threads per rank on 2 cores made 4 ranks
#: about 50x slower on the development machine.
RANK_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}

#: the parent of every rank, which records how the rank ended (run by path: no package import)
GUARD = Path(__file__).with_name("rankguard.py")

#: how ranks can be started: mpiexec on this machine, or srun inside a Slurm allocation
LAUNCHER_NAMES = ("mpiexec", "srun")


def default_launcher() -> str:
    """``srun`` inside a Slurm allocation (``SLURM_JOB_ID`` set), else ``mpiexec``."""
    return "srun" if slurm.in_allocation() else "mpiexec"


def find_mpiexec() -> str:
    """Path of ``mpiexec``: ``$WORKBENCH_MPIEXEC``, else the one beside this Python (the
    venv's, from the ``mpich`` wheel), else the first on ``PATH`` (a cluster's system MPI)."""
    env = os.environ.get("WORKBENCH_MPIEXEC")
    if env:
        return env
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    found = shutil.which("mpiexec")
    if found is None:
        raise FileNotFoundError(
            "mpiexec not found: install the 'mpich' extra (pip install 'workbench[mpich]'), "
            "load your cluster's MPI module, or set WORKBENCH_MPIEXEC")
    return found


def rank_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for ranks: this one, one thread per rank, this Python's bin on PATH."""
    env = dict(os.environ)
    env.update(RANK_ENV)
    bin_dir = str(Path(sys.executable).parent)
    if bin_dir not in env.get("PATH", "").split(os.pathsep):
        env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    env.update(extra or {})
    return env


def _is_hydra(mpiexec: str) -> bool:
    """MPICH's hydra takes ``-prepend-rank``; Open MPI's mpiexec takes ``--tag-output``."""
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "HYDRA" in out.stdout.upper()


def mpiexec_command(nranks: int, python_args: Sequence[str], *,
                    output_dir: str | os.PathLike | None = None,
                    guard_dir: str | os.PathLike | None = None, mpi_args: Sequence[str] = ()) -> list[str]:
    """The argv that runs ``python -m mpi4py <python_args>`` on ``nranks`` ranks (``mpi_args``:
    more arguments of mpiexec, such as a virtual cluster's hosts and launcher).

    With ``guard_dir``, each rank runs under :mod:`~workbench.runtime.launch.rankguard`, which
    writes there how it ended, and with ``output_dir`` too, the guard sends the rank's stdout and
    stderr straight to ``output_dir/rank<R>.out`` and ``.err`` (exact text, unlike ``-prepend-rank``,
    which tags per chunk read and can split a traceback mid-word; and nothing lost when a rank's
    MPI_Abort ends the job before the launcher forwarded its last words). With ``output_dir`` alone,
    hydra's ``-outfile-pattern`` writes the same files, or Open MPI's ``--tag-output`` tags the lines.
    """
    integer("nranks", nranks)
    mpiexec = find_mpiexec()
    cmd = [mpiexec, "-n", str(nranks), *mpi_args]
    if guard_dir is not None:
        cmd += [sys.executable, "-I", str(GUARD), str(guard_dir)]
        if output_dir is not None:
            cmd += ["--output", str(output_dir)]
    elif output_dir is not None:
        if _is_hydra(mpiexec):
            cmd += ["-outfile-pattern", f"{output_dir}/rank%r.out",
                    "-errfile-pattern", f"{output_dir}/rank%r.err"]
        else:
            cmd.append("--tag-output")
    return cmd + [sys.executable, "-m", "mpi4py", *python_args]


def srun_command(nranks: int, python_args: Sequence[str], *, srun_args: Sequence[str] = (),
                 guard_dir: str | os.PathLike | None = None, name: str | None = None) -> list[str]:
    """The argv that runs ``python -m mpi4py <python_args>`` as ``nranks`` tasks of a job step
    (inside an allocation; outside one, srun allocates a job itself): see
    :func:`workbench.runtime.launch.slurm.srun_command`. ``name``: the step's (or job's) name,
    by which it is cancelled if srun itself is killed."""
    integer("nranks", nranks)
    cmd = slurm.srun_command(nranks, [*([f"--job-name={name}"] if name else []), *srun_args])
    if guard_dir is not None:
        cmd += [sys.executable, "-I", str(GUARD), str(guard_dir)]
    return cmd + [sys.executable, "-m", "mpi4py", *python_args]


def run_mpi(nranks: int, python_args: Sequence[str], *, timeout: float = 300,
            env: dict[str, str] | None = None, cwd: str | os.PathLike | None = None,
            stream: bool = False, on_interrupt: Callable[[], object] | None = None,
            grace: float = 10.0, launcher: str = "mpiexec", srun_args: Sequence[str] = (),
            mpi_args: Sequence[str] = (), job_dir: str | os.PathLike | None = None,
            heartbeat: str | None = None) -> MPIResult:
    """Run ``python -m mpi4py <python_args>`` on ``nranks`` ranks and wait (at most ``timeout`` s).

    ``launcher``: ``"mpiexec"`` (default, with ``mpi_args``) or ``"srun"`` (a job step of the
    current Slurm allocation, with ``srun_args``).

    ``job_dir``: where the job's own folder goes (each rank's output and how each rank ended, as
    its guard recorded it): a folder every node sees (the run directory, a cluster's shared
    folder) when ranks run on other nodes; default this host's temporary folder.

    ``heartbeat``: an address of this host that the ranks' nodes reach (a virtual cluster's head
    address): each rank's guard then sends heartbeats there (:mod:`.heartbeat`), and a rank silent
    for :data:`~.heartbeat.TIMEOUT` seconds (its node cut off or hung) stops the job with an
    :class:`MPILaunchError` naming that rank and its node, instead of waiting for ``timeout``.

    With ``stream=True`` output is also shown as it comes on this process's stdout/stderr (for
    the CLI); it is captured per rank either way.
    Raises :class:`MPILaunchError` when the job exits non-zero or times out: its message starts
    with the rank whose process ended first and how (``rank 2 on node node7 (pid 4242) was killed by
    signal 9 (SIGKILL)``, or exited with a code, with that rank's traceback if it raised); every
    process of the job is killed on timeout.

    Called from the main thread, SIGINT, SIGTERM and SIGHUP stop the job instead of this process:
    the first calls ``on_interrupt`` (a cooperative cancel, e.g. writing the run's ``CANCEL`` flag)
    and gives the job ``grace`` seconds to end by itself; then, or at once without
    ``on_interrupt`` or at a second signal, every process of the job is terminated (SIGTERM, then
    SIGKILL 3 s later). Then :class:`RunInterrupted` is raised. No process, temporary folder or
    orphaned ``/dev/shm`` segment of the job is left on any path.
    """
    _check_launch(timeout, launcher)
    if job_dir is not None:
        Path(job_dir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="workbench-mpi-", dir=job_dir, ignore_cleanup_errors=True) as tmp:
        status_dir = Path(tmp) / "ranks"
        status_dir.mkdir()
        name = f"workbench-{os.getpid()}-{Path(tmp).name.rsplit('-', 1)[-1]}"  # unique: the temporary folder's
        cmd = _launch_command(launcher, nranks, python_args, tmp, name, srun_args, mpi_args)
        listener = Listener(heartbeat, nranks) if heartbeat else None
        env = {**(env or {}), **(listener.env if listener else {})}
        job = Job(cmd, rank_environment(env), cwd, stream, Path(tmp), status_dir, listener)
        outcome = "failed"  # job.wait itself raised
        try:
            outcome = job.wait(timeout, on_interrupt, grace)
        finally:
            if listener is not None:
                listener.close()
            job.stop(immediate=True, settle=outcome == "exited")  # nothing of the job outlives this call
            if launcher == "srun":
                _stop_steps(status_dir, name, ended_by_itself=outcome == "exited")
            job.finish_output()
        result = collect_output(job.launcher_output(), Path(tmp), nranks, labels=launcher == "srun")
        starts, ends = rank_records(status_dir)
    result.returncode = job.proc.returncode
    _raise_unless_ok(job, outcome, result, nranks, starts, ends, cmd, timeout, launcher)
    return result


def _launch_command(launcher: str, nranks: int, python_args: Sequence[str], job_folder: str, name: str,
                    srun_args: Sequence[str], mpi_args: Sequence[str]) -> list[str]:
    """The job's argv: its ranks' output in ``job_folder`` (mpiexec), their guards' records in
    ``job_folder/ranks``, ``name`` its srun step's (or job's) name."""
    status_dir = Path(job_folder) / "ranks"
    if launcher == "srun":
        return srun_command(nranks, python_args, srun_args=srun_args, guard_dir=status_dir, name=name)
    return mpiexec_command(nranks, python_args, output_dir=job_folder, guard_dir=status_dir, mpi_args=mpi_args)


def _check_launch(timeout: float, launcher: str) -> None:
    """A one-line ValueError for a timeout that is no positive number or an unknown launcher."""
    if not timeout > 0:  # NaN as well
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if launcher not in LAUNCHER_NAMES:
        raise ValueError(f"launcher must be one of {', '.join(LAUNCHER_NAMES)}, got {launcher!r}")


def _raise_unless_ok(job: Job, outcome: str, result: MPIResult, nranks: int, starts: dict, ends: list,
                     cmd: list[str], timeout: float, launcher: str) -> None:
    """After the job: remove what a failed job left in ``/dev/shm``, then raise :class:`RunInterrupted`
    (this process got a signal), or :class:`MPILaunchError` for a rank gone silent (``lost``), the
    timeout or a non-zero exit; return for a job that succeeded."""
    if outcome != "exited" or result.returncode != 0:
        remove_orphaned_shm()
    if job.signals:
        how = "ended by itself" if outcome == "exited" else "was stopped"
        interrupted = RunInterrupted(job.signals[0], f"the MPI job on {nranks} ranks {how}")
        interrupted.hosts = {r: s.get("host") for r, s in starts.items()}  # where each rank ran
        raise interrupted
    if outcome == "lost":
        hosts = {r: s.get("host") for r, s in starts.items()}
        raise MPILaunchError(f"{describe_silent(job.lost, hosts)}; the MPI job on {nranks} ranks was stopped\n"
                             f"{tail(result.output, 20)}", [s["rank"] for s in job.lost], result.output)
    if outcome == "timeout":
        raise MPILaunchError(
            f"MPI job on {nranks} ranks ran past its {timeout:g} s timeout and was killed: "
            f"{' '.join(cmd)}\n{tail(result.output)}", failed_ranks(result), result.output)
    if result.returncode != 0:
        raise failure(nranks, result, starts, ends, abort_kills_all=launcher == "srun", vanished=job.vanished)


def _stop_steps(status_dir: Path, name: str, ended_by_itself: bool, timeout: float = 15.0) -> None:
    """After srun has ended: if it was stopped (a timeout, a signal), cancel what it started, by
    name (its own allocation outside one; its step inside one) and by the steps its ranks' guards
    recorded; then wait until the ranks on this host have ended (the tasks are children of
    slurmstepd, not of srun)."""
    import socket

    import psutil
    if not ended_by_itself:
        steps = []
        if slurm.in_allocation():  # the step of this allocation that srun was running
            steps = slurm.steps_named(os.environ["SLURM_JOB_ID"], name)
        slurm.cancel_named(name)  # the allocation srun made for itself, outside one
        slurm.cancel(steps, signal="KILL")
    starts, ends = rank_records(status_dir)
    ended = {e.get("rank") for e in ends}
    here = socket.gethostname()
    alive = []
    for rank, start in starts.items():
        if rank in ended or start.get("host") != here:
            continue
        for pid in (start.get("guard_pid"), start.get("pid")):
            try:
                if pid is not None:  # psutil.Process(None) would be this process
                    alive.append(psutil.Process(pid))
            except (psutil.NoSuchProcess, TypeError):
                pass
    alive = [p for p in alive if running(p)]
    if not alive:
        return
    steps = sorted({s["slurm_step"] for s in starts.values() if s.get("slurm_step")})
    slurm.cancel(steps, signal="KILL")
    # Slurm ends them (first=None: scancel was the first signal); those it did not end in time are killed
    stop_processes(alive, grace=timeout, first=None)
