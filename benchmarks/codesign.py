"""Co-design: original EASGD vs Sync EASGD on the >= 1M-parameter MLP (the paper's 87% -> 14%
communication share, 5.3x), with the ablations single buffer vs per-layer messages and tree vs
sequential reduction. Prints a table and writes it as JSON (default
benchmarks/results/codesign_<ranks>ranks.json).

    python benchmarks/codesign.py [--ranks 4] [--epochs 2] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from tabulate import tabulate

from workbench.bench.machine import Load, describe
from workbench.config import RunConfig
from workbench.runtime.launch.batch import train

RESULTS = Path(__file__).resolve().parent / "results"

VARIANTS = [  # (label, RunConfig changes)
    ("original EASGD (round-robin master), per-layer messages", dict(algorithm="easgd", fusion_bytes=0)),
    ("original EASGD (round-robin master), single buffer", dict(algorithm="easgd")),
    ("Sync EASGD, sequential reduction (linear), per-layer", dict(algorithm="sync-easgd", collective="linear", fusion_bytes=0)),
    ("Sync EASGD, sequential reduction (linear), single buffer", dict(algorithm="sync-easgd", collective="linear")),
    ("Sync EASGD, tree (binary_tree), single buffer", dict(algorithm="sync-easgd", collective="binary_tree")),
    ("Sync EASGD, ring, single buffer", dict(algorithm="sync-easgd", collective="ring")),
    ("Sync EASGD, ring, single buffer, no overlap", dict(algorithm="sync-easgd", collective="ring", overlap=False)),
    ("Sync EASGD, native MPI_Allreduce, single buffer", dict(algorithm="sync-easgd", collective="native")),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--model", default="wide_mlp")
    parser.add_argument("--json", help="where the JSON goes (default benchmarks/results/codesign_<ranks>ranks.json)")
    args = parser.parse_args()
    args.json = args.json or RESULTS / f"codesign_{args.ranks}ranks.json"
    rows, records, load = [], [], Load()
    with tempfile.TemporaryDirectory() as tmp:
        for i, (label, changes) in enumerate(VARIANTS):
            cfg = RunConfig(ranks=args.ranks, model=args.model, epochs=args.epochs, batch_size=32, **changes)
            s = train(cfg, Path(tmp) / str(i))
            per_epoch = s["wall_seconds"] / args.epochs
            records.append({"variant": label, "config": changes, "seconds_per_epoch": per_epoch,
                            "comm_fraction": s["comm_fraction"], "comm_fraction_workers": s["comm_fraction_workers"],
                            "final_test_accuracy": s["final_test_accuracy"], "bytes_sent": s["bytes_sent"]})
            rows.append([label, f"{per_epoch:.2f}", f"{100 * s['comm_fraction_workers']:.0f}%",
                         f"{100 * s['comm_fraction']:.0f}%", f"{s['final_test_accuracy']:.3f}",
                         f"{s['bytes_sent'] / 1e6:.0f}"])
            print(f"done: {label}", flush=True)
    base = records[0]["seconds_per_epoch"]
    for row, rec in zip(rows, records):
        row.insert(2, f"{base / rec['seconds_per_epoch']:.2f}x")
    print(f"\nco-design, {args.model} ({args.ranks} ranks, {args.epochs} epochs, batch 32, digits)")
    print(tabulate(rows, headers=["variant", "s/epoch", "speed-up vs first", "comm share (workers)",
                                  "comm share (all ranks)", "test acc", "MB sent"]))
    Path(args.json).write_text(json.dumps({"ranks": args.ranks, "model": args.model, "epochs": args.epochs,
                                           "machine": describe(), "load_average": load.done(), "variants": records},
                                          indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
