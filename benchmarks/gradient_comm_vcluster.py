"""GradientFlow's strategies on a virtual cluster: 4 nodes on a switch, one rank per node, at a link
rate where the gradient exchange dominates the step (issue 24, "GradientFlow on the virtual cluster").

Rows, per model (every one a whole ``sync-sgd`` run of a few tens of steps, one job each, through
:func:`workbench.runtime.launch.batch.train` with ``vcluster=``; rows in a seeded shuffled order):

- the fusion sweep, all with overlap: one message per tensor (``fusion_bytes=0``), thresholds
  256K, 1M, 4M, 25M, and one message per step (``inf``);
- fp16 on the wire, one message per step (against ``fusion-inf``: the same buckets in fp32);
- CSC at rho 0.1 and 0.01 (``sparse_chunk`` 64, no warm-up: the steady state), one message per step;
- GradientFlow's combination (the ``gradientflow`` preset: fusion 1M, overlap, fp16, CSC 0.1) without
  warm-up;
- torch DDP (gloo, 25 MB buckets, all-reduces during backward) on the same nodes, model, shards,
  batches and loop (``gradient_comm.py``'s DDP worker, its ranks placed on the nodes too).

Every workbench row runs the ``ring`` schedule (GradientFlow's all-reduce, and what fp16 runs anyway:
MPI has no fast fp16 sum), so fp16 and fp32 differ in bytes only.

Columns. **Step time**: from the ranks' train records (``metrics.jsonl``: the time each step's
backward ended), the interval between consecutive steps, the slowest rank's per step, median over
the steps after the first two (first messages, DDP's bucket rebuild); the final evaluations are
outside it. **Communication per step**: ``summary.json``'s ``time_in`` (the union of the ranks'
``comm`` spans, each ``iallreduce`` from issue to completion; and ``exposed_comm``, not hidden
behind compute) over the steps; DDP has no spans. **Bytes**: ``wire_bytes_per_step`` from
workbench's counter (DDP: the ring formula 2(n-1)/n x 4 x parameters); **link bytes**: what the
shaped links counted (``tc``) during the run, over both ends of each link, per rank and step, as a
check of the counter.

The calibration for ``workbench predict``: ring all-reduces timed on the same cluster (``workbench
bench allreduce --vcluster``), fitted by :func:`workbench.netsim.calibration.calibrate` on
``fully_connected:4`` (a switch: every rank its own port).

    python benchmarks/gradient_comm_vcluster.py [--models resnet18,alexnet] [--only ROW,...] [--steps N]
                                                [--rounds R] [--rate RATE] [--no-calibrate] [--name PREFIX]
                                                [--json FILE] [--resume]

Writes benchmarks/results/gradient_comm_vcluster.json (machine, load, link rates, nodes, every run).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ddp_peer import RESULTS  # benchmarks/ is sys.path[0]

from workbench.bench.machine import Load, describe

ROOT = RESULTS.parent.parent
K, M = 1 << 10, 1 << 20
#: per model: data set, link rate, batch per rank and steps. The rate makes one dense fp32 exchange
#: (2(n-1)/n x 4 x parameters per rank: resnet18 67 MB, alexnet 367 MB) take 23-25 s (at about 0.93 of
#: the link rate: TCP's headers), several times the compute of a step at batch 1 on this shared 2-core
#: machine (3-5 s under a load of 15-20: 4 ranks time-slicing 2 cores beside other jobs), so the step
#: is >= 80% exchange: GradientFlow's regime, where its strategies matter. (fp16 can at best take
#: 1 - share/2 of fp32's step: <= 0.6 needs a share >= 0.8; at 50mbit resnet18's share was 0.75.)
STUDIES = {
    "resnet18": {"dataset": "fashion-mnist", "rate": "25mbit", "batch": 1, "steps": 12,
                 "fusion": [0, 256 * K, M, 4 * M, 25 * M, None]},
    "alexnet": {"dataset": "synthetic-imagenet", "rate": "125mbit", "batch": 1, "steps": 10,
                "fusion": [0, M, 4 * M, 25 * M, None]},
}
NODES = 4
#: steps whose interval is left out of the step time (first messages, DDP's bucket rebuild)
SKIP_STEPS = 2
#: the all-reduce sizes timed for the calibration (bytes)
CALIBRATION_SIZES = "256K,1M,4M,16M"


def fusion_key(fusion: int | None) -> str:
    if fusion is None:
        return "fusion-inf"
    if fusion == 0:
        return "per-tensor"
    return f"fusion-{fusion // M}M" if fusion % M == 0 else f"fusion-{fusion // K}K"


def rows(model: str) -> list[tuple[str, dict | None]]:
    """(key, RunConfig changes) of a model's study; ``None``: the DDP row."""
    out = [(fusion_key(f), {"fusion_bytes": f, "overlap": True}) for f in STUDIES[model]["fusion"]]
    one = {"fusion_bytes": None, "overlap": True}
    out += [("fp16", {**one, "wire_dtype": "fp16"}),
            ("csc-0.1", {**one, "sparse_ratio": 0.1, "warmup_epochs": 0}),
            ("csc-0.01", {**one, "sparse_ratio": 0.01, "warmup_epochs": 0}),
            # the gradientflow preset's options without its warm-up (a field at its default cannot
            # override a preset: RunConfig(communication="gradientflow", warmup_epochs=0) keeps 1)
            ("gradientflow", {"fusion_bytes": M, "overlap": True, "wire_dtype": "fp16", "sparse_ratio": 0.1,
                              "warmup_epochs": 0}),
            ("ddp", None)]
    return out


def base_config(model: str, steps: int) -> dict:
    study = STUDIES[model]
    rows_needed = steps * study["batch"] * NODES  # one epoch of `steps` steps; as many test rows
    return dict(algorithm="sync-sgd", ranks=NODES, model=model, dataset=study["dataset"], subset=rows_needed,
                batch_size=study["batch"], epochs=1, eval_every=10**6, collective="ring", seed=0, telemetry=True)


def step_seconds(run_dir: Path) -> list[float]:
    """Per step, from the third on: the slowest rank's interval (:func:`workbench.results.step_seconds`)."""
    from workbench.results import history_frame, step_seconds as from_history
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return from_history(history_frame(records), skip=SKIP_STEPS)


def run_row(vc, model: str, key: str, changes: dict | None, steps: int, folder: Path, timeout: float) -> dict:
    """One run on ``vc``: its step time, communication time, bytes and link bytes."""
    from gradient_comm import ddp_traffic, launch_ddp

    from workbench.config import RunConfig
    from workbench.runtime.launch.batch import train

    run_dir = folder / f"{model}-{key}-{time.time_ns()}"
    link_before, started = vc.bytes_sent(), time.monotonic()
    if changes is None:
        cfg = RunConfig(**base_config(model, steps), fusion_bytes=None, overlap=False)
        done, failures = launch_ddp(cfg, run_dir, None, None, 2, timeout, vcluster=vc)
        summary = json.loads((done / "summary.json").read_text())
        label, run_dir = "torch DDP (gloo), 25 MB buckets", done
        summary["wire_bytes_per_step"] = ddp_traffic([(summary["parameters"],)], NODES, None, None)["dense"]
    else:
        cfg = RunConfig(**base_config(model, steps), **changes)
        summary, failures = train(cfg, run_dir, vcluster=vc, ppn=1, timeout=timeout), []
        label = "workbench " + cfg.communication_options.describe()
    link = vc.bytes_sent() - link_before
    intervals, done_steps = step_seconds(run_dir), summary["steps_per_worker"]
    time_in = summary.get("time_in", {}) if changes is not None else {}
    return {"model": model, "key": key, "label": label, "step_s": statistics.median(intervals),
            "step_s_each": intervals, "steps": done_steps, "wall_seconds": summary["wall_seconds"],
            "setup_seconds": summary["setup_seconds"], "job_seconds": time.monotonic() - started,
            "comm_s_per_step": time_in["comm"] / done_steps if time_in else None,
            "exposed_comm_s_per_step": time_in["exposed_comm"] / done_steps if time_in else None,
            "compute_s_per_step": time_in["compute"] / done_steps if time_in else None,
            "comm_fraction": summary.get("comm_fraction") if changes is not None else None,
            "wire_bytes_per_step": summary["wire_bytes_per_step"],
            "dense_wire_bytes_per_step": summary.get("dense_wire_bytes", 0) / done_steps or None,
            "bytes_from_formula": changes is None, "messages_per_step": summary.get("messages_per_step"),
            "link_bytes": link, "link_bytes_per_rank_step": link / 2 / NODES / done_steps,
            "skipped_steps": summary.get("skipped_steps", 0), "parameters": summary["parameters"],
            "options": cfg.communication_options.to_dict() if changes is not None else {"ddp": "gloo"},
            "failed_attempts": failures}


def calibrate_on(vc, model: str, out: Path, timeout: float) -> dict:
    """Ring all-reduces timed on ``vc`` (``workbench bench allreduce --vcluster``) and their fit."""
    from workbench.netsim.calibration import calibrate
    from workbench.network.topology import fully_connected
    cmd = [sys.executable, "-m", "workbench.cli", "bench", "allreduce", "--vcluster", vc.name, "--ranks", str(NODES),
           "--algorithms", "ring", "--sizes", CALIBRATION_SIZES, "--no-gloo", "--repetitions", "3",
           "--warmup", "1", "--json", str(out), "--timeout", str(timeout)]
    subprocess.run(cmd, check=True, timeout=timeout + 60, stdout=subprocess.DEVNULL, cwd=ROOT)
    cal = calibrate(out, fully_connected(NODES))
    return {"file": str(out.relative_to(ROOT)), "command": " ".join(["workbench", *cmd[3:]]),
            "link_latency_s": cal.link_latency, "link_bandwidth_Bps": cal.link_bandwidth,
            "table": cal.table.to_dict(orient="records")}


def study(model: str, args, log, done: dict | None, save) -> dict:
    """Bring up the model's cluster, run its rows ``args.rounds`` times (shuffled), calibrate, take it
    down. ``done``: this study as a partial file left it (``--resume``: its runs and calibration are
    kept, not run again); ``save(study)`` is called after every run and the calibration."""
    from workbench.vcluster import VirtualCluster
    from workbench.vcluster.plan import format_rate
    spec, rate = STUDIES[model], args.rate or STUDIES[model]["rate"]
    result = {"model": model, "dataset": spec["dataset"], "link_rate": rate, "nodes": NODES, "topology": "switch",
              "ranks_per_node": 1, "batch_per_rank": spec["batch"], "steps": args.steps or spec["steps"],
              "collective": "ring", "calibration": None, "runs": []}
    if done is not None:
        if (done["link_rate"], done["steps"]) != (rate, result["steps"]):
            raise SystemExit(f"--resume: {model} in the file ran at {done['link_rate']}, {done['steps']} steps")
        result.update(calibration=done.get("calibration"), runs=list(done["runs"]))
    have = {(r["key"], r["round"]) for r in result["runs"]}
    chosen = [r for r in rows(model) if args.only is None or r[0] in args.only]
    todo = [(round_, key, changes) for round_ in range(args.rounds)
            for key, changes in random.Random(round_).sample(chosen, len(chosen)) if (key, round_) not in have]
    if not todo and (result["calibration"] or not args.calibrate):
        return result
    # keep=True: the record names no owner, so no other process's `up` takes this one for a dead
    # process's and removes it mid-run; it is taken down in `finally`
    vc = VirtualCluster(f"{args.name}{model[:3]}{os.getpid() % 1000}"[:8], nodes=NODES, topology="switch",
                        bandwidth=rate, keep=True)
    vc.up()
    result["link_rate"], result["link_rate_bits"] = format_rate(vc.plan.bandwidth), vc.plan.bandwidth
    try:
        with tempfile.TemporaryDirectory(prefix="gflow-", dir=vc.shared) as tmp:
            for round_, key, changes in todo:
                r = run_row(vc, model, key, changes, result["steps"], Path(tmp), args.timeout)
                result["runs"].append({**r, "round": round_})
                save(result)
                log(f"{model} {key}: {r['step_s']:.2f} s/step, comm {r['comm_s_per_step'] or 0:.2f} s/step, "
                    f"{r['wire_bytes_per_step'] / 1e6:.2f} MB/step, link {r['link_bytes_per_rank_step'] / 1e6:.2f}"
                    f" MB/rank/step ({r['job_seconds']:.0f} s)")
        if args.calibrate and not result["calibration"]:
            result["calibration"] = calibrate_on(vc, model, RESULTS / f"gradient_comm_vcluster_allreduce_{model}.json",
                                                 args.timeout)
            save(result)
    finally:
        vc.down()
    return result


# -- the scale-out prediction ------------------------------------------------------------------
#: what ``workbench predict`` is asked, per set of options: dense fp32 one message per tensor (the
#: open-source systems' baseline), the gradientflow preset, and docs/papers.md's combination
PREDICT_OPTIONS = {
    "dense per-tensor": ["--fusion-bytes", "0", "--no-overlap"],
    "gradientflow preset (1M, overlap, fp16, CSC 0.1)": ["--communication", "gradientflow"],
    "64M, overlap, fp16, CSC 0.01": ["--fusion-bytes", "64M", "--overlap", "--wire-dtype", "fp16",
                                     "--sparse-ratio", "0.01"],
}
PREDICT_RANKS = "1,4,64,512"


def cpu_profile(model: str, compute_s: float, out: Path) -> dict:
    """The model's per-layer profile at batch 1 on this CPU (one process), scaled so that forward +
    backward equals ``compute_s``, the compute per step the cluster's ranks measured (4 ranks
    time-slicing 2 cores under the machine's load), written as ``workbench predict --profile`` CSV."""
    import dataclasses

    from workbench.bench.layers import profile_builtin, write_profile_csv
    layers = profile_builtin(model, 1, dataset=STUDIES[model]["dataset"], repeats=5, warmup=1, statistic="mean")
    alone = sum(l.forward_s + l.backward_s for l in layers)
    scale = compute_s / alone
    write_profile_csv([dataclasses.replace(l, forward_s=l.forward_s * scale, backward_s=l.backward_s * scale)
                       for l in layers], out)
    return {"file": str(out.relative_to(ROOT)), "one_process_s": alone, "scaled_to_s": compute_s}


def predict_rows(source: list[str], calibration: str | None) -> dict[str, dict]:
    """``workbench predict`` for each of :data:`PREDICT_OPTIONS`: the command and its JSON rows."""
    out = {}
    network = (["--calibration", calibration, "--calibration-topology", f"fully_connected:{NODES}"]
               if calibration else [])
    for name, options in PREDICT_OPTIONS.items():
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            cmd = ["predict", *source, *network, "--ranks", PREDICT_RANKS, *options, "--json", f.name]
            subprocess.run([sys.executable, "-m", "workbench.cli", *cmd], check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
            report = json.loads(Path(f.name).read_text())
        out[name] = {"command": "workbench " + " ".join(c for c in cmd[:-2]), "network": report["network"],
                     "rows": {r["ranks"]: {k: r[k] for k in ("step_s", "comm_share", "speedup", "efficiency")}
                              for r in report["rows"]}}
    return out


def predictions(studies: dict[str, dict]) -> dict:
    """GradientFlow's scaling claim through the predictor: AlexNet on GPUs (the paper's compute) over
    links fitted on the alexnet cluster and over the paper's 56 Gbit/s; and each model as measured here
    (this CPU's compute) over its own cluster's fitted links, at 4 ranks beside the measured step."""
    out = {"paper_network": predict_rows(["--model", "alexnet"], None)}
    for model, s in studies.items():
        cal = s.get("calibration")
        if not cal:
            continue
        dense = [r for r in s["runs"] if r["key"] == "fusion-inf"]
        if model == "alexnet":
            out["alexnet_gpu_on_vcluster_links"] = predict_rows(["--model", "alexnet"], cal["file"])
        if dense:
            csv = RESULTS / f"gradient_comm_vcluster_profile_{model}.csv"
            profile = cpu_profile(model, statistics.median(r["compute_s_per_step"] for r in dense), csv)
            out[f"{model}_cpu_on_vcluster_links"] = {"profile": profile,
                                                     **predict_rows(["--profile", profile["file"]], cal["file"])}
    return out


# -- summary, goals, table ---------------------------------------------------------------------
def aggregate(runs: list[dict]) -> dict:
    """One row of the table: medians over the rounds of one model's row."""
    def median(key):
        values = [r[key] for r in runs if r[key] is not None]
        return statistics.median(values) if values else None
    keys = ("step_s", "comm_s_per_step", "exposed_comm_s_per_step", "compute_s_per_step", "comm_fraction",
            "wire_bytes_per_step", "dense_wire_bytes_per_step", "messages_per_step", "link_bytes_per_rank_step")
    return {"model": runs[0]["model"], "key": runs[0]["key"], "label": runs[0]["label"], "rounds": len(runs),
            "step_s_each_round": [r["step_s"] for r in runs], "bytes_from_formula": runs[0]["bytes_from_formula"],
            **{k: median(k) for k in keys}}


def goals(rows: dict[str, dict]) -> list[dict]:
    """The issue's goals for one model, each with what was measured and whether it was met."""
    out = []

    def add(goal: str, measured: str, met: bool) -> None:
        out.append({"goal": goal, "measured": measured, "met": met})
    step = {k: r["step_s"] for k, r in rows.items()}
    fused = {k: v for k, v in step.items() if k.startswith("fusion-")}
    if "per-tensor" in step and fused:
        best = min(fused, key=fused.get)
        ratio = fused[best] / step["per-tensor"]
        add("best fusion <= 0.8 of per-tensor step time (overlap on)",
            f"{ratio:.2f} ({best} {fused[best]:.2f} s vs per-tensor {step['per-tensor']:.2f} s; "
            + ", ".join(f"{k} {v / step['per-tensor']:.2f}" for k, v in fused.items()) + ")", ratio <= 0.8)
    if "fp16" in step and "fusion-inf" in step:
        ratio, share = step["fp16"] / step["fusion-inf"], rows["fusion-inf"]["comm_fraction"]
        add("fp16 on the wire <= 0.6 of fp32 step time where communication-bound",
            f"{ratio:.2f} ({step['fp16']:.2f} vs {step['fusion-inf']:.2f} s; fp32's communication share "
            f"{share:.0%}; bytes {rows['fp16']['wire_bytes_per_step'] / rows['fusion-inf']['wire_bytes_per_step']:.3f})",
            ratio <= 0.6)
    for key in ("csc-0.1", "csc-0.01"):
        if key in rows and "fusion-inf" in rows and rows[key]["comm_s_per_step"]:
            c, d = rows[key], rows["fusion-inf"]
            ratio = d["comm_s_per_step"] / c["comm_s_per_step"]
            add(f"{key}: >= 4x shorter communication than dense",
                f"{ratio:.1f}x ({c['comm_s_per_step']:.2f} vs {d['comm_s_per_step']:.2f} s/step in comm spans; "
                f"bytes {d['wire_bytes_per_step'] / c['wire_bytes_per_step']:.1f}x fewer; step "
                f"{d['step_s'] / c['step_s']:.1f}x shorter)", ratio >= 4)
    if "ddp" in step:
        ours = {k: v for k, v in step.items() if k.startswith("fusion-") or k == "per-tensor"}
        best = min(ours, key=ours.get)
        ratio = ours[best] / step["ddp"]
        add("sync-sgd (dense fp32) step <= 0.5 of torch DDP's (gloo) on the same nodes",
            f"{ratio:.2f} (best: {best} {ours[best]:.2f} s vs DDP {step['ddp']:.2f} s; fusion-inf "
            f"{step.get('fusion-inf', float('nan')) / step['ddp']:.2f})", ratio <= 0.5)
    return out


def table(rows: dict[str, dict]) -> list[list]:
    """The README's table of one model: a line per row."""
    base = rows.get("fusion-inf") or next(iter(rows.values()))
    out = []
    for r in rows.values():
        comm = r["comm_s_per_step"]
        out.append([r["key"], f"{r['step_s']:.2f}", f"{r['step_s'] / base['step_s']:.2f}",
                    f"{comm:.2f}" if comm is not None else "-",
                    f"{r['exposed_comm_s_per_step']:.2f}" if r["exposed_comm_s_per_step"] is not None else "-",
                    f"{r['wire_bytes_per_step'] / 1e6:.2f}" + ("*" if r["bytes_from_formula"] else ""),
                    f"{r['link_bytes_per_rank_step'] / 1e6:.2f}",
                    f"{r['messages_per_step']:.0f}" if r["messages_per_step"] is not None else "-"])
    return out


TABLE_HEADERS = ["row", "s/step", "vs fusion-inf", "comm s/step", "exposed comm s/step", "MB/step/rank",
                 "link MB/step/rank", "messages/step"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="resnet18,alexnet")
    parser.add_argument("--only", type=lambda t: set(t.split(",")), help="comma-separated row keys (default: all)")
    parser.add_argument("--steps", type=int, help="steps per run (default: the model's, 12 resnet18, 10 alexnet)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of every row (medians over them)")
    parser.add_argument("--no-calibrate", dest="calibrate", action="store_false",
                        help="skip the all-reduce calibration and the predictions")
    parser.add_argument("--rate", help="every model's link rate (tc's units, 1gbit) instead of its own (STUDIES)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds one run may take")
    parser.add_argument("--name", default="g", help="the clusters' name prefix (a lower-case letter first)")
    parser.add_argument("--json", type=Path, default=RESULTS / "gradient_comm_vcluster.json")
    parser.add_argument("--resume", action="store_true",
                        help="keep the runs and calibrations --json holds (a partial file) and run the rest")
    args = parser.parse_args()
    from tabulate import tabulate

    load, started = Load(), time.time()
    log = lambda text: print(time.strftime("%H:%M:%S ") + text, flush=True)  # noqa: E731
    earlier = json.loads(args.json.read_text()) if args.resume and args.json.exists() else {}
    studies = {}

    def save(result: dict) -> None:  # a partial file after every run: --resume goes on from it
        studies[result["model"]] = result
        args.json.write_text(json.dumps({"partial": True, "studies": studies}, indent=1))
    for model in args.models.split(","):
        studies[model] = study(model, args, log, earlier.get("studies", {}).get(model), save)
        by_key = {}
        for r in studies[model]["runs"]:
            by_key.setdefault(r["key"], []).append(r)
        studies[model]["rows"] = {k: aggregate(v) for k, v in by_key.items()}
        studies[model]["goals"] = goals(studies[model]["rows"])
    predicted = predictions(studies) if args.calibrate else None
    load_average = load.done()
    for model, s in studies.items():
        print(f"\n{model} on {s['nodes']} nodes (switch, {s['link_rate']}), batch {s['batch_per_rank']} per rank, "
              f"{s['steps']} steps, ring; load average {load_average['before'][0]:.1f} before, "
              f"{load_average['after'][0]:.1f} after")
        print(tabulate(table(s["rows"]), headers=TABLE_HEADERS, tablefmt="github"))
        print(tabulate([[g["goal"], g["measured"], "met" if g["met"] else "NOT met"] for g in s["goals"]],
                       headers=["goal", "measured", ""], tablefmt="github"))
    if predicted:
        for where, by_options in predicted.items():
            print(f"\nworkbench predict, {where}:")
            print(tabulate([[name, *(f"{p['rows'][n]['speedup']:.1f}x" for n in (4, 64, 512))]
                            for name, p in by_options.items() if name != "profile"],
                           headers=["options", "4 ranks", "64 ranks", "512 ranks"], tablefmt="github"))
    import torch
    args.json.write_text(json.dumps({
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime(started)), "total_seconds": time.time() - started,
        "machine": describe(), "load_average": load_average, "cpus": os.cpu_count(), "torch": torch.__version__,
        "command": " ".join(["python", *sys.argv]), "studies": studies, "predictions": predicted,
        # --resume: the invocations whose runs this file keeps (their date, load and command)
        "earlier_invocations": earlier.get("earlier_invocations", []) + (
            [{k: earlier[k] for k in ("date_utc", "total_seconds", "load_average", "command")}]
            if "command" in earlier else [])}, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
