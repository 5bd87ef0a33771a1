"""Engine launchers by name: how ``wb.Cluster(engines=...)`` starts its MPI ranks.

``mpi`` is a local ``mpiexec``; the batch systems start the engines as one batch job through
ipyparallel's launchers (``<Prefix>EngineSetLauncher``).
"""
from __future__ import annotations

import os
import shlex
import subprocess

from .slurm import KILL_ON_BAD_EXIT

#: engine launchers that start MPI ranks: name -> ipyparallel launcher class prefix
LAUNCHERS = {"mpi": "MPI", "slurm": "Slurm", "pbs": "PBS", "sge": "SGE", "lsf": "LSF"}

#: the engines' srun: every task killed when one fails; the user's srun_args come after it
SRUN_DEFAULTS = [KILL_ON_BAD_EXIT]


class SlurmCommandError(RuntimeError):
    """``sbatch`` or ``scancel`` failed; the message holds what it printed."""


def slurm_launcher():
    """ipyparallel's Slurm engine launcher class, with extra ``#SBATCH`` options, ``srun``
    arguments, and its files in the cluster's own folder."""
    from ipyparallel.cluster.launcher import SlurmEngineSetLauncher
    from traitlets import List, Unicode

    class SlurmMPIEngineSetLauncher(SlurmEngineSetLauncher):
        """ipyparallel's Slurm engine launcher, plus:

        - ``options``: extra ``#SBATCH`` lines (``--gres``, ``--constraint``, ...) inserted after
          the shebang like account and time;
        - ``srun_args``: arguments of the engines' ``srun`` (``--mpi=pmi2``);
        - ``state_folder``: where the batch script and Slurm's output go
          (``engines-<set>.sbatch`` / ``.out``), instead of the working directory;
        - a failing ``sbatch`` raises :class:`SlurmCommandError` with what it printed (stderr
          included), and stopping a job that has ended already is not an error.
        """

        srun_args = List(Unicode(), config=True, help="arguments of the engines' srun")
        state_folder = Unicode("", config=True, help="folder of the batch script and Slurm's output")
        default_template = Unicode("""#!/bin/sh
#SBATCH --export=ALL
#SBATCH --job-name=ipengine-{cluster_id}
srun {srun_args} {program_and_args}
""")

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if self.state_folder:
                os.makedirs(self.state_folder, mode=0o700, exist_ok=True)
                self.work_dir = self.state_folder
                name = f"engines-{self.engine_set_id or 'preview'}"
                self.batch_file = os.path.join(self.state_folder, f"{name}.sbatch")
                self.output_file = os.path.join(self.state_folder, f"{name}.out")

        def write_batch_script(self, n=1):
            self.context["srun_args"] = shlex.join(self.srun_args)
            super().write_batch_script(n)

        def _insert_options_in_script(self):
            super()._insert_options_in_script()
            self.batch_template = _after_shebang(self.batch_template, self.options)

        def _run_command(self, command, **kwargs):
            self.log.debug("Running command: %s", shlex.join(command))
            return run_slurm_command(command, **kwargs)

        def stop(self):
            try:
                output = self._run_command(self.delete_command + [self.job_id])
            except SlurmCommandError as exc:  # the job ended (or was cancelled) already
                output = str(exc)
            self.notify_stop(dict(job_id=self.job_id, output=output))
            return output

    return SlurmMPIEngineSetLauncher


def run_slurm_command(command: list[str], **kwargs) -> str:
    """Run a Slurm command (``sbatch``, ``scancel``; 60 s at most) and return what it printed; a
    :class:`SlurmCommandError` with what it printed (stderr included) when it fails."""
    try:
        proc = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, timeout=60, **kwargs)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmCommandError(f"{shlex.join(command)}: {exc}") from None
    out, err = (proc.stdout.decode("utf8", "replace"), proc.stderr.decode("utf8", "replace"))
    if proc.returncode != 0:
        said = " ".join((err.strip() or out.strip() or "(nothing printed)").split())
        raise SlurmCommandError(f"{os.path.basename(command[0])} exited with code {proc.returncode}: {said}")
    return out


def _after_shebang(template: str, options: str) -> str:
    """A batch script's ``template`` with the ``options`` lines (``#SBATCH ...``) right after its shebang."""
    if not options.strip():
        return template
    first, rest = template.split("\n", 1)
    return "\n".join([first, options.strip(), rest])
