"""Is the scale-out predictor believable here? Its step time for this machine's own 4-rank
``sync-sgd`` runs against the measured one (goal: within +-25% for the dense and fused
configurations, before the predictor is trusted to extrapolate).

Per model (``wide_mlp``; ``cnn`` too by default), ranks 4, ``ring`` collective, batch 32 per rank:

1. **network**: a fresh ``workbench bench allreduce --ranks 4 --algorithms ring,native --sizes
   4K,64K,1M,8M --no-gloo --json TMP`` fitted by :func:`workbench.netsim.calibration.calibrate` on
   its default topology, ``fully_connected(4)`` (the closed form :class:`~workbench.netsim.costs.
   AlphaBeta` is exactly the simulator on that network, so the fitted per-hop latency and link
   bandwidth mean there what they meant in the fit; the fit uses the ``ring`` rows, ``native`` is
   not a schedule). ``--calibration FILE`` uses an existing bench JSON instead.
2. **compute**, with :mod:`workbench.bench.layers`: the per-layer forward/backward profile, the
   update (gradient clear + average + momentum SGD + copy: ``update_s``), fp16's casts and one
   evaluation of the test set, (a) in this process alone, one thread, and (b) in ``ranks``
   processes at once (each layer's mean: see that module's text).
3. **predictions** (:func:`workbench.netsim.predict.predict`) for four configurations: dense fp32 in
   one message per step, one message per tensor (fusion 0), fusion 256K with overlap, fp16 on the
   wire (one message, no overlap). Three variants:

   - ``raw``: the single-process profile as measured;
   - ``scaled`` (x ranks/cores; the variant chosen before the first runs): the single-process compute times ``ranks / cores`` (4 / 2 = 2 here). Every rank runs
     one thread and is runnable all step long (waiting ranks spin in MPI progress loops), so 4
     ranks on 2 cores get half a core each: each rank's compute takes twice its alone time. The
     network needs no correction: the all-reduce bench ran on the same 4 oversubscribed ranks;
   - ``concurrent``: the profile measured by 4 processes at once (oversubscription and cache or
     memory contention measured, not assumed), no factor; each step starts at a spinning barrier
     (:func:`workbench.bench.step.profile_step` with ``lockstep=True``), as the ranks meet at the
     all-reduce;
   - ``lockstep`` (**the variant the goal is judged on** since the first check: its traces showed
     the ranks reaching the all-reduce 7.5 ms apart on wide_mlp, a term the other variants lack):
     ``concurrent`` plus the measured skew (``skew_s``: the slowest process's extra time per step,
     from the same profile, no network involved).

   Terms outside the predictor, added the same way to every variant: fp16's casts (measured) go
   into ``update_s`` (the predictor's network moves bytes only); rank 0's evaluation of the test
   set at the evaluation points inside the timed loop (``eval_every`` 1000 by default, so only the
   last step's) adds ``evaluate_s x evaluations / steps`` per step (the other ranks wait for it
   in the summary's gather, so it lengthens the slowest rank's wall time).
4. **measurements**: real runs through :func:`workbench.runtime.launch.batch.train` (epochs so
   every run has >= ``--min-steps`` steps per worker; configurations interleaved within each
   repeat, repeats outermost; telemetry on so each run's compute and wait per step can be compared
   with the prediction's; spans cost about 3 us each, a few per step). Step time =
   ``wall_seconds / steps_per_worker``, median over repeats.

5. **where the time goes**: each run's ``trace.json`` gives, per step (medians), the compute
   (forward + backward + update, mean over ranks), the *spread* of the ranks' backward ends (the
   predictor assumes they reach the all-reduce together; time-sliced ranks do not), and the
   communication left after the last rank's backward (the predictor's exposed communication).

Prints the table (predicted vs measured, ratio) and the goals, and writes every number as JSON
(default benchmarks/results/predict_check_4ranks.json) with the load average before and after.

    python benchmarks/predict_check.py [--models wide_mlp,cnn] [--repeats 3] [--quick] [--json FILE]

``--vcluster RATE``: the same question on the virtual cluster, real runs on 2 and 4 nodes with links
of RATE, wide_mlp, lenet and resnet18 on Fashion-MNIST (goal +-15%): ``predict_check_vcluster.py``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"

#: (key, label, RunConfig / Communication options); RunConfig's own default is overlap=True, so
#: every row says overlap explicitly
CONFIGS = [
    ("dense", "dense fp32, one message per step", {"fusion_bytes": None, "overlap": False}),
    ("per-tensor", "one message per tensor (fusion 0)", {"fusion_bytes": 0, "overlap": False}),
    ("fused-256K-overlap", "fusion 256K, overlap", {"fusion_bytes": 256 << 10, "overlap": True}),
    ("fp16", "fp16 on the wire, one message", {"fusion_bytes": None, "overlap": False, "wire_dtype": "fp16"}),
]
#: the configurations the goal names: "dense and fused"
GOAL_KEYS = ("dense", "per-tensor", "fused-256K-overlap")
TOLERANCE = 0.25
VARIANTS = ("raw", "scaled", "concurrent", "lockstep")
VARIANT_LABELS = {"raw": "raw (1 process)", "scaled": "x ranks/cores", "concurrent": "concurrent profile",
                  "lockstep": "concurrent + skew"}
#: the variant the goal is judged on (was "scaled" until the first check showed the missing term:
#: the ranks' skew, which the lock-step profile now measures without running the network)
PRIMARY = "lockstep"


def fresh_calibration(args, tmp: Path) -> Path:
    """Run the all-reduce bench on ``args.ranks`` ranks into a temp file; its path."""
    path = tmp / "allreduce.json"
    command = [sys.executable, "-m", "workbench.cli", "bench", "allreduce", "--ranks", str(args.ranks),
               "--algorithms", "ring,native", "--sizes", args.sizes, "--no-gloo", "--json", str(path)]
    print("$ workbench " + " ".join(command[3:]), flush=True)
    subprocess.run(command, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return path


def steps_plan(args) -> tuple[int, int]:
    """(epochs, steps per worker) so that every worker takes >= ``min_steps`` steps."""
    from workbench import data
    from workbench.summary import planned_steps
    info = data.describe("digits")
    per_epoch = min(planned_steps(info.train_samples, args.ranks, args.batch_size, 1))
    epochs = math.ceil(args.min_steps / per_epoch)
    return epochs, max(planned_steps(info.train_samples, args.ranks, args.batch_size, epochs))


def evaluations_in_loop(steps: int, eval_every: int) -> int:
    """Evaluation points inside the timed training loop (:meth:`SyncAlgorithm.run`)."""
    return sum(1 for done in range(1, steps + 1) if done % eval_every == 0 or done == steps)


def predictions(step_profile, network, ranks: int, steps: int, eval_every: int, skew: bool = False) -> dict[str, dict]:
    """Per configuration: the prediction's step, compute, exposed communication, evaluation term;
    ``skew``: with the profile's measured lock-step skew (``skew_s``), else none."""
    skew = step_profile.skew_s if skew else 0.0
    from workbench.netsim.predict import predict
    out = {}
    evals = evaluations_in_loop(steps, eval_every)
    for key, _, options in CONFIGS:
        update = step_profile.update_s + step_profile.wire_cast_s.get(options.get("wire_dtype", "fp32"), 0.0)
        p = predict(step_profile.layers, ranks, network, options, update_s=update, skew_s=skew)
        evaluation = step_profile.evaluate_s * evals / steps
        out[key] = {"step_s": p.step_s + evaluation, "predictor_step_s": p.step_s, "compute_s": p.compute_s,
                    "comm_s": p.comm_s, "exposed_comm_s": p.exposed_comm_s, "evaluate_per_step_s": evaluation,
                    "update_s": update, "skew_s": skew, "messages": p.messages, "buckets": p.buckets,
                    "wire_bytes": p.wire_bytes}
    return out


def trace_breakdown(run_dir: Path, skip: int = 10) -> dict | None:
    """From a run's ``trace.json`` (telemetry on), medians over its steps (the first ``skip``
    left out), in seconds: ``compute`` (forward_backward + update, mean over ranks), ``spread``
    (last rank's backward end - first rank's: how unevenly the ranks reach the all-reduce),
    ``after_last_backward`` (the step's last all-reduce end on any rank - the last rank's backward
    end: the communication nobody's compute hid, the predictor's exposed communication)."""
    path = run_dir / "trace.json"
    if not path.exists():
        return None
    events = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]
    ranks = sorted({e["pid"] for e in events})
    spans = {(r, name): sorted((e for e in events if e["pid"] == r and e["name"] == name), key=lambda e: e["ts"])
             for r in ranks for name in ("forward_backward", "update")}
    comm = {r: sorted((e for e in events if e["pid"] == r and e.get("cat") == "comm"), key=lambda e: e["ts"])
            for r in ranks}
    steps = min(len(spans[(r, "forward_backward")]) for r in ranks)
    out = {"compute": [], "spread": [], "after_last_backward": []}
    for step in range(skip, steps - 1):
        ends, last = [], []
        for r in ranks:
            fb = spans[(r, "forward_backward")]
            begin, stop = fb[step]["ts"], fb[step + 1]["ts"]
            ends.append(fb[step]["ts"] + fb[step]["dur"])
            mine = [e["ts"] + e["dur"] for e in comm[r] if begin <= e["ts"] < stop]
            last.append(max(mine) if mine else ends[-1])
        out["compute"].append(statistics.fmean(spans[(r, "forward_backward")][step]["dur"]
                                               + spans[(r, "update")][step]["dur"] for r in ranks
                                               if step < len(spans[(r, "update")])))
        out["spread"].append(max(ends) - min(ends))
        out["after_last_backward"].append(max(last) - max(ends))
    return {key: statistics.median(values) / 1e6 for key, values in out.items()} if out["compute"] else None


def measure(args, model: str, key: str, options: dict, epochs: int, seed: int, run_dir: Path) -> dict:
    from workbench.config import RunConfig
    from workbench.runtime.launch.batch import train
    cfg = RunConfig(algorithm="sync-sgd", ranks=args.ranks, model=model, epochs=epochs, seed=seed,
                    batch_size=args.batch_size, collective="ring", eval_every=args.eval_every,
                    telemetry=not args.no_telemetry, **options)
    s = train(cfg, run_dir, timeout=args.timeout)
    steps = s["steps_per_worker"]
    return {"model": model, "key": key, "seed": seed, "step_s": s["wall_seconds"] / steps,
            "wall_seconds": s["wall_seconds"], "steps_per_worker": steps, "evaluations": s.get("evaluations"),
            "compute_per_step_s": s["time_in"]["compute"] / steps, "wait_per_step_s": s["time_in"]["wait"] / steps,
            "comm_per_step_s": s["time_in"]["comm"] / steps, "messages_per_step": s["messages_per_step"],
            "wire_bytes_per_step": s["wire_bytes_per_step"], "final_test_accuracy": s["final_test_accuracy"],
            "skipped_steps": s.get("skipped_steps", 0), "trace": trace_breakdown(run_dir),
            "load_average": os.getloadavg()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="wide_mlp,cnn", help="comma-separated built-in models")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--cores", type=int, default=os.cpu_count(), help="cores the ranks share (default: this machine's)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--min-steps", type=int, default=100, help="steps per worker at least (sets the epochs)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per configuration (median)")
    parser.add_argument("--profile-repeats", type=int, default=100, help="timed repetitions of each profile phase")
    parser.add_argument("--eval-every", type=int, default=1000, help="steps between evaluations (default: only the last)")
    parser.add_argument("--sizes", default="4K,64K,1M,8M", help="all-reduce bench sizes for the fit")
    parser.add_argument("--calibration", help="an existing `workbench bench allreduce --json` file instead of a fresh run")
    parser.add_argument("--csv-dir", help="also write each model's single-process profile as FILE.csv "
                                          "(`workbench predict --profile`)")
    parser.add_argument("--no-telemetry", action="store_true", help="runs without spans (no compute/wait breakdown)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=600, help="seconds one run may take")
    parser.add_argument("--quick", action="store_true", help="wide_mlp only, 1 repeat, 30 profile repetitions")
    parser.add_argument("--json", help="where the JSON goes (default benchmarks/results/predict_check_<ranks>ranks.json)")
    parser.add_argument("--vcluster", metavar="RATE", help="the virtual-cluster mode instead: real runs on N nodes "
                                                           "with links of RATE (benchmarks/predict_check_vcluster.py "
                                                           "and its options: --nodes, --models, --configs, ...)")
    known, _ = parser.parse_known_args()
    if known.vcluster:
        import predict_check_vcluster
        predict_check_vcluster.main(sys.argv[1:])
        return
    args = parser.parse_args()
    if args.quick:
        args.models, args.repeats, args.profile_repeats = "wide_mlp", 1, 30
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    out = Path(args.json or RESULTS / f"predict_check_{args.ranks}ranks.json")

    import torch
    from tabulate import tabulate

    from workbench.bench.layers import write_profile_csv
    from workbench.bench.machine import Load, describe
    from workbench.bench.step import profile_step
    from workbench.netsim.calibration import calibrate
    from workbench.netsim.costs import AlphaBeta

    load = Load()
    started = time.time()
    factor = args.ranks / args.cores
    epochs, steps = steps_plan(args)
    report: dict = {"ranks": args.ranks, "cores": args.cores, "oversubscription": factor, "collective": "ring",
                    "batch_size": args.batch_size, "epochs": epochs, "steps_per_worker": steps,
                    "eval_every": args.eval_every, "repeats": args.repeats, "profile_repeats": args.profile_repeats,
                    "telemetry": not args.no_telemetry, "primary_variant": PRIMARY, "tolerance": TOLERANCE,
                    "torch": torch.__version__, "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime(started)),
                    "models": {}}
    with tempfile.TemporaryDirectory(prefix="predict-check-") as tmp:
        tmp = Path(tmp)
        # -- the network ------------------------------------------------------------------
        bench = Path(args.calibration) if args.calibration else fresh_calibration(args, tmp)
        cal = calibrate(bench)
        network = AlphaBeta.from_calibration(cal, "ring")
        bench_data = json.loads(bench.read_text())
        report["network"] = {"source": str(bench) if args.calibration else "fresh bench (temp file)",
                             "describe": network.describe(), "latency_s": network.latency,
                             "bandwidth_Bps": network.bandwidth, "fit": cal.table.to_dict("records"),
                             "bench": bench_data.get("results"), "bench_date": bench_data.get("date")}
        print(f"\nnetwork: {network.describe()} ({cal})\n", flush=True)

        # -- compute profiles and predictions --------------------------------------------
        for model in models:
            alone = profile_step(model, args.batch_size, processes=1, repeats=args.profile_repeats, ranks=args.ranks)
            together = profile_step(model, args.batch_size, processes=args.ranks, repeats=args.profile_repeats,
                                    ranks=args.ranks, lockstep=True)
            variants = {"raw": alone, "scaled": alone.scaled(factor), "concurrent": together, "lockstep": together}
            if args.csv_dir:
                path = write_profile_csv(alone.layers, Path(args.csv_dir) / f"{model}_b{args.batch_size}.csv")
                print(f"wrote {path}")
            report["models"][model] = {
                "parameters": alone.parameters,
                "profiles": {name: p.to_dict() for name, p in (("alone", alone), ("concurrent", together))},
                "predictions": {v: predictions(p, network, args.ranks, steps, args.eval_every, skew=v == "lockstep")
                                for v, p in variants.items()},
                "runs": []}
            for v, p in variants.items():
                print(f"{model} {VARIANT_LABELS[v]}: forward {p.forward_s * 1e3:.2f} ms, backward "
                      f"{p.backward_s * 1e3:.2f} ms, update {p.update_s * 1e3:.2f} ms, fp16 casts "
                      f"{p.wire_cast_s['fp16'] * 1e3:.2f} ms, evaluation {p.evaluate_s * 1e3:.2f} ms, skew "
                      f"{(p.skew_s if v == 'lockstep' else 0) * 1e3:.2f} ms", flush=True)

        # -- measurements -----------------------------------------------------------------
        for repeat in range(args.repeats):
            for model in models:
                for key, _, options in CONFIGS:
                    r = measure(args, model, key, options, epochs, args.seed, tmp / f"{model}-{key}-{repeat}")
                    report["models"][model]["runs"].append(r)
                    print(f"repeat {repeat} {model} {key}: {r['step_s'] * 1e3:.2f} ms/step ({r['steps_per_worker']} "
                          f"steps; compute {r['compute_per_step_s'] * 1e3:.2f}, wait {r['wait_per_step_s'] * 1e3:.2f} "
                          f"ms/step)", flush=True)
    load_average = load.done()

    # -- tables ---------------------------------------------------------------------------
    table, breakdown, goals = [], [], []
    for model in models:
        m = report["models"][model]
        m["summary"] = {}
        for key, label, _ in CONFIGS:
            runs = [r for r in m["runs"] if r["key"] == key]
            measured = statistics.median(r["step_s"] for r in runs)
            row = {"measured_s": measured, "measured_runs_s": [r["step_s"] for r in runs],
                   "measured_compute_s": statistics.median(r["compute_per_step_s"] for r in runs),
                   "measured_wait_s": statistics.median(r["wait_per_step_s"] for r in runs)}
            traced = [r["trace"] for r in runs if r.get("trace")]
            for part in ("compute", "spread", "after_last_backward"):
                row[f"trace_{part}_s"] = statistics.median(t[part] for t in traced) if traced else None
            for v in VARIANTS:
                predicted = m["predictions"][v][key]["step_s"]
                row[f"{v}_s"], row[f"{v}_ratio"] = predicted, predicted / measured
            row["within"] = abs(row[f"{PRIMARY}_ratio"] - 1) <= TOLERANCE
            m["summary"][key] = row
            spread = (f" ({min(row['measured_runs_s']) * 1e3:.1f}-{max(row['measured_runs_s']) * 1e3:.1f})"
                      if len(runs) > 1 else "")
            table.append([model, label, f"{measured * 1e3:.2f}{spread}",
                          *(f"{row[f'{v}_s'] * 1e3:.2f}" for v in VARIANTS),
                          *(f"{row[f'{v}_ratio']:.2f}" for v in VARIANTS),
                          "yes" if row["within"] else "NO"])
            p = m["predictions"][PRIMARY][key]
            ms = lambda v: "-" if v is None else f"{v * 1e3:.2f}"  # noqa: E731
            breakdown.append([model, key, ms(p["compute_s"]), ms(row["trace_compute_s"]), ms(p["exposed_comm_s"]),
                              ms(row["trace_after_last_backward_s"]), ms(row["trace_spread_s"]),
                              ms(p["evaluate_per_step_s"]), f"{p['messages']:g}"])
            if key in GOAL_KEYS:
                goals.append({"goal": f"{model} {key}: corrected prediction within +-{TOLERANCE:.0%} of the measured "
                                      f"step time", "measured": f"predicted/measured {row[f'{PRIMARY}_ratio']:.2f} "
                                      f"({row[f'{PRIMARY}_s'] * 1e3:.2f} vs {measured * 1e3:.2f} ms)",
                              "met": bool(row["within"])})
    report.update(machine=describe(), load_average=load_average, total_seconds=time.time() - started,
                  goals=goals)

    print(f"\npredicted vs measured step time: sync-sgd, {args.ranks} ranks on {args.cores} cores, ring, batch "
          f"{args.batch_size} per rank, {steps} steps per run, median of {args.repeats} run(s); network "
          f"{network.describe()}; load average {load_average['before'][0]:.1f} before, "
          f"{load_average['after'][0]:.1f} after")
    print(tabulate(table, headers=["model", "configuration", "measured ms (range)",
                                   *(f"pred ms {VARIANT_LABELS[v]}" for v in VARIANTS),
                                   *(f"ratio {VARIANT_LABELS[v]}" for v in VARIANTS), f"+-25% ({VARIANT_LABELS[PRIMARY]})"]))
    print(f"ratio = predicted / measured. x ranks/cores: the single-process compute (layers, update, casts, "
          f"evaluation) times {args.ranks}/{args.cores} = {factor:g}. concurrent: {args.ranks} processes profiled at "
          f"once with a spinning barrier before each step; + skew: and the slowest one's extra time per step "
          f"(predict's skew_s); the goal is judged on {VARIANT_LABELS[PRIMARY]}.")
    print(f"\nwhere the time goes, ms per step: prediction ({VARIANT_LABELS[PRIMARY]}) against the runs' traces "
          "(medians over "
          "steps, then over runs). compute: forward + backward + update (+ fp16 casts in the prediction; a run "
          "times them inside its wait), mean over ranks; exposed comm: predicted, and measured as the last "
          "all-reduce end - the last rank's backward end (the prediction's includes its skew term); spread: last - "
          "first rank's backward end")
    print(tabulate(breakdown, headers=["model", "configuration", "pred compute", "meas compute", "pred exposed comm",
                                       "meas exposed comm", "meas spread", "pred eval/step", "messages"]))
    print()
    print(tabulate([[g["goal"], g["measured"], "met" if g["met"] else "NOT met"] for g in goals],
                   headers=["goal", "measured", ""]))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=str))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
