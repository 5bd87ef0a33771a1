"""What a shared login node's protections cost a notebook cluster (issue 45): the engines in a network of
their own (the controller and live streams on Unix sockets) against the host's network (TCP on
127.0.0.1), each with CurveZMQ off and on. For each: ``wb.Cluster(n).start()`` wall time, and the
median and 95th percentile of ``view.apply_sync(noop)`` (one task to every engine and back) over
``--tasks`` calls; settings alternated, ``--repeats`` rounds.

    python benchmarks/cluster_security.py [--ranks 4] [--repeats 3] [--tasks 200]

Writes benchmarks/results/cluster_security.json (every number, the machine and its load) and prints a
table.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from tabulate import tabulate

from workbench.bench.machine import Load, describe, write_report

RESULTS = Path(__file__).resolve().parent / "results"
SETTINGS = {"private, curve off": ("auto", False), "private, curve on": ("auto", True),
            "host tcp, curve off": ("host", False), "host tcp, curve on": ("host", True)}


def _noop():
    return 0


def measure(ranks: int, network: str, curve: bool, tasks: int) -> dict:
    import workbench as wb
    os.environ["WORKBENCH_NETWORK"] = network
    t0 = time.perf_counter()
    cluster = wb.Cluster(n=ranks, curve=curve).start()
    started = time.perf_counter() - t0
    try:
        private = cluster.sockets is not None
        view = cluster.view()
        view.apply_sync(_noop)
        times = []
        for _ in range(tasks):
            t = time.perf_counter()
            view.apply_sync(_noop)
            times.append(time.perf_counter() - t)
    finally:
        cluster.stop()
    times.sort()
    return {"start_s": started, "task_median_ms": statistics.median(times) * 1e3,
            "task_p95_ms": times[int(len(times) * 0.95)] * 1e3, "private": private}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--json", type=Path, default=RESULTS / "cluster_security.json")
    args = parser.parse_args()
    os.environ.setdefault("WORKBENCH_STATE_DIR", tempfile.mkdtemp(prefix="wb-bench-state-"))
    load = Load()
    rows = {name: [] for name in SETTINGS}
    for _ in range(args.repeats):
        for name, (network, curve) in SETTINGS.items():
            rows[name].append(measure(args.ranks, network, curve, args.tasks))
    table = [[name, f"{statistics.median(r['start_s'] for r in runs):.2f}",
              f"{statistics.median(r['task_median_ms'] for r in runs):.2f}",
              f"{statistics.median(r['task_p95_ms'] for r in runs):.2f}"] for name, runs in rows.items()]
    print(tabulate(table, headers=["setting", "start s", "task median ms", "task p95 ms"]))
    write_report(args.json, {"machine": describe(), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                             "ranks": args.ranks, "tasks": args.tasks, "repeats": args.repeats, "runs": rows}, load)


if __name__ == "__main__":
    main()
