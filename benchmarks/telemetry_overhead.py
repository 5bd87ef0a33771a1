"""Telemetry on vs off: training step time with and without span recording (goal <= 3%).

Runs are alternated (on, off, on, off, ...) so drift hits both alike; the table shows the
median seconds per step over the repetitions; every run's time per step goes to JSON (default
benchmarks/results/telemetry_overhead_<model>_<algorithm>_<ranks>ranks.json).

    python benchmarks/telemetry_overhead.py [--algorithm sync-easgd] [--model mlp] [--epochs 10] [--repeats 5]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

from tabulate import tabulate

from workbench.bench.machine import Load, describe
from workbench.config import RunConfig
from workbench.runtime.launch.batch import train

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algorithm", default="sync-easgd")
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", help="where the JSON goes (default "
                                       "benchmarks/results/telemetry_overhead_<model>_<algorithm>_<ranks>ranks.json)")
    args = parser.parse_args()
    args.json = args.json or RESULTS / f"telemetry_overhead_{args.model}_{args.algorithm}_{args.ranks}ranks.json"
    per_step = {True: [], False: []}
    load = Load()  # this machine is shared: the numbers move with its load
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for on in (True, False):
                cfg = RunConfig(algorithm=args.algorithm, model=args.model, ranks=args.ranks,
                                epochs=args.epochs, telemetry=on)
                s = train(cfg, Path(tmp) / f"{i}-{on}")
                per_step[on].append(s["wall_seconds"] / s["steps_per_worker"])
    on, off = statistics.median(per_step[True]), statistics.median(per_step[False])
    print(f"telemetry overhead: {args.algorithm}, {args.model}, {args.ranks} ranks, {args.epochs} epochs, "
          f"{args.repeats} runs each (load average {load.before[0]:.1f} before, {os.getloadavg()[0]:.1f} after)")
    print(tabulate([["telemetry on", f"{on * 1e3:.3f}"], ["telemetry off", f"{off * 1e3:.3f}"],
                    ["difference", f"{100 * (on - off) / off:+.1f}%"]], headers=["", "ms/step (median)"]))
    Path(args.json).write_text(json.dumps({
        "algorithm": args.algorithm, "model": args.model, "ranks": args.ranks, "epochs": args.epochs,
        "repeats": args.repeats, "cpus": os.cpu_count(),
        "machine": describe(), "load_average": load.done(), "on_s_per_step": per_step[True], "off_s_per_step": per_step[False],
        "on_median_s": on, "off_median_s": off, "difference": (on - off) / off}, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
