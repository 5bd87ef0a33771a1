"""Slurm against the local path, on a private single-node Slurm (workbench.vcluster.slurm_local):

- engine start: ``wb.Cluster(n, engines="slurm").start()`` (sbatch, scheduling, srun, engines
  registering) against ``wb.Cluster(n).start()`` (mpiexec), alternated; stop likewise;
- a batch run: ``workbench train`` with ``--launcher srun`` against ``--launcher mpiexec``, same
  configuration, alternated: the command's wall time and the training's own ``wall_seconds``.

Prints the tables and writes every number as JSON (default benchmarks/results/slurm_<ranks>ranks.json).
Needs root or ``sudo -n`` (the daemons), like the Slurm tests.

    python benchmarks/slurm.py [--ranks 4] [--repeats 3] [--epochs 2]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tabulate import tabulate

from workbench.bench.machine import Load, describe

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parent.parent


def _median(values):
    return statistics.median(values) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--algorithm", default="sync-easgd")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    import workbench as wb
    from workbench.vcluster.slurm_local import LocalSlurm

    load = Load()  # this machine is shared: the numbers move with its load
    scratch = Path(tempfile.mkdtemp(prefix="wb-slurm-bench-"))
    os.environ.update(WORKBENCH_STATE_DIR=str(scratch / "state"), WORKBENCH_RUNS=str(scratch / "runs"),
                      WORKBENCH_STORE=str(scratch / "store.sqlite"))
    times = {"start": {"mpi": [], "slurm": []}, "stop": {"mpi": [], "slurm": []},
             "train_command": {"mpiexec": [], "srun": []}, "train_wall": {"mpiexec": [], "srun": []}}
    with LocalSlurm() as local:  # the test fixture's Slurm: MpiDefault=none, this machine's CPUs
        os.environ["SLURM_CONF"] = local.env["SLURM_CONF"]
        overcommit = "#SBATCH --overcommit" if args.ranks > local.cpus else ""
        for _ in range(args.repeats):
            for kind in ("mpi", "slurm"):
                options = dict(engines="slurm", srun_args=["--mpi=pmi2"], options=overcommit) if kind == "slurm" else {}
                cluster = wb.Cluster(n=args.ranks, start_timeout=180, **options)
                t = time.monotonic()
                cluster.start()
                times["start"][kind].append(time.monotonic() - t)
                t = time.monotonic()
                cluster.stop()
                times["stop"][kind].append(time.monotonic() - t)
        for i in range(args.repeats):
            for launcher in ("mpiexec", "srun"):
                out = scratch / "runs" / f"{launcher}-{i}"
                extra = ["--srun-args=--mpi=pmi2" + (" --overcommit" if overcommit else "")] if launcher == "srun" else []
                t = time.monotonic()
                proc = subprocess.run([sys.executable, "-m", "workbench.cli", "train", "--algorithm", args.algorithm,
                                       "--ranks", str(args.ranks), "--epochs", str(args.epochs), "--launcher",
                                       {"mpiexec": "mpi", "srun": "slurm"}[launcher], *extra, "--out", str(out)], capture_output=True, text=True,
                                      cwd=ROOT, timeout=600)
                elapsed = time.monotonic() - t
                if proc.returncode != 0:
                    sys.exit(f"{launcher} run failed:\n{proc.stderr[-3000:]}")
                times["train_command"][launcher].append(elapsed)
                times["train_wall"][launcher].append(json.loads((out / "summary.json").read_text())["wall_seconds"])
        slurm_version = local.run(["sinfo", "--version"]).stdout.strip()
    rows = [["engine start (s)", _median(times["start"]["mpi"]), _median(times["start"]["slurm"])],
            ["engine stop (s)", _median(times["stop"]["mpi"]), _median(times["stop"]["slurm"])],
            ["workbench train, command (s)", _median(times["train_command"]["mpiexec"]),
             _median(times["train_command"]["srun"])],
            ["workbench train, training wall_seconds", _median(times["train_wall"]["mpiexec"]),
             _median(times["train_wall"]["srun"])]]
    print(f"{args.ranks} ranks, medians of {args.repeats}, {slurm_version}, {os.cpu_count()} cores (load average "
          f"{load.before[0]:.1f} before, {os.getloadavg()[0]:.1f} after); train: {args.algorithm}, {args.epochs} epochs")
    print(tabulate(rows, headers=["", "mpiexec (local)", "Slurm (srun)"], floatfmt=".2f"))
    report = {"ranks": args.ranks, "repeats": args.repeats, "epochs": args.epochs, "algorithm": args.algorithm,
              "slurm": slurm_version, "cores": os.cpu_count(),
              "machine": describe(), "load_average": load.done(), "seconds": times}
    path = args.json or RESULTS / f"slurm_{args.ranks}ranks.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1))
    print(f"written to {path}")


if __name__ == "__main__":
    main()
