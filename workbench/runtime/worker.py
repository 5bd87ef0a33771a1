"""The program every rank runs: ``python -m mpi4py -m workbench.runtime.worker --run-dir DIR``.

Reads ``DIR/config.json``, trains, and rank 0 writes ``DIR/summary.json``,
``DIR/metrics.jsonl`` and ``DIR/trace.json``. An exception on any rank propagates out and
``-m mpi4py`` aborts the whole job, so no rank is left waiting.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from contextlib import nullcontext
from pathlib import Path

# one thread per rank, decided before torch is imported (it reads this once, at import); the
# launchers set it already, this covers a rank started by hand
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from mpi4py import MPI

from ..config import RunConfig
from .context import Context
from .telemetry import busy_seconds, chrome_trace, exposed_comm_seconds, recording


def run_rank(cfg: RunConfig, comm: MPI.Comm, run_dir: Path | None, resume: Path | None = None,
             observers=()) -> dict | None:
    """Train on this rank; returns the summary on rank 0 (None elsewhere).

    ``observers``: :class:`~workbench.runtime.telemetry.Observer` objects that see every span
    and metric record as it happens (the notebook's live stream).
    """
    torch.set_num_threads(1)
    start = time.perf_counter()
    ctx = Context(cfg, comm, run_dir, observers)  # ends with a barrier: ctx.t0 is the common start
    setup = ctx.t0 - start
    algorithm = _algorithm(ctx)
    recorder = recording(ctx.telemetry) if ctx.telemetry else nullcontext()
    with recorder:
        final = algorithm.run(**({"resume_dir": resume} if resume else {}))
    wall = ctx.now()  # training only: imports, data loading and model set-up are `setup`
    return _finish(ctx, final, wall, setup, run_dir)


def _algorithm(ctx: Context):
    from ..optim import master, sync
    name, spec = ctx.cfg.algorithm, ctx.cfg.spec
    if not spec.master_based:
        return {"sync-sgd": sync.SyncSGD, "sync-easgd": sync.SyncEASGD}[name](ctx)
    if ctx.rank == 0:
        return master.Master(ctx)
    return master.ElasticWorker(ctx) if spec.elastic else master.GradientWorker(ctx)


def _finish(ctx: Context, final: torch.Tensor, wall: float, setup: float,
            run_dir: Path | None) -> dict | None:
    cfg, comm = ctx.cfg, ctx.comm
    events = ctx.telemetry.events if ctx.telemetry else []
    time_in = {cat: busy_seconds(events, (cat,)) for cat in ("compute", "comm", "wait", "io")}
    time_in["exposed_comm"] = exposed_comm_seconds(events)
    allreduce_bytes = sum(e["args"].get("bytes_sent", 0) for e in events
                          if e["name"].startswith("allreduce:"))
    mine = {"rank": ctx.rank, "wall": wall, "setup": setup, "time_in": time_in, "steps": ctx.steps_completed,
            "cancelled": ctx.cancelled,
            "bytes_sent": ctx.bytes_sent + allreduce_bytes, "metrics": ctx.metrics, "events": events}
    everyone = comm.gather(mine, root=0)
    if ctx.rank != 0:
        return None
    final_eval = ctx.evaluate(final, final=True)
    train = [m for r in everyone for m in r["metrics"] if m["kind"] == "train"]
    last_steps = sorted(train, key=lambda m: m["step"])[-max(1, cfg.workers * 5):]
    summary = {
        "algorithm": cfg.algorithm, "ranks": cfg.ranks, "workers": cfg.workers,
        "cancelled": any(r["cancelled"] for r in everyone),
        "config": cfg.to_dict(),
        "final_test_accuracy": final_eval["test_accuracy"],
        "final_test_loss": final_eval["test_loss"],
        "final_loss": sum(m["loss"] for m in last_steps) / len(last_steps) if last_steps else None,
        "wall_seconds": max(r["wall"] for r in everyone),  # training, from the common start
        "setup_seconds": max(r["setup"] for r in everyone),
        "steps": sum(r["steps"] for r in everyone),
        "steps_per_worker": max(r["steps"] for r in everyone),
        # communication share: time communicating or waiting and not computing, over wall
        # time, averaged over ranks (and over the training ranks only, without a master)
        "comm_fraction": _mean(r["time_in"]["exposed_comm"] / r["wall"] for r in everyone)
        if cfg.telemetry else None,
        "comm_fraction_workers": _mean(r["time_in"]["exposed_comm"] / r["wall"] for r in everyone
                                       if r["steps"] > 0) if cfg.telemetry else None,
        "time_in": {cat: _mean(r["time_in"][cat] for r in everyone)
                    for cat in ("compute", "comm", "wait", "io", "exposed_comm")},
        "bytes_sent": sum(r["bytes_sent"] for r in everyone),
        "parameters": ctx.flat.numel,
    }
    if cfg.spec.synchronous:
        summary["weights_checksum"] = hashlib.sha256(final.numpy().tobytes()).hexdigest()
    evals = [m for r in everyone for m in r["metrics"] if m["kind"] == "eval" and not m.get("final")]
    summary["evaluations"] = len(evals)
    if run_dir is not None:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
        with open(run_dir / "metrics.jsonl", "w") as f:
            for r in everyone:
                for m in r["metrics"]:
                    f.write(json.dumps(m) + "\n")
            f.write(json.dumps(final_eval) + "\n")
        trace = chrome_trace([e for r in everyone for e in r["events"]], [r["rank"] for r in everyone],
                             master=0 if cfg.spec.master_based else None)
        (run_dir / "trace.json").write_text(json.dumps(trace))
    return summary


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="workbench.runtime.worker")
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--resume", type=Path)
    args = parser.parse_args(argv)
    cfg = RunConfig.from_dict(json.loads((args.run_dir / "config.json").read_text()))
    summary = run_rank(cfg, MPI.COMM_WORLD, args.run_dir, args.resume)
    if summary is not None:
        print(json.dumps({k: summary[k] for k in ("algorithm", "final_test_accuracy", "wall_seconds",
                                                   "comm_fraction")}), flush=True)


if __name__ == "__main__":
    main()
