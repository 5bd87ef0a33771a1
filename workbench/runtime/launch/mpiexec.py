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

import codecs
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

from ...checks import integer
from . import slurm
from .blame import MPILaunchError, MPIResult, collect_output, failed_ranks, failure, rank_records, tail
from .shm import remove_orphaned_shm
from .signals import RunInterrupted, handling_signals

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
                    guard_dir: str | os.PathLike | None = None) -> list[str]:
    """The argv that runs ``python -m mpi4py <python_args>`` on ``nranks`` ranks.

    With ``output_dir``, each rank's stdout and stderr go to ``output_dir/rank<R>.out`` and
    ``.err`` (hydra's ``-outfile-pattern``; exact text, unlike ``-prepend-rank``, which tags
    per chunk read and can split a traceback mid-word), or are tagged with the rank
    (Open MPI's ``--tag-output``). With ``guard_dir``, each rank runs under
    :mod:`~workbench.runtime.launch.rankguard`, which writes there how it ended.
    """
    integer("nranks", nranks)
    mpiexec = find_mpiexec()
    cmd = [mpiexec, "-n", str(nranks)]
    if output_dir is not None:
        if _is_hydra(mpiexec):
            cmd += ["-outfile-pattern", f"{output_dir}/rank%r.out",
                    "-errfile-pattern", f"{output_dir}/rank%r.err"]
        else:
            cmd.append("--tag-output")
    if guard_dir is not None:
        cmd += [sys.executable, "-I", str(GUARD), str(guard_dir)]
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
            grace: float = 10.0, launcher: str = "mpiexec", srun_args: Sequence[str] = ()) -> MPIResult:
    """Run ``python -m mpi4py <python_args>`` on ``nranks`` ranks and wait (at most ``timeout`` s).

    ``launcher``: ``"mpiexec"`` (default) or ``"srun"`` (a job step of the current Slurm
    allocation, with ``srun_args``).

    With ``stream=True`` output is also shown as it comes on this process's stdout/stderr (for
    the CLI); it is captured per rank either way.
    Raises :class:`MPILaunchError` when the job exits non-zero or times out: its message starts
    with the rank whose process ended first and how (``rank 2 (pid 4242 on node7) was killed by
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
    if launcher not in LAUNCHER_NAMES:
        raise ValueError(f"launcher must be one of {', '.join(LAUNCHER_NAMES)}, got {launcher!r}")
    with tempfile.TemporaryDirectory(prefix="workbench-mpi-", ignore_cleanup_errors=True) as tmp:
        status_dir = Path(tmp) / "ranks"
        status_dir.mkdir()
        name = f"workbench-{os.getpid()}-{Path(tmp).name.rsplit('-', 1)[-1]}"  # unique: the temporary folder's
        if launcher == "srun":
            cmd = srun_command(nranks, python_args, srun_args=srun_args, guard_dir=status_dir, name=name)
        else:
            cmd = mpiexec_command(nranks, python_args, output_dir=tmp, guard_dir=status_dir)
        job = _Job(cmd, rank_environment(env), cwd, stream, Path(tmp), status_dir)
        outcome = "failed"  # job.wait itself raised
        try:
            outcome = job.wait(timeout, on_interrupt, grace)
        finally:
            job.stop(immediate=True)  # nothing of the job outlives this call, whatever happened
            if launcher == "srun":
                _stop_steps(status_dir, name, ended_by_itself=outcome == "exited")
            job.finish_output()
        result = collect_output(job.launcher_output(), Path(tmp), nranks, labels=launcher == "srun")
        starts, ends = rank_records(status_dir)
    result.returncode = job.proc.returncode
    if outcome != "exited" or result.returncode != 0:
        remove_orphaned_shm()
    if job.signals:
        how = "ended by itself" if outcome == "exited" else "was stopped"
        raise RunInterrupted(job.signals[0], f"the MPI job on {nranks} ranks {how}")
    if outcome == "timeout":
        raise MPILaunchError(
            f"MPI job on {nranks} ranks ran past its {timeout:g} s timeout and was killed: "
            f"{' '.join(cmd)}\n{tail(result.output)}", failed_ranks(result), result.output)
    if result.returncode != 0:
        raise failure(nranks, result, starts, ends, abort_kills_all=launcher == "srun")
    return result


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
                alive.append(psutil.Process(pid))
            except (psutil.NoSuchProcess, TypeError):
                pass
    alive = [p for p in alive if _running(p)]
    if not alive:
        return
    steps = sorted({s["slurm_step"] for s in starts.values() if s.get("slurm_step")})
    slurm.cancel(steps, signal="KILL")
    deadline = time.monotonic() + timeout
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if _running(p)]
    for p in alive:  # not ours to keep: Slurm did not end them in time
        try:
            p.kill()
        except Exception:  # noqa: BLE001 - gone
            pass


class _Job:
    """One ``mpiexec``: its output (captured, and echoed when streaming), the processes under it,
    the signals this process got while it ran, and stopping all of it."""

    POLL = 0.05  # seconds between two looks at the job
    TERM_GRACE = 3.0  # seconds from SIGTERM to SIGKILL when stopping

    def __init__(self, cmd: list[str], env: dict[str, str], cwd, stream: bool, tmp: Path,
                 status_dir: Path) -> None:
        self.stream, self.tmp, self.status_dir = stream, tmp, status_dir
        self.signals: list[int] = []
        self._chunks: list[str] = []
        self._lock = threading.Lock()
        self._echo_broken = False
        self._offsets: dict[Path, int] = {}
        self._decoders: dict[Path, object] = {}
        self._known: dict[int, object] = {}  # pid -> psutil.Process of the job's processes
        self._starts_seen = 0
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE if stream else subprocess.STDOUT,
            encoding="utf-8", errors="replace", env=env, cwd=cwd, start_new_session=True)
        pipes = [(self.proc.stdout, sys.stdout)] + ([(self.proc.stderr, sys.stderr)] if stream else [])
        self._readers = [threading.Thread(target=self._pump, args=(pipe, echo), daemon=True)
                         for pipe, echo in pipes]
        for reader in self._readers:
            reader.start()

    # -- output ----------------------------------------------------------------------------
    def _echo(self, stream, text: str) -> None:
        if not self.stream or self._echo_broken or not text:
            return
        try:
            stream.write(text)
            stream.flush()
        except (OSError, ValueError):  # the terminal is gone (SIGHUP) or stdout was closed
            self._echo_broken = True

    def _pump(self, pipe, echo) -> None:
        for line in pipe:
            with self._lock:
                self._chunks.append(line)
                self._echo(echo, line)

    def _follow(self, final: bool = False) -> None:
        """Show what the ranks wrote to their output files since the last look."""
        if not self.stream:
            return
        for path in sorted(self.tmp.glob("rank*.out")) + sorted(self.tmp.glob("rank*.err")):
            try:
                with open(path, "rb") as f:
                    f.seek(self._offsets.get(path, 0))
                    data = f.read()
            except OSError:
                continue
            self._offsets[path] = self._offsets.get(path, 0) + len(data)
            decoder = self._decoders.setdefault(path, codecs.getincrementaldecoder("utf-8")("replace"))
            text = decoder.decode(data, final=final)
            with self._lock:
                self._echo(sys.stdout if path.suffix == ".out" else sys.stderr, text)

    def finish_output(self) -> None:
        for reader in self._readers:
            reader.join(timeout=5)  # at EOF: every process that held mpiexec's output has ended
        for pipe, reader in zip((self.proc.stdout, self.proc.stderr), self._readers):
            if pipe is not None and not reader.is_alive():
                pipe.close()
        self._follow(final=True)

    def launcher_output(self) -> str:
        with self._lock:
            return "".join(self._chunks)

    # -- waiting ---------------------------------------------------------------------------
    def _on_signal(self, signum: int, frame) -> None:
        self.signals.append(signum)

    def wait(self, timeout: float, on_interrupt, grace: float) -> str:
        """Wait until mpiexec ends: ``exited`` (by itself, after a signal or not), ``interrupted``
        (stopped after a signal) or ``timeout`` (killed)."""
        deadline = time.monotonic() + timeout
        stop_at = None
        with handling_signals(self._on_signal):
            while self.proc.poll() is None:
                now = time.monotonic()
                if self.signals and stop_at is None:
                    stop_at = now
                    if on_interrupt is not None:
                        try:
                            on_interrupt()
                            stop_at = now + max(0.0, grace)
                        except Exception:  # noqa: BLE001 - cannot ask nicely: stop it
                            pass
                if stop_at is not None and (now >= stop_at or len(self.signals) > 1):
                    self.stop(immediate=len(self.signals) > 1)
                    return "interrupted"
                if now >= deadline:
                    self.stop(immediate=True)
                    return "timeout"
                self._remember_processes()
                self._follow()
                time.sleep(self.POLL)
        return "exited"

    def _remember_processes(self, force: bool = False) -> None:
        """Note mpiexec's descendants (each rank runs in its own session, so a process group
        does not hold them): looked at again whenever another rank has started."""
        starts = len(list(self.status_dir.glob("*.start")))
        if not force and starts == self._starts_seen and self._known:
            return
        self._starts_seen = starts
        try:
            import psutil
            root = psutil.Process(self.proc.pid)
            for p in [root, *root.children(recursive=True)]:
                self._known.setdefault(p.pid, p)
        except Exception:  # noqa: BLE001 - psutil missing, or mpiexec just ended
            pass

    def stop(self, immediate: bool = False) -> None:
        """End every process of the job: SIGTERM (mpiexec passes it on, each rank's guard too),
        SIGKILL after ``TERM_GRACE`` s, at once with ``immediate`` or when another signal comes."""
        if self.proc.poll() is None:
            self._remember_processes(force=True)
        alive = [p for p in self._known.values() if _running(p)]
        if not alive and self.proc.poll() is not None:
            return
        signals_before = len(self.signals)
        if not immediate:
            _send(alive, signal.SIGTERM, self.proc)
            end = time.monotonic() + self.TERM_GRACE
            while time.monotonic() < end and len(self.signals) == signals_before:
                self.proc.poll()
                alive = [p for p in alive if _running(p)]
                if not alive and self.proc.poll() is not None:
                    return
                time.sleep(self.POLL)
        _send([p for p in alive if _running(p)], signal.SIGKILL, self.proc)
        end = time.monotonic() + 10
        while time.monotonic() < end:
            self.proc.poll()  # reap mpiexec: a zombie would look alive
            if self.proc.returncode is not None and not any(_running(p) for p in self._known.values()):
                return
            time.sleep(self.POLL)


def _running(process) -> bool:
    try:
        import psutil
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except Exception:  # noqa: BLE001 - gone
        return False


def _send(processes, signum: int, proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            proc.send_signal(signum)
        except OSError:
            pass
    for p in processes:
        try:
            p.send_signal(signum)  # psutil checks that the pid was not reused
        except Exception:  # noqa: BLE001 - it ended meanwhile
            pass


