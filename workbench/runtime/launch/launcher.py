"""How ranks start, as one protocol: a :class:`Launcher` starts a job's ranks, waits for it, passes a
signal on, stops every process of it, and says where its ranks' records are (how each rank started and
ended, as its guard recorded it: :mod:`.rankguard`) and whether an abort ends every rank at once (what
blame must know: :func:`~.blame.first_cause`). The backends (ipyparallel's ``BaseLauncher`` has the same
shape: start, stop, signal, one class per batch system):

- :class:`Mpiexec`: ``mpiexec -n N`` on this machine, or on the nodes of a virtual cluster (its hosts,
  remote launcher and heartbeat address: :meth:`~workbench.vcluster.VirtualCluster.run_options`);
- :class:`Srun`: a job step of the current Slurm allocation (``srun -n N --label``);
- the notebook's engines: :class:`workbench.runtime.client.engines.Engines` (ranks that are ipyparallel
  engines under the same guard; started once, reused by each run).

:func:`run_mpi` runs a program on a batch backend and waits: the one path ``workbench train``, the
benchmarks and the MPI tests take. Where the backends differ (the command, how output is told apart,
what an abort does, what is left to cancel) is said in the backend, not by branches in the callers.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable, Sequence

from . import slurm
from .blame import MPILaunchError, MPIResult, collect_output, ended_badly, failed_ranks, failure, rank_records, tail
from .heartbeat import Listener, describe as describe_silent
from .job import Job
from ...mpilib import FLAVOURS, check_pairing, find_mpiexec, flavour_of, rank_library
from .mpiexec import mpiexec_command, rank_environment, srun_command
from .leftovers import remove_leftovers
from .signals import RunInterrupted


class Launcher:
    """The protocol every way of starting ranks follows (see the module's text).

    ``abort_kills_all``: the launcher answers one rank's ``MPI_Abort`` by killing every rank at once
    (srun SIGKILLs every task, a Slurm engine job is cancelled whole), so the order of the ranks'
    signals says nothing about which rank caused the end: blame takes the first end instead."""

    #: the word for this launcher in messages
    name = "launcher"
    abort_kills_all = False

    @property
    def stop_signals(self) -> frozenset[int]:
        """The signals this launcher sends the other ranks itself when one ends (Open MPI's prterun:
        SIGTERM): blame counts a rank ended by one as a consequence (:func:`~.blame.first_cause`)."""
        flavour = getattr(self, "flavour", None)
        return flavour.stop_signals if flavour is not None else frozenset()

    def start(self) -> None:
        """Start the ranks (returns at once)."""
        raise NotImplementedError

    def wait(self, timeout: float, on_interrupt: Callable[[], object] | None = None, grace: float = 10.0) -> str:
        """Wait at most ``timeout`` seconds for the ranks to end; the outcome: ``exited``, ``interrupted``,
        ``lost`` (a rank's heartbeats stopped) or ``timeout``."""
        raise NotImplementedError

    def signal(self, signum: int) -> None:
        """Pass ``signum`` to the job (its launcher passes it to every rank)."""
        raise NotImplementedError

    def stop(self, immediate: bool = False) -> None:
        """End every process of the job and what it left (no rank, step or shared-memory segment stays)."""
        raise NotImplementedError

    def records(self) -> tuple[dict[int, dict], list[dict]]:
        """The ranks' guard records: ``(starts by rank, ends first first)`` (:func:`~.blame.rank_records`)."""
        raise NotImplementedError


class JobLauncher(Launcher):
    """A batch job of ``nranks`` ranks running ``python -m mpi4py <python_args>`` under the rank guard,
    its own folder (each rank's output, the guards' records) under ``job_dir`` (default this host's
    temporary folder; ranks on other nodes need one they see). ``heartbeat``: an address of this host
    the ranks' nodes reach; a rank silent for :data:`~.heartbeat.TIMEOUT` s ends the wait as ``lost``.
    ``stream``: the output is also shown as it comes (the CLI). ``survive``: ranks whose loss the job goes on
    without (a master-based run's workers, ``min_ranks``), where the backend and its library can
    (:attr:`survivable`)."""

    #: srun labels each line with its task; mpiexec's ranks' guards write per-rank files
    labelled_output = False
    #: the MPI library's ways (:mod:`workbench.mpilib`), where the backend knows it; blame reads them
    flavour = None

    def __init__(self, nranks: int, python_args: Sequence[str], *, env: dict[str, str] | None = None,
                 cwd: str | os.PathLike | None = None, stream: bool = False,
                 job_dir: str | os.PathLike | None = None, heartbeat: str | None = None, survive=()) -> None:
        self.nranks, self.python_args = nranks, list(python_args)
        self.survive = frozenset(survive)
        self.env, self.cwd, self.stream, self.heartbeat = dict(env or {}), cwd, stream, heartbeat
        self.job_dir = Path(job_dir) if job_dir is not None else None
        self.job: Job | None = None
        self.outcome: str | None = None
        self.cmd: list[str] = []

    def command(self, folder: Path, name: str) -> list[str]:
        """The job's argv: its ranks' output in ``folder``, their guards' records in ``folder/ranks``,
        ``name`` the job's name (by which a batch system's part of it is found again)."""
        raise NotImplementedError

    @property
    def survivable(self) -> frozenset[int]:
        """The ranks of :attr:`survive` whose loss this job goes on without: none unless the backend starts the
        job so (:meth:`~workbench.mpilib.MPIFlavour.survivors_args`)."""
        return frozenset()

    def start(self) -> None:
        if self.job_dir is not None:
            self.job_dir.mkdir(parents=True, exist_ok=True)
        self._tmp = tempfile.TemporaryDirectory(prefix="workbench-mpi-", dir=self.job_dir, ignore_cleanup_errors=True)
        self.folder = Path(self._tmp.name)
        self.status_dir = self.folder / "ranks"
        self.listener = None
        try:
            self.status_dir.mkdir()
            self.job_name = f"workbench-{os.getpid()}-{self.folder.name.rsplit('-', 1)[-1]}"  # unique: the folder's
            self.cmd = self.command(self.folder, self.job_name)
            self.listener = Listener(self.heartbeat, self.nranks) if self.heartbeat else None
            env = {**self.env, **(self.listener.env if self.listener else {})}
            self.job = Job(self.cmd, rank_environment(env), self.cwd, self.stream, self.folder, self.status_dir,
                           self.listener)
        except BaseException:
            if self.listener is not None:
                self.listener.close()
            self._close()
            raise

    def wait(self, timeout: float, on_interrupt: Callable[[], object] | None = None, grace: float = 10.0) -> str:
        """As :meth:`Launcher.wait`; SIGINT, SIGTERM and SIGHUP to this process (from the main thread) first
        call ``on_interrupt`` (a cooperative cancel) and give the job ``grace`` s, then stop it."""
        self.outcome = "failed"  # the wait itself raised
        self.outcome = self.job.wait(timeout, on_interrupt, grace)
        return self.outcome

    def signal(self, signum: int) -> None:
        if self.job is not None and self.job.proc.poll() is None:
            self.job.proc.send_signal(signum)

    def stop(self, immediate: bool = True) -> None:
        """End every process of the job (after a job that ended by itself, the guards get time to record
        first), then what a backend leaves elsewhere (:meth:`left_behind`); the output is complete after."""
        try:
            if self.listener is not None:
                self.listener.close()
            self.job.stop(immediate=immediate, settle=self.outcome == "exited")
            self.left_behind(ended_by_itself=self.outcome == "exited")
            self.job.finish_output()
        finally:
            self.result = collect_output(self.job.launcher_output(), self.folder, self.nranks,
                                         labels=self.labelled_output)
            self.result.returncode = self.job.proc.returncode
            self.starts, self.ends = self.records()
            self._close()

    def left_behind(self, ended_by_itself: bool) -> None:
        """What the backend must end beyond the launcher's processes (srun: the job step)."""

    def records(self) -> tuple[dict[int, dict], list[dict]]:
        return rank_records(self.status_dir)

    def _close(self) -> None:
        self._tmp.cleanup()

    def raise_unless_ok(self, timeout: float) -> MPIResult:
        """After :meth:`stop`: remove what a failed job left in ``/dev/shm``, then raise
        :class:`RunInterrupted` (this process got a signal), or :class:`MPILaunchError` for a rank gone
        silent, the timeout or a non-zero exit (blaming the rank that ended first); the result otherwise."""
        job, result, outcome, nranks = self.job, self.result, self.outcome, self.nranks
        if outcome != "exited" or result.returncode != 0:
            remove_leftovers()
        if job.signals:
            how = "ended by itself" if outcome == "exited" else "was stopped"
            interrupted = RunInterrupted(job.signals[0], f"the MPI job on {nranks} ranks {how}")
            interrupted.hosts = {r: s.get("host") for r, s in self.starts.items()}  # where each rank ran
            raise interrupted
        if outcome == "lost":
            hosts = {r: s.get("host") for r, s in self.starts.items()}
            raise MPILaunchError(f"{describe_silent(job.lost, hosts)}; the MPI job on {nranks} ranks was stopped\n"
                                 f"{tail(result.output, 20)}", [s["rank"] for s in job.lost], result.output)
        if outcome == "timeout":
            raise MPILaunchError(
                f"MPI job on {nranks} ranks ran past its {timeout:g} s timeout and was killed: "
                f"{' '.join(self.cmd)}\n{tail(result.output)}", failed_ranks(result), result.output)
        # a launcher that exits 0 while a rank ended badly, or was ended by its guard when the launcher's
        # process on its node died (seen with Open MPI's prterun after a prted was killed), failed all the same
        broken = [e for e in self.ends if ended_badly(e) or e.get("launcher_died")]
        # a rank the job went on without (survive), in a job that then ended well, is a loss the run recorded
        survived = [e for e in broken if e.get("rank") in self.survivable] \
            if result.returncode == 0 and outcome == "exited" else []
        broken = [e for e in broken if e not in survived]
        result.survived = [{**self.starts.get(e["rank"], {}), **e} for e in survived]  # with its host and pid
        if result.returncode != 0 or outcome == "abandoned" or broken:
            raise failure(nranks, result, self.starts, self.ends, abort_kills_all=self.abort_kills_all,
                          vanished=job.vanished, flavour=self.flavour, launcher_signals=self.stop_signals)
        return result


class Mpiexec(JobLauncher):
    """``mpiexec -n N [mpi_args]`` (``mpi_args``: e.g. a virtual cluster's hosts and remote launcher);
    each rank's guard writes the rank's output to its own files. Whatever the library (MPICH, Open MPI,
    Intel MPI): what differs is its :attr:`flavour` (:mod:`workbench.mpilib`), asked of the ``mpiexec`` found, and
    checked against the library mpi4py loads before anything starts (:func:`~workbench.mpilib.check_pairing`)."""

    name = "mpiexec"

    def __init__(self, nranks: int, python_args: Sequence[str], *, mpi_args: Sequence[str] = (),
                 network: Sequence[str] | None = None, **options) -> None:
        super().__init__(nranks, python_args, **options)
        self.mpi_args = list(mpi_args)
        self.network = None if network is None else list(network)  # what starts mpiexec in its network
        self.flavour = flavour_of(find_mpiexec())
        check_pairing(self.flavour)

    @property
    def survivable(self) -> frozenset[int]:
        return self.survive if self.survive and self.flavour.survivors_args() else frozenset()

    def command(self, folder: Path, name: str) -> list[str]:
        keep_going = self.flavour.survivors_args() if self.survivable else []
        return mpiexec_command(self.nranks, self.python_args, output_dir=folder, guard_dir=folder / "ranks",
                               mpi_args=[*keep_going, *self.mpi_args], network=self.network)


class Srun(JobLauncher):
    """``srun -n N --kill-on-bad-exit=1 --label [srun_args]``: a job step of the current Slurm allocation
    (outside one, srun allocates a job itself). Output is told apart by srun's labels (they work across
    nodes); an abort makes srun SIGKILL every task; a stopped srun leaves its step to cancel."""

    name = "srun"
    abort_kills_all = True
    labelled_output = True

    def __init__(self, nranks: int, python_args: Sequence[str], *, srun_args: Sequence[str] = (), **options) -> None:
        super().__init__(nranks, python_args, **options)
        self.srun_args = list(srun_args)
        # no mpiexec: the ranks' library is the one mpi4py loads (its abort line is what blame reads)
        library = rank_library().get("flavour")
        self.flavour = FLAVOURS[library]() if library else None

    @property
    def stop_signals(self) -> frozenset[int]:
        """Slurm, not the library's launcher, ends the other tasks (SIGKILL: :attr:`abort_kills_all`)."""
        return frozenset()

    def command(self, folder: Path, name: str) -> list[str]:
        return srun_command(self.nranks, self.python_args, srun_args=self.srun_args, guard_dir=folder / "ranks",
                            name=name)

    def left_behind(self, ended_by_itself: bool, timeout: float = 15.0) -> None:
        """After srun has ended: if it was stopped (a timeout, a signal), cancel what it started, by
        name (its own allocation outside one; its step inside one) and by the steps its ranks' guards
        recorded; then wait until the ranks on this host have ended (the tasks are children of
        slurmstepd, not of srun)."""
        import socket

        import psutil

        from ..processes import alive as running, stop_processes
        if not ended_by_itself:
            steps = []
            if slurm.in_allocation():  # the step of this allocation that srun was running
                steps = slurm.steps_named(os.environ["SLURM_JOB_ID"], self.job_name)
            slurm.cancel_named(self.job_name)  # the allocation srun made for itself, outside one
            slurm.cancel(steps, signal="KILL")
        starts, ends = self.records()
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


#: the batch backends by the name ``launcher=`` takes
BACKENDS: dict[str, type[JobLauncher]] = {"mpiexec": Mpiexec, "srun": Srun}
#: how ranks can be started in a batch run: mpiexec on this machine, or srun inside a Slurm allocation
LAUNCHER_NAMES = tuple(BACKENDS)


def batch_launcher(launcher: str, nranks: int, python_args: Sequence[str], *, srun_args: Sequence[str] = (),
                   mpi_args: Sequence[str] = (), network: Sequence[str] | None = None, **options) -> JobLauncher:
    """The backend ``launcher`` names (``mpiexec`` with ``mpi_args``, ``srun`` with ``srun_args``); a
    one-line ValueError for another name or arguments of the other backend."""
    if launcher not in BACKENDS:
        raise ValueError(f"launcher must be one of {', '.join(LAUNCHER_NAMES)}, got {launcher!r}")
    if launcher == "srun":
        if mpi_args:
            raise ValueError("mpi_args are mpiexec's arguments; srun takes srun_args")
        return Srun(nranks, python_args, srun_args=srun_args, **options)
    if srun_args:
        raise ValueError("srun_args are srun's arguments; mpiexec takes mpi_args")
    return Mpiexec(nranks, python_args, mpi_args=mpi_args, network=network, **options)


def run_mpi(nranks: int, python_args: Sequence[str], *, timeout: float = 300,
            env: dict[str, str] | None = None, cwd: str | os.PathLike | None = None,
            stream: bool = False, on_interrupt: Callable[[], object] | None = None,
            grace: float = 10.0, launcher: str = "mpiexec", srun_args: Sequence[str] = (),
            mpi_args: Sequence[str] = (), job_dir: str | os.PathLike | None = None,
            heartbeat: str | None = None, network: Sequence[str] | None = None, survive=()) -> MPIResult:
    """Run ``python -m mpi4py <python_args>`` on ``nranks`` ranks and wait (at most ``timeout`` s).

    ``launcher``: ``"mpiexec"`` (:class:`Mpiexec`, with ``mpi_args``) or ``"srun"`` (:class:`Srun`, a job
    step of the current Slurm allocation, with ``srun_args``). ``job_dir``, ``heartbeat``, ``stream``,
    ``env``, ``cwd``: as :class:`JobLauncher` takes them (a virtual cluster's
    :meth:`~workbench.vcluster.VirtualCluster.run_options` gives ``mpi_args``, ``env``, ``job_dir``,
    ``heartbeat`` and ``network``, what starts mpiexec in the cluster's launcher network). ``survive``: ranks
    whose loss the job goes on without where the library can (:attr:`JobLauncher.survivable`); the result's
    ``survived`` then holds the end records of those it lost.

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
    if not timeout > 0:  # NaN as well
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    backend = batch_launcher(launcher, nranks, python_args, srun_args=srun_args, mpi_args=mpi_args, env=env,
                             cwd=cwd, stream=stream, job_dir=job_dir, heartbeat=heartbeat, network=network,
                             survive=survive)
    backend.start()
    try:
        backend.wait(timeout, on_interrupt, grace)
    finally:
        backend.stop(immediate=True)  # nothing of the job outlives this call
    return backend.raise_unless_ok(timeout)


__all__ = ["BACKENDS", "JobLauncher", "LAUNCHER_NAMES", "Launcher", "Mpiexec", "Srun", "MPILaunchError", "batch_launcher", "run_mpi"]
