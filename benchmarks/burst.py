"""DeepPool at paper scale, from the published A100 tables (workbench/burst/data, MIT): plans of
VGG-16, WRN-101-2 and Inception-v3 under both cost models, and the cluster throughput that GPU
multiplexing reaches against plain data parallelism of the foreground job alone.

    python benchmarks/burst.py            # writes benchmarks/results/burst.json, prints the tables
    python benchmarks/burst.py --quick    # B=32, G in 8 and 16, VGG only; cnn executed once

Per (model, global batch B, GPUs G, amplification limit A) and cost model (``workbench``: true
parameter bytes, ring all-reduce over the layer's GPUs at 2.66e5 bytes/us and 5 us per step,
240 us per activation transfer, GPU budget respected by branches; ``deeppool``: the published
planner reproduced): the plan's iteration time, GPU time and GPUs used, against data parallelism
(every layer at G; ``A = dp``).

**Multiplexing** (workbench cost model; :func:`workbench.burst.multiplex.simulate`): the
foreground is the burst plan; the background job is the same model trained data-parallel-free
on every GPU at ``--background-batch`` samples per step (its step time: the table's layer times
at that per-GPU batch, summed), cut into pieces of at most 0.5 ms that fill idle windows without
slowing the foreground by more than 1.1x. ``ratio`` = (foreground + background samples/s) /
(B / data-parallel iteration of the foreground alone on G GPUs). Where B < G data parallelism has
no plan (a GPU needs a sample): no ratio.

**Executed here** (``--execute cnn,wide_mlp``): the small models profiled on this machine, planned
with the calibrated network (``benchmarks/results/allreduce_4ranks.json``, ranks sharing the cores),
and run over MPI: predicted against measured iteration time, and the weights against one process.

The paper reports 1.2-2.3x higher cluster throughput (the arXiv abstract: 2.2-2.4x).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from pathlib import Path

from workbench.bench.machine import Load, describe

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = ("vgg16", "wrn101_2", "inception_v3")
LIMITS = (1.5, 2.0, 2.5, math.inf)


def label(limit) -> str:
    return "dp" if limit == "dp" else ("inf" if math.isinf(limit) else f"{limit:g}")


def planning_seconds(model, table, batch: int, gpus: int, repeats: int = 5) -> dict:
    from workbench.burst.deeppool import plan_deeppool
    from workbench.burst.planner import plan
    out = {}
    for name, fn in (("workbench", lambda: plan(model, table, batch, gpus, 2.0)),
                     ("deeppool", lambda: plan_deeppool(model, table, batch, gpus, 2.0))):
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        out[name] = statistics.median(times)
    return out


def executed(models: list[str], batch: int, ranks: int, steps: int, repeats: int) -> list[dict]:
    """Plans of the project's small models, profiled here, run for real over MPI
    (:func:`workbench.burst.execute.execute`): predicted (calibrated network, ranks sharing this
    machine's cores) against measured iteration time, and the weights against one process."""
    import numpy as np

    from workbench import models as zoo
    from workbench.burst.costs import CostModel
    from workbench.burst.execute import execute, reference
    from workbench.burst.planner import plan
    from workbench.burst.profiler import profile
    cost = CostModel.calibrated(Path(__file__).resolve().parent / "results" / "allreduce_4ranks.json",
                                cores=min(ranks, os.cpu_count()))
    out = []
    for name in models:
        graph, table = profile(zoo.build(name, 64, 10), (64,), (1, 2, 4, 8, 16, 32, 64), repeats=20, name=name)
        ref = reference(name, batch, steps, 0.05, 0)
        plans = {"data parallel": plan(graph, table, batch, ranks, data_parallel=True, cost=cost),
                 "A<=2": plan(graph, table, batch, ranks, 2.0, cost=cost),
                 "all at 1": plan(graph, table, batch, 1, cost=cost)}
        for label, p in plans.items():
            runs = [execute(p, name, steps=steps, ranks=ranks) for _ in range(repeats)]
            measured = statistics.median(r["iteration_ms"] for r in runs)
            out.append({"model": name, "plan": label, "widths": [l.gpus for l in p.layers],
                        "predicted_ms": p.iteration_ms, "measured_ms": measured,
                        "measured_runs_ms": [r["iteration_ms"] for r in runs], "ratio": p.iteration_ms / measured,
                        "max_weight_error": max(float(np.abs(r["weights"] - ref).max()) for r in runs)})
            print(f"executed {name} {label}: predicted {p.iteration_ms:.2f} ms, measured {measured:.2f} ms", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--batches", default="16,32")
    parser.add_argument("--gpus", default="4,8,16,32,64")
    parser.add_argument("--background-batch", type=int, default=8)
    parser.add_argument("--slowdown", type=float, default=1.1)
    parser.add_argument("--piece-ms", type=float, default=0.5)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--execute", default="cnn,wide_mlp", help="small models to plan and run here over MPI ('' none)")
    parser.add_argument("--execute-repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", default=str(RESULTS / "burst.json"))
    args = parser.parse_args()
    if args.quick:
        args.models, args.batches, args.gpus, args.execute, args.execute_repeats = "vgg16", "32", "8,16", "cnn", 1
    from tabulate import tabulate

    from workbench.burst.deeppool import plan_deeppool
    from workbench.burst.graph import BurstError, load_model, load_profile
    from workbench.burst.multiplex import background_step_ms, simulate
    from workbench.burst.planner import plan

    started, load = time.time(), Load()
    models = [m for m in args.models.split(",") if m]
    batches = [int(b) for b in args.batches.split(",")]
    gpus_list = [int(g) for g in args.gpus.split(",")]
    rows, mux = [], []
    for name in models:
        model = load_model(name)
        table = load_profile(model.profile_path)
        bg_ms = background_step_ms(model, table, args.background_batch)
        for batch in batches:
            for gpus in gpus_list:
                for cost_model, planner in (("workbench", plan), ("deeppool", plan_deeppool)):
                    try:
                        dp = planner(model, table, batch, gpus, data_parallel=True)
                    except BurstError:
                        dp = None
                    for limit in (*LIMITS, "dp"):
                        try:
                            p = dp if limit == "dp" else planner(model, table, batch, gpus, limit)
                        except BurstError as exc:
                            p, why = None, str(exc)
                        if p is None:
                            rows.append({"model": name, "batch": batch, "gpus": gpus, "cost_model": cost_model,
                                         "limit": label(limit), "error": why if limit != "dp" else "B < G"})
                            continue
                        row = {"model": name, "batch": batch, "gpus": gpus, "cost_model": cost_model,
                               "limit": label(limit), "iteration_ms": p.iteration_ms, "gpu_ms": p.gpu_ms,
                               "gpus_used": p.gpus_used, "widths": [l.gpus for l in p.layers],
                               "dp_iteration_ms": dp.iteration_ms if dp else None}
                        rows.append(row)
                        if cost_model != "workbench" or limit == "dp" or dp is None:
                            continue
                        r = simulate(p, bg_ms, args.piece_ms, args.slowdown, args.iterations,
                                     background_batch=args.background_batch, baseline=dp)
                        mux.append({"model": name, "batch": batch, "gpus": gpus, "limit": label(limit),
                                    "gpus_used": p.gpus_used,
                                    "planned_ms": p.iteration_ms, "achieved_ms": r.iteration_ms,
                                    "slowdown": r.slowdown, "foreground": r.foreground_throughput,
                                    "background": r.background_throughput, "total": r.total_throughput,
                                    "baseline": r.baseline_throughput, "ratio": r.ratio,
                                    "utilisation_before": statistics.fmean(r.utilisation_before.values()),
                                    "utilisation_after": statistics.fmean(r.utilisation_after.values())})
        print(f"{name}: done ({time.time() - started:.0f} s)", flush=True)
    runs = executed([m for m in args.execute.split(",") if m], 64, 4, 40, args.execute_repeats) if args.execute else []
    wrn = load_model("wrn101_2")
    timing = planning_seconds(wrn, load_profile(wrn.profile_path), 32, 64)

    def ms(v):
        return "-" if v is None else f"{v:.2f}"
    print(f"\nplans (iteration ms / GPU ms / GPUs used); dp = data parallelism; B = global batch")
    by_key = {(x["model"], x["batch"], x["gpus"], x["cost_model"], x["limit"]): x for x in rows}
    for cost_model in ("workbench", "deeppool"):
        table_rows = []
        for name in models:
            for batch in batches:
                for gpus in gpus_list:
                    cells = []
                    for limit in (*LIMITS, "dp"):
                        r = by_key[(name, batch, gpus, cost_model, label(limit))]
                        cells.append("-" if "error" in r else
                                     f"{r['iteration_ms']:.2f} / {r['gpu_ms']:.1f} / {r['gpus_used']}")
                    table_rows.append([name, batch, gpus, *cells])
        print(f"\ncost model {cost_model}")
        print(tabulate(table_rows, headers=["model", "B", "G", *(f"A={label(l)}" for l in (*LIMITS, "dp"))]))
    print(f"\nmultiplexing (workbench plans; background: the same model at {args.background_batch} samples per GPU "
          f"step; pieces <= {args.piece_ms} ms; slowdown <= {args.slowdown}); samples/s")
    print(tabulate([[m["model"], m["batch"], m["gpus"], m["limit"], m["gpus_used"], ms(m["planned_ms"]),
                     f"{m['slowdown']:.3f}",
                     f"{m['foreground']:.0f}", f"{m['background']:.0f}", f"{m['total']:.0f}", f"{m['baseline']:.0f}",
                     f"{m['ratio']:.2f}x", f"{m['utilisation_before']:.0%} -> {m['utilisation_after']:.0%}"]
                    for m in mux],
                   headers=["model", "B", "G", "A", "fg GPUs", "plan ms", "slowdown", "fg", "bg", "total", "dp alone", "ratio",
                            "GPU use"]))
    ratios = [m["ratio"] for m in mux]
    best = max(mux, key=lambda m: m["ratio"]) if mux else None
    if best:
        print(f"\nratio over all rows: min {min(ratios):.2f}x, median {statistics.median(ratios):.2f}x, max "
              f"{max(ratios):.2f}x ({best['model']} B={best['batch']} G={best['gpus']} A={best['limit']}); "
              f"the paper: 1.2-2.3x")
        full = [m["ratio"] for m in mux if m["gpus_used"] == m["gpus"]]
        if full:
            print(f"rows whose foreground plan uses all G GPUs ({len(full)} of {len(mux)}): min {min(full):.2f}x, "
                  f"median {statistics.median(full):.2f}x, max {max(full):.2f}x (the others leave whole GPUs to the "
                  f"background, which then runs there at full rate)")
    if runs:
        print("\nexecuted here over MPI (global batch 64, 4 ranks on this machine's cores; calibrated network): "
              "predicted vs measured iteration ms (median of runs); weights vs one process")
        print(tabulate([[r["model"], r["plan"], r["widths"], f"{r['predicted_ms']:.2f}", f"{r['measured_ms']:.2f}",
                         f"{r['ratio']:.2f}", f"{r['max_weight_error']:.1e}"] for r in runs],
                       headers=["model", "plan", "widths", "predicted", "measured", "ratio", "max |w - 1 process|"]))
    print(f"planning WRN-101-2, B=32, 64 GPUs, A=2: workbench {timing['workbench'] * 1e3:.1f} ms, deeppool "
          f"{timing['deeppool'] * 1e3:.1f} ms (median of 5)")
    report = {"date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime(started)), "args": vars(args),
              "machine": describe(), "load_average": load.done(), "seconds": time.time() - started,
              "planning_seconds_wrn_64": timing, "plans": rows, "multiplexing": mux, "executed": runs}
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1, default=str))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
