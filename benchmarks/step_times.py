"""Step time of the training algorithms on LeNet-5, measured through ``workbench train`` as a user
runs it, for comparing two checkouts of the code (issue 43: a refactor must keep sync-SGD, Sync
EASGD, Async EASGD and DiLoCo within noise or faster).

Each algorithm runs ``--repeats`` times on each checkout (``--repo``, repeated to compare several),
the algorithms and the checkouts alternated so that a change of the machine's load falls on all of
them alike; a run is LeNet-5 on the first ``--subset`` rows of Fashion-MNIST,
one epoch, batch 32, evaluation only at the end, 2 training ranks (and a master for the master-based
ones). The step time is a worker's training seconds over its steps (``wall_seconds /
steps_per_worker`` of summary.json), median over the repeats.

    python benchmarks/step_times.py [--repo DIR ...] [--repeats 5] [--subset 16384] [--json PATH]

``--repo``: a checkout whose code runs (its own venv is not needed: this interpreter runs it with
``PYTHONPATH=DIR``); default this one. Measured for issue 43 (benchmarks/README.md):
``python benchmarks/step_times.py --repo /tmp/wb-base --repo . --json benchmarks/results/step_times_issue43.json``
with ``/tmp/wb-base`` a worktree of eaed4a1.
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

from workbench.bench.machine import Load, describe

ROOT = Path(__file__).resolve().parent.parent
ALGORITHMS = ("sync-sgd", "sync-easgd", "async-easgd", "diloco")
MASTER_BASED = ("async-easgd", "async-sgd", "async-msgd", "async-measgd", "easgd", "hogwild-sgd", "hogwild-easgd")


def run(repo: Path, algorithm: str, subset: int, folder: Path) -> dict:
    ranks = 3 if algorithm in MASTER_BASED else 2
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}
    out = folder / f"{algorithm}-{time.time_ns()}"
    proc = subprocess.run([sys.executable, "-m", "workbench.cli", "train", "--algorithm", algorithm, "--ranks",
                           str(ranks), "--model", "lenet", "--dataset", "fashion-mnist", "--subset", str(subset),
                           "--epochs", "1", "--batch-size", "32", "--eval-every", "1000000", "--out", str(out),
                           "--store", str(folder / "store.sqlite"), "--no-progress"],
                          capture_output=True, text=True, timeout=900, env=env, cwd=folder)
    if proc.returncode != 0:
        raise SystemExit(f"{algorithm}: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}")
    summary = json.loads((out / "summary.json").read_text())
    return {"wall_seconds": summary["wall_seconds"], "steps_per_worker": summary["steps_per_worker"],
            "step_ms": 1e3 * summary["wall_seconds"] / summary["steps_per_worker"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, action="append", help="a checkout whose code runs (default this one); "
                                                                   "again to compare several")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--subset", type=int, default=16384,
                        help="rows of Fashion-MNIST (default 16384: 256 steps a worker)")
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS), help=f"default {','.join(ALGORITHMS)}")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    repos = [r.resolve() for r in (args.repo or [ROOT])]
    commits = [subprocess.run(["git", "-C", str(r), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip() for r in repos]
    algorithms = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    load, runs = Load(), {c: {a: [] for a in algorithms} for c in commits}
    with tempfile.TemporaryDirectory(prefix="wb-step-times-") as folder:
        for _ in range(args.repeats):
            for algorithm in algorithms:
                for repo, commit in zip(repos, commits):
                    runs[commit][algorithm].append(run(repo, algorithm, args.subset, Path(folder)))
    step_ms = {c: {a: statistics.median(r["step_ms"] for r in rs) for a, rs in by.items()} for c, by in runs.items()}
    result = {"commits": commits, "subset": args.subset, "repeats": args.repeats, "machine": describe(),
              "load_average": load.done(), "step_ms": step_ms, "runs": runs}
    for algorithm in algorithms:
        for commit in commits:
            spread = [round(r["step_ms"], 2) for r in runs[commit][algorithm]]
            print(f"{commit} {algorithm:12s} {step_ms[commit][algorithm]:7.2f} ms a step (runs: {spread})")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
