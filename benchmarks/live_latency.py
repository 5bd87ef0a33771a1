"""Rank -> notebook latency of the live stream with no Dashboard attached.

A ``wb.Cluster`` of MPI engines trains Sync EASGD several times (``store=False``, nothing else
in the notebook process); the notebook's :class:`~workbench.runtime.client.run.Run` receives
the ranks' signed batches on its receiver thread. Two latencies, both on this machine's clock:

- per metric record: from the moment a rank recorded it (``Context.add_metric``) to the moment
  the notebook's receiver accepted the batch that carried it. It includes the sink's batching
  (a batch goes out at most every ``FLUSH_SECONDS`` = 50 ms, when the next span or record comes),
  the signing and JSON encoding, ZeroMQ, and the receiver thread's wake-up. A record's ``t`` is
  seconds since its rank's start; the rank's start on the wall clock is recovered from the batches
  themselves: a batch is sent right after the span or record that triggered the flush, so
  ``sent - (time of the batch's last item)`` is the start plus a few microseconds (the smallest
  value over the run's batches is taken);
- per batch: ``sent`` (stamped on the rank just before encoding) to receipt, which is what
  ``run.latencies`` holds.

The receiver is observed by wrapping the ``verify`` call it makes for every message (a receipt
stamp next to the Run's own); nothing else changes. Prints the table and writes every number
as JSON (default benchmarks/results/live_latency_<ranks>ranks.json).

    python benchmarks/live_latency.py [--ranks 4] [--runs 3] [--epochs 20] [--quick]
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
import workbench.runtime.client.run as run_module
from workbench.bench.machine import Load, describe

RESULTS = Path(__file__).resolve().parent / "results"


def quantiles(values: list[float]) -> dict:
    v = sorted(values)
    return {"count": len(v), "median": statistics.median(v), "p95": v[min(len(v) - 1, int(len(v) * 0.95))],
            "p99": v[min(len(v) - 1, int(len(v) * 0.99))], "max": v[-1], "min": v[0]}


def record_latencies(received: list[tuple[float, dict]]) -> tuple[list[float], dict[int, float]]:
    """Seconds from each metric record's recording to its batch's receipt, and each rank's start
    (wall clock) as recovered from its batches."""
    start: dict[int, float] = {}
    for _, message in received:
        last = [r["t"] for r in message.get("metrics", ())[-1:]]
        last += [(e["ts"] + e["dur"]) / 1e6 for e in message.get("spans", ())[-1:]]
        if last and "sent" in message:
            estimate = message["sent"] - max(last)
            rank = message["rank"]
            start[rank] = min(start.get(rank, estimate), estimate)
    latencies = [at - (start[message["rank"]] + record["t"])
                 for at, message in received for record in message.get("metrics", ())]
    return latencies, start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--algorithm", default="sync-easgd")
    parser.add_argument("--quick", action="store_true", help="one run of 5 epochs")
    parser.add_argument("--json", help="where the JSON goes (default benchmarks/results/live_latency_<ranks>ranks.json)")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.epochs = 1, 5
    args.json = args.json or RESULTS / f"live_latency_{args.ranks}ranks.json"

    received: list[tuple[float, dict]] = []
    verify = run_module.verify

    def observed_verify(secret, frames, run_id):
        message = verify(secret, frames, run_id)
        if message is not None:
            received.append((time.time(), message))  # where Run._drain stamps `received`
        return message

    runs = []
    load = Load()
    run_module.verify = observed_verify
    try:
        with tempfile.TemporaryDirectory() as tmp, wb.Cluster(n=args.ranks) as cluster:
            for i in range(args.runs):
                received.clear()
                cfg = wb.RunConfig(algorithm=args.algorithm, ranks=args.ranks, epochs=args.epochs)
                run = cluster.train(cfg, Path(tmp) / str(i), store=False)
                result = run.wait(600)
                records, starts = record_latencies(received)
                train_records = sum(1 for _, m in received for r in m.get("metrics", ()) if r.get("kind") == "train")
                assert train_records == run.total_steps, (train_records, run.total_steps)  # none lost
                runs.append({"steps": run.total_steps, "wall_seconds": result.summary["wall_seconds"],
                             "record_latency_s": records, "batch_latency_s": list(run.latencies),
                             "rank_start_spread_s": max(starts.values()) - min(starts.values())})
                print(f"run {i + 1}/{args.runs}: {len(records)} records in {len(run.latencies)} batches", flush=True)
    finally:
        run_module.verify = verify

    records = [x for r in runs for x in r["record_latency_s"]]
    batches = [x for r in runs for x in r["batch_latency_s"]]
    summary = {"record": quantiles(records), "batch": quantiles(batches)}
    print(f"\nrank -> notebook latency, no dashboard: {args.algorithm}, {args.ranks} ranks, {args.epochs} epochs, "
          f"{args.runs} runs (load average {load.before[0]:.1f} before, {os.getloadavg()[0]:.1f} after)\n")
    print(tabulate([[name, q["count"], *(f"{1e3 * q[k]:.1f}" for k in ("median", "p95", "p99", "max"))]
                    for name, q in (("metric record: recorded -> received", summary["record"]),
                                    ("batch: sent -> received", summary["batch"]))],
                   headers=["ms", "n", "median", "p95", "p99", "max"]))
    per_run = [[i + 1, r["steps"], f"{r['wall_seconds']:.2f}", f"{1e3 * statistics.median(r['record_latency_s']):.1f}",
                f"{1e3 * max(r['record_latency_s']):.1f}", f"{1e3 * max(r['batch_latency_s']):.1f}"]
               for i, r in enumerate(runs)]
    print()
    print(tabulate(per_run, headers=["run", "steps", "train s", "record median ms", "record max ms", "batch max ms"]))
    Path(args.json).write_text(json.dumps({
        "algorithm": args.algorithm, "ranks": args.ranks, "epochs": args.epochs, "runs": args.runs,
        "cpus": os.cpu_count(), "machine": describe(), "load_average": load.done(),
        "summary": summary,
        "per_run": [{**{k: v for k, v in r.items() if not k.endswith("latency_s")},
                     "record": quantiles(r["record_latency_s"]), "batch": quantiles(r["batch_latency_s"])}
                    for r in runs],
    }, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
