"""The commands that start ranks: ``mpiexec`` (found beside this Python, on ``PATH`` or by
``$WORKBENCH_MPIEXEC``) and ``srun``, each rank ``python -m mpi4py ...`` under its guard, and the ranks'
environment. Ranks run under ``-m mpi4py`` so that an uncaught exception in any rank calls
``MPI_Abort`` and brings the whole job down instead of leaving the others waiting; the guard
(:mod:`.rankguard`) records how each rank ended and writes its output to its own files. Starting,
waiting, stopping and blame: :mod:`.launcher`.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Sequence

from ...checks import integer
from ...mpilib import find_mpiexec, flavour_of
from . import private_net, slurm

#: Environment for every rank: one thread each. Two threads per rank on 2 cores made 4 ranks
#: about 50x slower on the development machine.
RANK_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}

#: the parent of every rank, which records how the rank ended (run by path: no package import)
GUARD = Path(__file__).with_name("rankguard.py")

def default_launcher() -> str:
    """``srun`` inside a Slurm allocation (``SLURM_JOB_ID`` set), else ``mpiexec``."""
    return "srun" if slurm.in_allocation() else "mpiexec"


def rank_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for ranks: this one, one thread per rank, this Python's bin on PATH."""
    env = dict(os.environ)
    env.update(RANK_ENV)
    bin_dir = str(Path(sys.executable).parent)
    if bin_dir not in env.get("PATH", "").split(os.pathsep):
        env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    env.update(extra or {})
    return env


def mpiexec_command(nranks: int, python_args: Sequence[str], *,
                    output_dir: str | os.PathLike | None = None,
                    guard_dir: str | os.PathLike | None = None, mpi_args: Sequence[str] = (),
                    network: Sequence[str] | None = None) -> list[str]:
    """The argv that runs ``python -m mpi4py <python_args>`` on ``nranks`` ranks (``mpi_args``:
    more arguments of mpiexec, such as a virtual cluster's hosts and launcher).

    With ``guard_dir``, each rank runs under :mod:`~workbench.runtime.launch.rankguard`, which
    writes there how it ended, and with ``output_dir`` too, the guard sends the rank's stdout and
    stderr straight to ``output_dir/rank<R>.out`` and ``.err`` (exact text, unlike ``-prepend-rank``,
    which tags per chunk read and can split a traceback mid-word; and nothing lost when a rank's
    MPI_Abort ends the job before the launcher forwarded its last words). With ``output_dir`` alone,
    the library writes the same files (:meth:`~workbench.mpilib.MPIFlavour.output_args`). What the library needs
    to start the ranks here (Open MPI as root, more ranks than cores) comes from its flavour
    (:meth:`~workbench.mpilib.MPIFlavour.start_args`). A job on this host alone starts in a network of
    its own (:mod:`.private_net`); ``network``: what starts mpiexec in the network of a job across nodes
    (a virtual cluster's launcher network, :meth:`~workbench.vcluster.VirtualCluster.launcher_network`).
    """
    integer("nranks", nranks)
    mpiexec = find_mpiexec()
    mpi = flavour_of(mpiexec)
    # a job on this host alone runs in a network of its own: nothing it listens on is reachable by others
    if network is None:
        network = [] if mpi.on_hosts(mpi_args) else private_net.prefix()
    cmd = [*network, mpiexec, "-n", str(nranks), *mpi.start_args(nranks, placed=mpi.placed(mpi_args)), *mpi_args]
    if guard_dir is not None:
        cmd += [sys.executable, "-I", str(GUARD), str(guard_dir)]
        if output_dir is not None:
            cmd += ["--output", str(output_dir)]
    elif output_dir is not None:
        cmd += mpi.output_args(str(output_dir))
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
