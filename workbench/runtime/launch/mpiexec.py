"""The commands that start ranks: ``mpiexec`` (found beside this Python, on ``PATH`` or by
``$WORKBENCH_MPIEXEC``) and ``srun``, each rank ``python -m mpi4py ...`` under its guard, and the ranks'
environment. Ranks run under ``-m mpi4py`` so that an uncaught exception in any rank calls
``MPI_Abort`` and brings the whole job down instead of leaving the others waiting; the guard
(:mod:`.rankguard`) records how each rank ended and writes its output to its own files. Starting,
waiting, stopping and blame: :mod:`.launcher`.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from ...checks import integer
from . import slurm

#: Environment for every rank: one thread each. Two threads per rank on 2 cores made 4 ranks
#: about 50x slower on the development machine.
RANK_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}

#: the parent of every rank, which records how the rank ended (run by path: no package import)
GUARD = Path(__file__).with_name("rankguard.py")

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
