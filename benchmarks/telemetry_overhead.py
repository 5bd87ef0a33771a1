"""Telemetry on vs off: training step time with and without span recording (goal <= 3%).

Runs are alternated (on, off, on, off, ...) so drift hits both alike; the table shows the
median seconds per step over the repetitions.

    python benchmarks/telemetry_overhead.py [--algorithm sync-easgd] [--model mlp] [--repeats 5]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from tabulate import tabulate

from workbench.config import RunConfig
from workbench.runtime.batch import train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algorithm", default="sync-easgd")
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    per_step = {True: [], False: []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for on in (True, False):
                cfg = RunConfig(algorithm=args.algorithm, model=args.model, ranks=args.ranks,
                                epochs=args.epochs, telemetry=on)
                s = train(cfg, Path(tmp) / f"{i}-{on}")
                per_step[on].append(s["wall_seconds"] / s["steps_per_worker"])
    on, off = statistics.median(per_step[True]), statistics.median(per_step[False])
    print(f"telemetry overhead: {args.algorithm}, {args.model}, {args.ranks} ranks, {args.repeats} runs each")
    print(tabulate([["telemetry on", f"{on * 1e3:.3f}"], ["telemetry off", f"{off * 1e3:.3f}"],
                    ["difference", f"{100 * (on - off) / off:+.1f}%"]], headers=["", "ms/step (median)"]))


if __name__ == "__main__":
    main()
