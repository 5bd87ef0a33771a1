"""EASGD's descendants beside the elastic family on a virtual cluster (issue 25): which method wins at
which link rate.

Every row is a whole run (:func:`workbench.runtime.launch.batch.train` with ``vcluster=``), one rank
per node on ``--nodes`` training nodes (a master-based algorithm's master on a node of its own:
``workbench/bench/cluster_runs.py``), the same model, data, batch, epochs and seed; each link rate
gets a cluster of its own, brought up for its rows and taken down. Rows (``--rows``, default all):

- ``sync-sgd``, ``sync-easgd``, ``async-easgd``: the baselines and the elastic family, defaults;
- ``local-sgd-10``: Local SGD, H = 10;
- ``diloco-10``, ``diloco-50``, ``diloco-100``: DiLoCo with inner SGD (lr 0.1, no momentum: the
  default), outer Nesterov SGD (lr 0.7, momentum 0.9: the paper's); ``diloco-10-adamw``: inner AdamW
  (lr 1e-3, the paper's inner optimizer); ``diloco-*-m0.9``, ``streaming-50-m0.9``: inner momentum
  0.9 (the first defaults, which diverged: kept as measured, run with ``--rows``);
- ``streaming-50``: Streaming DiLoCo, H = 50 in 5 fragments (one every 10 steps), each exchange
  overlapped with 5 inner steps, alpha 0.5, outer gradients in bf16.

Columns: final test accuracy (of the evaluated model: center, outer or averaged model), bytes each
worker sent in all (``wire_bytes``, workbench's counter) and their ratio to sync-SGD's, the training
wall time, the time to ``--target`` test accuracy (the first evaluation at or above it; evaluations
every ``--eval-every`` steps, the same for every row), and the workers' communication share.

    python benchmarks/descendants.py [--nodes 4] [--bandwidth 100mbit,10gbit] [--model lenet]
        [--dataset fashion-mnist] [--batch 32] [--epochs 2] [--seed 0] [--target 0.8] [--rows ROW,...]
        [--json FILE] [--resume]

Writes benchmarks/results/descendants_vcluster.json after every run (machine, load, link rates, rows);
``--resume`` keeps the rows a file already holds.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from tabulate import tabulate

from workbench.bench.cluster_runs import (ClusterArgumentError, add_cluster_arguments, check_cluster_args,
                                         cluster_record, training_ranks, virtual_cluster)
from workbench.bench.machine import Load, describe
from workbench.config import RunConfig
from workbench.runtime.launch.batch import time_to_accuracy, train
from workbench.vcluster.plan import format_rate

RESULTS = Path(__file__).resolve().parent / "results"
#: row -> the RunConfig fields that make it (beside the shared ones)
ROWS = {
    "sync-sgd": {"algorithm": "sync-sgd"},
    "sync-easgd": {"algorithm": "sync-easgd"},
    "async-easgd": {"algorithm": "async-easgd"},
    "local-sgd-10": {"algorithm": "local-sgd", "sync_every": 10},
    "diloco-10": {"algorithm": "diloco", "sync_every": 10},
    "diloco-50": {"algorithm": "diloco", "sync_every": 50},
    "diloco-100": {"algorithm": "diloco", "sync_every": 100},
    "streaming-50": {"algorithm": "streaming-diloco", "sync_every": 50, "fragments": 5, "sync_delay": 5,
                     "fragment_alpha": 0.5, "outer_wire_dtype": "bf16"},
    "diloco-10-adamw": {"algorithm": "diloco", "sync_every": 10, "inner_optimizer": "adamw"},
    # the first defaults, inner momentum 0.9 under the outer Nesterov momentum: kept as measured
    "diloco-10-m0.9": {"algorithm": "diloco", "sync_every": 10, "momentum": 0.9},
    "diloco-50-m0.9": {"algorithm": "diloco", "sync_every": 50, "momentum": 0.9},
    "diloco-100-m0.9": {"algorithm": "diloco", "sync_every": 100, "momentum": 0.9},
    "streaming-50-m0.9": {"algorithm": "streaming-diloco", "sync_every": 50, "fragments": 5, "sync_delay": 5,
                          "fragment_alpha": 0.5, "outer_wire_dtype": "bf16", "momentum": 0.9},
}
#: the rows run unless --rows says otherwise
DEFAULT_ROWS = ["sync-sgd", "sync-easgd", "async-easgd", "local-sgd-10", "diloco-10", "diloco-50", "diloco-100",
                "streaming-50", "diloco-10-adamw"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_cluster_arguments(parser, several_rates=True)
    parser.add_argument("--model", default="lenet")
    parser.add_argument("--dataset", default="fashion-mnist")
    parser.add_argument("--subset", type=int, help="the first N rows of each split (a quick run)")
    parser.add_argument("--batch", type=int, default=32, help="samples per worker step")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", type=float, default=0.8)
    parser.add_argument("--eval-every", type=int, default=100, help="steps (master: arrivals) between evaluations")
    parser.add_argument("--rows", default=",".join(DEFAULT_ROWS), help=f"comma-separated, of {', '.join(ROWS)}")
    parser.add_argument("--json", type=Path, default=RESULTS / "descendants_vcluster.json")
    parser.add_argument("--resume", action="store_true", help="keep the rows the JSON file already holds")
    args = parser.parse_args(argv)
    if args.nodes is None:
        args.nodes = 4
        if args.bandwidth is None and args.vcluster is None:
            args.bandwidth = "100mbit,10gbit"
    check_cluster_args(args, several_rates=True)
    args.rows = args.rows.split(",")
    unknown = [row for row in args.rows if row not in ROWS]
    if unknown:
        raise ClusterArgumentError(f"--rows: {', '.join(unknown)} unknown; choose from {', '.join(ROWS)}")
    return args


def run_row(args, row: str, vc, folder: Path) -> dict:
    fields = ROWS[row]
    cfg = RunConfig(**fields, ranks=training_ranks(fields["algorithm"], args.nodes), model=args.model,
                    dataset=args.dataset, subset=args.subset, batch_size=args.batch, epochs=args.epochs,
                    seed=args.seed, eval_every=args.eval_every)
    run_dir = folder / row
    summary = train(cfg, run_dir, vcluster=vc, ppn=1)
    return {"row": row, **fields, "ranks": cfg.ranks, "final_test_accuracy": summary["final_test_accuracy"],
            "final_test_loss": summary.get("final_test_loss"), "wire_bytes": summary["wire_bytes"],
            "messages": summary.get("messages"), "wall_seconds": summary["wall_seconds"],
            "steps_per_worker": summary["steps_per_worker"],
            "time_to_target": time_to_accuracy(run_dir, args.target),
            "comm_fraction_workers": summary.get("comm_fraction_workers")}


def main(argv: list[str] | None = None) -> None:
    load = Load()
    try:
        args = parse_args(argv)
    except ClusterArgumentError as exc:
        raise SystemExit(f"descendants.py: {exc}") from None
    report = json.loads(args.json.read_text()) if args.resume and args.json.exists() else {"links": {}}
    report.update(nodes=args.nodes, model=args.model, dataset=args.dataset, subset=args.subset,
                  batch_size=args.batch, epochs=args.epochs, seed=args.seed, target=args.target,
                  eval_every=args.eval_every, machine=describe())
    for rate in args.rates:
        with virtual_cluster(args.nodes, rate, args.vcluster, prefix="dsc") as vc:
            link = format_rate(vc.plan.bandwidth)
            entry = report["links"].setdefault(link, {"cluster": cluster_record(vc), "rows": []})
            have = {r["row"] for r in entry["rows"]}
            with tempfile.TemporaryDirectory(dir=vc.shared) as tmp:
                for row in (r for r in args.rows if r not in have):
                    result = run_row(args, row, vc, Path(tmp))
                    entry["rows"].append(result)
                    report["load_average"] = load.done()
                    args.json.write_text(json.dumps(report, indent=1))
                    print(f"{link} {row}: {result['final_test_accuracy']:.3f}, {result['wire_bytes'] / 1e6:.2f} MB, "
                          f"{result['wall_seconds']:.1f} s", flush=True)
    print(table(report))
    print(f"wrote {args.json}")


def table(report: dict) -> str:
    """The rows of every link as one table (the README's)."""
    out = []
    for link, entry in report["links"].items():
        dense = next((r["wire_bytes"] for r in entry["rows"] if r["row"] == "sync-sgd"), None)
        for r in entry["rows"]:
            tta = r["time_to_target"]
            out.append([link, r["row"], f"{r['final_test_accuracy']:.3f}", f"{r['wire_bytes'] / 1e6:.1f}",
                        f"{dense / r['wire_bytes']:.0f}x" if dense and r["wire_bytes"] else "",
                        f"{r['wall_seconds']:.0f}", "not reached" if tta is None else f"{tta:.0f}"])
    return tabulate(out, headers=["link", "row", "test acc", "MB sent per worker", "fewer bytes than sync-SGD",
                                  "wall s", f"s to {report['target']:g}"], tablefmt="github")


if __name__ == "__main__":
    main()
