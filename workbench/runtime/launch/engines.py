"""Engine launchers by name: how ``wb.Cluster(engines=...)`` starts its MPI ranks.

``mpi`` is a local ``mpiexec``; the batch systems start the engines as one batch job through
ipyparallel's launchers (``<Prefix>EngineSetLauncher``).
"""
from __future__ import annotations

#: engine launchers that start MPI ranks: name -> ipyparallel launcher class prefix
LAUNCHERS = {"mpi": "MPI", "slurm": "Slurm", "pbs": "PBS", "sge": "SGE", "lsf": "LSF"}


def slurm_launcher():
    """ipyparallel's Slurm engine launcher class, with extra ``#SBATCH`` options."""
    from ipyparallel.cluster.launcher import SlurmEngineSetLauncher

    class SlurmMPIEngineSetLauncher(SlurmEngineSetLauncher):
        """ipyparallel's Slurm engine launcher, plus ``options``: extra ``#SBATCH`` lines
        (``--gres``, ``--constraint``, ...) inserted after the shebang like account and time."""

        def _insert_options_in_script(self):
            super()._insert_options_in_script()
            if self.options.strip():
                first, rest = self.batch_template.split("\n", 1)
                self.batch_template = "\n".join([first, self.options.strip(), rest])

    return SlurmMPIEngineSetLauncher
