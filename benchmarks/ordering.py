"""Ordering of the nine algorithms (the EASGD paper's figures): time to a target test accuracy.

Every algorithm runs with its default hyper-parameters on the same model and data, for several
seeds; the tables give the median time to the target and the spread (min-max over seeds), the
paper's pairs first (Async EASGD vs Async SGD, Async MEASGD vs Async MSGD, Hogwild EASGD vs
Hogwild SGD), then all nine ranked by median. The raw results go to JSON (default
benchmarks/results/ordering_<ranks>ranks.json).

    python benchmarks/ordering.py [--ranks 4] [--seeds 0,1,2] [--target 0.9] [--json FILE]
    python benchmarks/ordering.py --nodes 4 --bandwidth 100mbit --dataset fashion-mnist --target 0.8 \
        --epochs 3 --batch 128                                 # on a virtual cluster (ordering_vcluster.json)

On a virtual cluster (``--nodes N --bandwidth RATE``: N+1 nodes on one switch, brought up for the run
and taken down; ``--vcluster NAME``: a running one at its own rate) every algorithm trains on N
workers, one rank per node, a master on a node of its own (``workbench/bench/cluster_runs.py``), so
that every exchange crosses a shaped link as on the paper's cluster.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from tabulate import tabulate

from workbench.bench.cluster_runs import (ClusterArgumentError, add_cluster_arguments, check_cluster_args,
                                         cluster_record, training_ranks, virtual_cluster)
from workbench.bench.machine import Load, describe
from workbench.config import RunConfig
from workbench.optim.registry import ALGORITHMS
from workbench.runtime.launch.batch import time_to_accuracy, train

RESULTS = Path(__file__).resolve().parent / "results"
PAIRS = [("async-easgd", "async-sgd"), ("async-measgd", "async-msgd"), ("hogwild-easgd", "hogwild-sgd")]


def _cell(values: list[float | None]) -> str:
    reached = [v for v in values if v is not None]
    if not reached:
        return "not reached"
    text = f"{statistics.median(reached):.2f} ({min(reached):.2f}-{max(reached):.2f})"
    missed = len(values) - len(reached)
    return text + (f", {missed} missed" if missed else "")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments, the cluster's checked (:func:`~workbench.bench.cluster_runs.check_cluster_args`).
    Raises :class:`~workbench.bench.cluster_runs.ClusterArgumentError` (one line)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=4, help="one host: MPI ranks")
    add_cluster_arguments(parser, several_rates=False)
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--batch", type=int, default=16, help="samples per worker step")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--json", help="where the raw results go (default benchmarks/results/ordering_<ranks>ranks.json, "
                                       "or ordering_vcluster.json)")
    args = parser.parse_args(argv)
    check_cluster_args(args)
    args.json = args.json or RESULTS / ("ordering_vcluster.json" if args.nodes else f"ordering_{args.ranks}ranks.json")
    return args


def run_all(args, seeds: list[int], vc=None) -> dict[str, list[dict]]:
    """Every algorithm for every seed (seeds outermost: drift on this noisy machine hits every
    algorithm alike), on ``vc`` when given; name -> one record per seed."""
    results: dict[str, list[dict]] = {name: [] for name in ALGORITHMS}
    with tempfile.TemporaryDirectory(dir=vc.shared if vc is not None else None) as tmp:
        for seed in seeds:
            for name in ALGORITHMS:
                ranks = training_ranks(name, args.nodes) if vc is not None else args.ranks
                cfg = RunConfig(algorithm=name, ranks=ranks, model=args.model, dataset=args.dataset,
                                batch_size=args.batch, epochs=args.epochs, seed=seed,
                                eval_every=10)  # the time to the target is read at the evaluation points
                run_dir = Path(tmp) / f"{name}-{seed}"
                s = train(cfg, run_dir, vcluster=vc, ppn=1) if vc is not None else train(cfg, run_dir)
                results[name].append({"seed": seed, "ranks": ranks, "time_to_target": time_to_accuracy(run_dir, args.target),
                                      "final_test_accuracy": s["final_test_accuracy"],
                                      "wall_seconds": s["wall_seconds"], "comm_fraction_workers": s["comm_fraction_workers"]})
                print(f"done: {name} seed {seed}: {s['final_test_accuracy']:.3f} in {s['wall_seconds']:.1f} s", flush=True)
    return results


def main(argv: list[str] | None = None) -> None:
    load = Load()
    try:
        args = parse_args(argv)
        seeds = [int(s) for s in args.seeds.split(",")]
        cluster = {}
        if args.nodes is not None:
            with virtual_cluster(args.nodes, args.rates[0], args.vcluster, prefix="sord") as vc:
                cluster = cluster_record(vc)
                results = run_all(args, seeds, vc)
        else:
            results = run_all(args, seeds)
    except ClusterArgumentError as exc:
        raise SystemExit(f"ordering.py: {exc}") from None
    tta = {name: [r["time_to_target"] for r in rs] for name, rs in results.items()}
    where = (f"{args.nodes} workers on a virtual cluster at {cluster['bandwidth']} per port" if cluster
             else f"{args.ranks} ranks on one host")
    print(f"time to {args.target:g} test accuracy, seconds: median (min-max over seeds {args.seeds}); "
          f"{args.model} on {args.dataset}, batch {args.batch}, {where}, default hyper-parameters\n")
    rows = [[f"{a} vs {b}", _cell(tta[a]), _cell(tta[b])] for a, b in PAIRS]
    print(tabulate(rows, headers=["pair", "elastic (first)", "baseline (second)"]))
    print()

    def key(name: str) -> float:
        reached = [v for v in tta[name] if v is not None]
        return statistics.median(reached) if reached else float("inf")

    rows = [[i + 1, name, _cell(tta[name]),
             f"{statistics.median(r['final_test_accuracy'] for r in results[name]):.3f}",
             f"{statistics.median(r['wall_seconds'] for r in results[name]):.2f}"]
            for i, name in enumerate(sorted(ALGORITHMS, key=key))]
    print(tabulate(rows, headers=["rank", "algorithm", f"s to {args.target:g}", "final acc (median)",
                                  "train wall s (median)"]))
    Path(args.json).write_text(json.dumps({"ranks": None if cluster else args.ranks, "nodes": args.nodes,
                                           "cluster": cluster or None,
                                           "model": args.model, "dataset": args.dataset, "batch_size": args.batch,
                                           "epochs": args.epochs, "target": args.target, "seeds": seeds,
                                           "machine": describe(), "load_average": load.done(), "results": results},
                                          indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
