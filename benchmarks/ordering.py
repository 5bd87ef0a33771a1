"""Ordering of the nine algorithms (the EASGD paper's figures): time to a target test accuracy.

Every algorithm runs with its default hyper-parameters on the same model and data, for several
seeds; the tables give the median time to the target and the spread (min-max over seeds), the
paper's pairs first (Async EASGD vs Async SGD, Async MEASGD vs Async MSGD, Hogwild EASGD vs
Hogwild SGD), then all nine ranked by median. The raw results go to JSON (default
benchmarks/results/ordering_<ranks>ranks.json).

    python benchmarks/ordering.py [--ranks 4] [--seeds 0,1,2] [--target 0.9] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from tabulate import tabulate

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--json", help="where the raw results go (default benchmarks/results/ordering_<ranks>ranks.json)")
    args = parser.parse_args()
    args.json = args.json or RESULTS / f"ordering_{args.ranks}ranks.json"
    seeds = [int(s) for s in args.seeds.split(",")]
    results: dict[str, list[dict]] = {name: [] for name in ALGORITHMS}
    load = Load()
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:  # seeds outermost: drift on this noisy machine hits every algorithm alike
            for name in ALGORITHMS:
                cfg = RunConfig(algorithm=name, ranks=args.ranks, model=args.model, epochs=args.epochs, seed=seed)
                run_dir = Path(tmp) / f"{name}-{seed}"
                s = train(cfg, run_dir)
                results[name].append({"seed": seed, "time_to_target": time_to_accuracy(run_dir, args.target),
                                      "final_test_accuracy": s["final_test_accuracy"],
                                      "wall_seconds": s["wall_seconds"]})
    tta = {name: [r["time_to_target"] for r in rs] for name, rs in results.items()}
    print(f"time to {args.target:g} test accuracy, seconds: median (min-max over seeds {args.seeds}); "
          f"{args.model}, {args.ranks} ranks, default hyper-parameters\n")
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
    Path(args.json).write_text(json.dumps({"ranks": args.ranks, "model": args.model, "epochs": args.epochs,
                                           "target": args.target, "seeds": seeds, "machine": describe(),
                                           "load_average": load.done(), "results": results}, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
