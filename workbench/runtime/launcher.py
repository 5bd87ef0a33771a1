"""Launch Python programs under ``mpiexec``: batch runs, benchmarks and the MPI tests.

Ranks run ``python -m mpi4py ...`` so that an uncaught exception in any rank calls
``MPI_Abort`` and brings the whole job down instead of leaving the others waiting. Each
rank's output is captured separately so a failure can be reported as "rank R failed" with
that rank's traceback. Every launch has a timeout, after which the whole process group
is killed.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

#: Environment for every rank: one thread each. Two threads per rank on 2 cores made 4 ranks
#: about 50x slower on the development machine.
RANK_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


class MPILaunchError(RuntimeError):
    """mpiexec failed, a rank raised, or the job ran past its timeout.

    Attributes: ``failed_ranks`` (ranks that printed a traceback), ``output`` (all output).
    """

    def __init__(self, message: str, failed_ranks: list[int], output: str) -> None:
        super().__init__(message)
        self.failed_ranks = failed_ranks
        self.output = output


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
                    output_dir: str | os.PathLike | None = None) -> list[str]:
    """The argv that runs ``python -m mpi4py <python_args>`` on ``nranks`` ranks.

    With ``output_dir``, each rank's stdout and stderr go to ``output_dir/rank<R>.out`` and
    ``.err`` (hydra's ``-outfile-pattern``; exact text, unlike ``-prepend-rank``, which tags
    per chunk read and can split a traceback mid-word), or are tagged with the rank
    (Open MPI's ``--tag-output``).
    """
    if not isinstance(nranks, int) or isinstance(nranks, bool) or nranks < 1:
        raise ValueError(f"nranks must be an integer >= 1, got {nranks!r}")
    mpiexec = find_mpiexec()
    cmd = [mpiexec, "-n", str(nranks)]
    if output_dir is not None:
        if _is_hydra(mpiexec):
            cmd += ["-outfile-pattern", f"{output_dir}/rank%r.out",
                    "-errfile-pattern", f"{output_dir}/rank%r.err"]
        else:
            cmd.append("--tag-output")
    return cmd + [sys.executable, "-m", "mpi4py", *python_args]


@dataclass
class MPIResult:
    """A finished job: exit code, mpiexec's own output and each rank's output."""

    returncode: int
    output: str  # everything, ranks' outputs each under a "--- rank R ---" header
    ranks: dict[int, str]

    def lines_of(self, rank: int) -> list[str]:
        """Output lines of one rank."""
        return self.ranks.get(rank, "").splitlines()


_TAG = re.compile(r"^\[(?:1,)?(\d+)\](?:<std(?:out|err)>)?:?\s?(.*)$")
_MPICH_ABORT = re.compile(r"Abort\(\d+\) on node \d+ \(rank (\d+) in comm")


def _collect(launcher_output: str, output_dir: Path, nranks: int) -> MPIResult:
    ranks: dict[int, list[str]] = {}
    rest = []
    for line in launcher_output.splitlines():  # Open MPI --tag-output lines
        m = _TAG.match(line)
        if m:
            ranks.setdefault(int(m.group(1)), []).append(m.group(2))
        else:
            rest.append(line)
    for r in range(nranks):  # hydra per-rank files
        for suffix in ("out", "err"):
            path = output_dir / f"rank{r}.{suffix}"
            if path.exists():
                ranks.setdefault(r, []).extend(path.read_text(errors="replace").splitlines())
    texts = {r: "\n".join(lines) for r, lines in sorted(ranks.items())}
    combined = "\n".join(rest + [f"--- rank {r} ---\n{t}" for r, t in texts.items()])
    return MPIResult(0, combined, texts)


def failed_ranks(result: MPIResult) -> list[int]:
    """Ranks that printed a Python traceback or that MPICH reports as aborting."""
    return [r for r, text in result.ranks.items()
            if "Traceback (most recent call last)" in text or _MPICH_ABORT.search(text)]


def run_mpi(nranks: int, python_args: Sequence[str], *, timeout: float = 300,
            env: dict[str, str] | None = None, cwd: str | os.PathLike | None = None,
            stream: bool = False) -> MPIResult:
    """Run ``python -m mpi4py <python_args>`` on ``nranks`` ranks and wait (at most ``timeout`` s).

    With ``stream=True`` output goes straight to this process's stdout/stderr (for the CLI);
    otherwise each rank's output is captured and returned.
    Raises :class:`MPILaunchError` naming the failed ranks, with their tracebacks, when the
    job exits non-zero or times out; the whole process group is killed on timeout.
    """
    with tempfile.TemporaryDirectory(prefix="workbench-mpi-") as tmp:
        cmd = mpiexec_command(nranks, python_args, output_dir=None if stream else tmp)
        pipe = None if stream else subprocess.PIPE
        proc = subprocess.Popen(cmd, stdout=pipe, stderr=subprocess.STDOUT if pipe else None,
                                text=True, env=rank_environment(env), cwd=cwd,
                                start_new_session=True)
        timed_out = False
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            _wait_group_gone(proc.pid)  # ranks die after mpiexec; their segments with them
            timed_out = True
        result = _collect(out or "", Path(tmp), nranks)
    result.returncode = proc.returncode
    if timed_out or proc.returncode != 0:
        remove_orphaned_shm()
    ranks = failed_ranks(result)
    if timed_out:
        raise MPILaunchError(
            f"MPI job on {nranks} ranks ran past its {timeout:g} s timeout and was killed: "
            f"{' '.join(cmd)}\n{_tail(result.output)}", ranks, result.output)
    if proc.returncode != 0:
        who = f"rank(s) {', '.join(map(str, ranks))} failed" if ranks else "the job failed"
        detail = "\n".join(_traceback_of(result, r) for r in ranks) or _tail(result.output)
        raise MPILaunchError(f"MPI job on {nranks} ranks exited with code {proc.returncode}: "
                             f"{who}\n{detail}", ranks, result.output)
    return result


def _wait_group_gone(pgid: int, timeout: float = 10.0) -> None:
    """Wait until no process of group ``pgid`` is left (SIGKILL is delivered asynchronously)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.05)


def remove_orphaned_shm(shm_dir: str | os.PathLike = "/dev/shm") -> list[str]:
    """Delete MPICH shared-memory segments that no live process has mapped; return their names.

    A job that aborts or is killed leaves its ``mpich_shm_*`` files behind (about 4 MB each,
    held in RAM). A segment still mapped by any process belongs to a running job and is kept.
    """
    shm_dir = Path(shm_dir)
    candidates = {p.name: p for p in shm_dir.glob("mpich_shm_*")}
    if not candidates:
        return []
    in_use = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:  # the process ended, or is not ours to read
            continue
        in_use.update(name for name in candidates if name in text)
    removed = []
    for name, path in candidates.items():
        if name not in in_use:
            path.unlink(missing_ok=True)
            removed.append(name)
    return removed


def _tail(text: str, lines: int = 60) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _traceback_of(result: MPIResult, rank: int) -> str:
    lines = result.lines_of(rank)
    tracebacks = [i for i, line in enumerate(lines) if line.startswith("Traceback")]
    aborts = [i for i, line in enumerate(lines) if _MPICH_ABORT.search(line)]
    start = (tracebacks or aborts or [0])[0]
    return f"--- rank {rank} ---\n" + "\n".join(lines[start:start + 60])
