"""The notebook workbench's costs: engine start/stop, rank-to-notebook latency, dashboard overhead.

- start / stop: ``wb.Cluster(n).start()`` and ``.stop()`` wall time, several times.
- latency: seconds from a rank sending a batch of records to the notebook receiving it (same
  clock: one machine), over a Sync EASGD run (records flow every step, batched every 50 ms).
- dashboard overhead: training step time of the same run with and without a live Dashboard
  attached (alternated; the dashboard draws in the notebook process, which shares the cores).

Prints the tables and writes every number as JSON (default benchmarks/results/cluster_<ranks>ranks.json).
The latency without a dashboard, record by record, is `benchmarks/live_latency.py`; the redraw's
own cost is `benchmarks/redraw.py`.

    python benchmarks/cluster.py [--ranks 4] [--repeats 3] [--epochs 10]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from tabulate import tabulate

import workbench as wb
from workbench.bench.machine import Load, describe

RESULTS = Path(__file__).resolve().parent / "results"


def _quantiles(values: list[float]) -> dict:
    lat = sorted(values)
    return {"median": lat[len(lat) // 2], "p95": lat[int(len(lat) * 0.95)], "max": lat[-1], "count": len(lat)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--json", help="where the JSON goes (default benchmarks/results/cluster_<ranks>ranks.json)")
    args = parser.parse_args()
    args.json = args.json or RESULTS / f"cluster_{args.ranks}ranks.json"
    load = Load()  # this machine is shared: the numbers move with its load
    starts, stops = [], []
    for _ in range(args.repeats):
        t = time.perf_counter()
        cluster = wb.Cluster(n=args.ranks).start()
        starts.append(time.perf_counter() - t)
        t = time.perf_counter()
        cluster.stop()
        stops.append(time.perf_counter() - t)
    per_step = {True: [], False: []}
    latencies = {True: [], False: []}
    import plotly.graph_objects as go
    go.FigureWidget()  # one-time imports (anywidget, plotly validators) are not a per-run cost
    with tempfile.TemporaryDirectory() as tmp, wb.Cluster(n=args.ranks) as cluster:
        for i in range(args.repeats):
            for dashboard in (True, False):
                cfg = wb.RunConfig(algorithm="sync-easgd", ranks=args.ranks, epochs=args.epochs)
                run = cluster.train(cfg, f"{tmp}/{i}-{dashboard}", store=False)
                view = wb.Dashboard(run) if dashboard else None
                result = run.wait(600)
                if view is not None:
                    view.close()
                per_step[dashboard].append(result.summary["wall_seconds"] / result.summary["steps_per_worker"])
                latencies[dashboard].extend(run.latencies)
    on, off = statistics.median(per_step[True]), statistics.median(per_step[False])
    print(f"cluster: {args.ranks} engines, {args.repeats} repeats (load average {load.before[0]:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after, {os.cpu_count()} cores)\n")
    print(tabulate([["start (s)", f"{statistics.median(starts):.2f}", f"{min(starts):.2f}", f"{max(starts):.2f}"],
                    ["stop (s)", f"{statistics.median(stops):.2f}", f"{min(stops):.2f}", f"{max(stops):.2f}"]],
                   headers=["", "median", "min", "max"]))
    print()
    rows = []
    for dashboard in (False, True):
        q = _quantiles(latencies[dashboard])
        rows.append([f"rank -> notebook latency (ms), {'with' if dashboard else 'no'} dashboard",
                     f"{1e3 * q['median']:.1f}", f"{1e3 * q['p95']:.1f}", f"{1e3 * q['max']:.1f}", q["count"]])
    print(tabulate(rows, headers=["", "median", "p95", "max", "batches"]))
    print()
    print(tabulate([["with dashboard", f"{on * 1e3:.3f}"], ["without", f"{off * 1e3:.3f}"],
                    ["difference", f"{100 * (on - off) / off:+.1f}%"]], headers=["sync-easgd mlp", "ms/step (median)"]))
    Path(args.json).write_text(json.dumps({
        "ranks": args.ranks, "repeats": args.repeats, "epochs": args.epochs, "cpus": os.cpu_count(),
        "machine": describe(), "load_average": load.done(), "start_s": starts, "stop_s": stops,
        "s_per_step": {"dashboard": per_step[True], "no_dashboard": per_step[False]},
        "dashboard_overhead": (on - off) / off,
        "batch_latency_s": {"dashboard": _quantiles(latencies[True]), "no_dashboard": _quantiles(latencies[False])},
    }, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
