"""CSC's accuracy against dense sync-SGD at equal epochs, and why it lagged: DGC's momentum factor
masking as published (the masked momentum dropped) against the carry (``carry_momentum``, the
default: the optimizer goes on applying it), docs/papers.md section 3.

Every row is a whole ``sync-sgd`` run per seed through :func:`workbench.runtime.launch.batch.train`
(what ``workbench train`` runs), on the same model, data, batches, lr, momentum, epochs and
4 ranks; the CSC rows are ``benchmarks/gradient_comm.py``'s (1-epoch dense warm-up, chunks of 64):

- ``dense``: dense fp32, one message per step; ``fp16``: the same in fp16 on the wire (scaled, an
  overflowing step skipped);
- ``csc-0.1``, ``csc-0.3``, ``csc-0.01``: CSC with the carry;
- ``csc-0.1-dgc``, ``csc-0.3-dgc``, ``csc-0.01-dgc``: DGC's masking as published (what CSC did
  before the carry); ``csc-0.1-dgc-lr-x3``: the same at 3x the learning rate (the speed the
  masking takes away at rho 0.1: 1/gain(10) = 2.4);
- ``csc-0.01-warm-3``, ``csc-0.01-c16``, ``-c8``, ``-c4``: a longer warm-up, finer chunks;
  ``csc-0.01-clip``, ``-clip-1``, ``csc-0.01-c8-clip``, ``csc-0.1-clip``: DGC's local gradient
  clipping (``clip_norm`` 0.5, 1.0) on the sparse steps; ``csc-0.01-clip-2``, ``csc-0.1-clip-2``: the
  same at ``clip_norm`` 2 (for resnet18, whose gradients are a few times the MLP's).

Columns: final test accuracy, mean, standard deviation and min-max over seeds; the paired
difference from ``dense`` (same seed: same initial weights, shards and batches) with its mean and
standard error; bytes: ``dense_wire_bytes / wire_bytes`` over the whole run (summary.json, the warm-up
included) and after the warm-up. Each finished run is appended to ``<json>.runs.jsonl`` at once and
a run already there is not run again, so an interrupted benchmark continues where it stopped
(the JSON records the load average around each run). A progress bar on stderr follows each run
(steps, loss, test accuracy; into a file, redrawn every 30 s).

    python benchmarks/csc_accuracy.py [--model mlp] [--dataset digits] [--subset N] [--epochs 10]
                                      [--batch-size 16] [--lr-schedule constant] [--eval-every 10] [--seeds 0,1,2]
                                      [--rows dense,csc-0.1,...] [--json FILE]

``--subset N``: the first N rows of each split (resnet18 takes about an hour an epoch of all of
Fashion-MNIST on this machine's 2 cores); ``--eval-every``: steps between test evaluations (the
time-to-target column; a large value evaluates only at the end).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

from ddp_peer import RESULTS  # benchmarks/ is sys.path[0] here
from gradient_comm import WORKBENCH, run_workbench

from workbench.bench.machine import Load, describe
from workbench.lr_schedules import LR_SCHEDULES

ROWS = ["dense", "fp16", "csc-0.1", "csc-0.1-dgc", "csc-0.1-dgc-lr-x3", "csc-0.3", "csc-0.3-dgc", "csc-0.01",
        "csc-0.01-dgc", "csc-0.01-warm-3", "csc-0.01-c16", "csc-0.01-c8", "csc-0.01-c4", "csc-0.01-clip",
        "csc-0.01-clip-1", "csc-0.01-c8-clip", "csc-0.1-clip", "csc-0.01-clip-2", "csc-0.1-clip-2"]
#: the rows gradient_comm.py's WORKBENCH lacks: DGC's momentum factor masking as published (the masked
#: momentum dropped, not carried on), at 3x the learning rate (the speed the masking takes away at
#: rho 0.1), and CSC at rho 0.3
DGC_ROWS = {"csc-0.1-dgc": {"sparse_ratio": 0.1, "warmup_epochs": 1, "carry_momentum": False},
            "csc-0.1-dgc-lr-x3": {"sparse_ratio": 0.1, "warmup_epochs": 1, "carry_momentum": False, "lr": 0.3},
            "csc-0.3": {"sparse_ratio": 0.3, "warmup_epochs": 1},
            "csc-0.3-dgc": {"sparse_ratio": 0.3, "warmup_epochs": 1, "carry_momentum": False},
            "csc-0.01-dgc": {"sparse_ratio": 0.01, "warmup_epochs": 1, "carry_momentum": False},
            # rho 0.01's loss: a longer warm-up (dense, then the ratio falling geometrically over two
            # epochs, as DGC's), and finer chunks (8 of 796 chunks of 64 a step on the MLP: 50 of 3,181 of 16)
            "csc-0.01-warm-3": {"sparse_ratio": 0.01, "warmup_epochs": 3},
            "csc-0.01-c16": {"sparse_ratio": 0.01, "warmup_epochs": 1, "sparse_chunk": 16},
            # finer still: more chunks chosen (127 of 12,723 of 4), at the price of more norms (n/c floats)
            "csc-0.01-c8": {"sparse_ratio": 0.01, "warmup_epochs": 1, "sparse_chunk": 8},
            "csc-0.01-c4": {"sparse_ratio": 0.01, "warmup_epochs": 1, "sparse_chunk": 4},
            # DGC's local gradient clipping on the sparse steps (clip_norm G: each of the 4 ranks' gradients
            # to an L2 norm of G/2; the MLP's per-rank norms ran 0.5-1.9 in the dense epoch)
            "csc-0.01-clip": {"sparse_ratio": 0.01, "warmup_epochs": 1, "clip_norm": 0.5},
            "csc-0.01-clip-1": {"sparse_ratio": 0.01, "warmup_epochs": 1, "clip_norm": 1.0},
            "csc-0.01-c8-clip": {"sparse_ratio": 0.01, "warmup_epochs": 1, "sparse_chunk": 8, "clip_norm": 0.5},
            "csc-0.1-clip": {"sparse_ratio": 0.1, "warmup_epochs": 1, "clip_norm": 0.5},
            # the same for resnet18, whose per-rank gradient norms ran 7-30 in its first 17 steps (145 at a spike),
            # then 1-6 in steps 25-40 (one process, lr 0.1, momentum 0.9, four sub-batches of 16 averaged): G = 2
            # clips each of 4 ranks at 1, a few times under its norm, as G = 0.5 is for the MLP
            "csc-0.01-clip-2": {"sparse_ratio": 0.01, "warmup_epochs": 1, "clip_norm": 2.0},
            "csc-0.1-clip-2": {"sparse_ratio": 0.1, "warmup_epochs": 1, "clip_norm": 2.0}}


def paired(rows: dict[str, list[dict]], key: str) -> dict:
    """``key``'s accuracy against dense, seed by seed; bytes over the run and after the warm-up."""
    runs, dense = {r["seed"]: r for r in rows[key]}, {r["seed"]: r for r in rows.get("dense", [])}
    acc = [runs[s]["final_test_accuracy"] for s in sorted(runs)]
    diff = [100 * (runs[s]["final_test_accuracy"] - dense[s]["final_test_accuracy"]) for s in sorted(runs) if s in dense]
    whole = [r["dense_bytes_per_step"] / r["wire_bytes_per_step"] for r in runs.values()]
    after = [r["dense_bytes_per_step"] / r["bytes_after_warmup"] for r in runs.values() if r["bytes_after_warmup"]]
    return {"key": key, "label": rows[key][0]["label"], "seeds": sorted(runs),
            "accuracy_mean": statistics.mean(acc), "accuracy_std": statistics.stdev(acc) if len(acc) > 1 else 0.0,
            "accuracy_min": min(acc), "accuracy_max": max(acc),
            "points_vs_dense": statistics.mean(diff) if diff else None,
            "points_vs_dense_se": statistics.stdev(diff) / len(diff) ** 0.5 if len(diff) > 1 else None,
            "points_vs_dense_per_seed": diff,
            "bytes_ratio_whole_run": statistics.mean(whole), "bytes_ratio_after_warmup":
                statistics.mean(after) if after else None}


def run_all(args, rows: list[str], seeds: list[int], log: Path) -> list[dict]:
    """Every (row, seed) not in ``log`` yet, seeds outermost, rows shuffled per seed (as gradient_comm)."""
    done = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    have = {(r["key"], r["seed"]) for r in done}
    changes = {**dict(WORKBENCH), **DGC_ROWS}
    with tempfile.TemporaryDirectory(prefix="csc-accuracy-") as tmp:
        for seed in seeds:
            order = list(rows)
            random.Random(seed).shuffle(order)
            for key in order:
                if (key, seed) in have:
                    continue
                load = Load()
                r = run_workbench(args, key, changes[key], seed, Path(tmp) / f"{key}-{seed}", progress=True)
                r["load_average"] = load.done()
                done.append(r)
                with open(log, "a") as f:
                    f.write(json.dumps(r) + "\n")
                print(f"seed {seed} {key}: accuracy {r['final_test_accuracy']:.4f}, "
                      f"{r['dense_bytes_per_step'] / r['wire_bytes_per_step']:.2f}x fewer bytes", flush=True)
    return [r for r in done if r["key"] in rows and r["seed"] in seeds]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--subset", type=int, help="the first N rows of each split (default: all)")
    parser.add_argument("--eval-every", type=int, default=10, help="steps between test evaluations")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr-schedule", default="constant", choices=LR_SCHEDULES,
                        help="every row's learning rate over the run (RunConfig.lr_schedule)")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, of: {', '.join(ROWS)}")
    parser.add_argument("--timeout", type=float, default=900, help="seconds one run may take")
    parser.add_argument("--json", help="default benchmarks/results/csc_accuracy_<model>[_<dataset>]_4ranks.json")
    args = parser.parse_args()
    rows = args.rows.split(",")
    unknown = sorted(set(rows) - set(ROWS))
    if unknown:
        parser.error(f"--rows: unknown {unknown}; known: {', '.join(ROWS)}")
    if args.subset is not None and args.subset < 1:
        parser.error(f"--subset: a number of rows >= 1; got {args.subset}")
    if args.eval_every < 1:
        parser.error(f"--eval-every: a number of steps >= 1; got {args.eval_every}")
    args.ranks, args.collective, args.target = 4, "native", 0.9  # as gradient_comm's
    seeds = [int(s) for s in args.seeds.split(",")]
    data = ("" if args.dataset == "digits" else f"_{args.dataset}") + (f"_{args.subset}" if args.subset else "")
    out = Path(args.json or RESULTS / f"csc_accuracy_{args.model}{data}_4ranks.json")
    started = time.time()
    runs = run_all(args, rows, seeds, out.with_suffix(".runs.jsonl"))
    by_key = {key: [r for r in runs if r["key"] == key] for key in rows}
    summary = [paired(by_key, key) for key in rows]
    rows_used = f" (first {args.subset} rows)" if args.subset else ""
    print(f"\n{args.model} on {args.dataset}{rows_used}, 4 ranks, batch {args.batch_size} per rank, "
          f"{args.epochs} epochs, lr {args.lr_schedule}, seeds {args.seeds}")
    for s in summary:
        vs = "" if s["points_vs_dense"] is None or s["key"] == "dense" else \
            f"  {s['points_vs_dense']:+.2f} points vs dense (se {s['points_vs_dense_se'] or 0:.2f})"
        after = f", {s['bytes_ratio_after_warmup']:.2f}x after warm-up" if s["bytes_ratio_after_warmup"] else ""
        print(f"{s['key']:20s} {s['accuracy_mean']:.4f} (sd {s['accuracy_std']:.4f}, {s['accuracy_min']:.4f}-"
              f"{s['accuracy_max']:.4f}){vs}; {s['bytes_ratio_whole_run']:.2f}x fewer bytes{after}")
    loads = [r["load_average"] for r in runs]
    out.write_text(json.dumps({
        "model": args.model, "dataset": args.dataset, "subset": args.subset, "eval_every": args.eval_every,
        "ranks": 4, "epochs": args.epochs, "batch_size": args.batch_size, "lr_schedule": args.lr_schedule,
        "seeds": seeds, "parameters": runs[0]["parameters"], "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "seconds_this_session": time.time() - started, "cpus": os.cpu_count(), "machine": describe(),
        "load_average": {"before": loads[0]["before"], "after": loads[-1]["after"],
                         "max_1min_before_a_run": max(load["before"][0] for load in loads)},
        "summary": summary, "runs": runs}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
