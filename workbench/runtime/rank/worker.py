"""The program every rank runs: ``python -m mpi4py -m workbench.runtime.rank.worker --run-dir DIR``.

Reads ``DIR/config.json``, trains, and rank 0 writes ``DIR/summary.json``,
``DIR/metrics.jsonl`` and ``DIR/trace.json``. An exception on any rank propagates out and
``-m mpi4py`` aborts the whole job, so no rank is left waiting.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import time
import traceback
from contextlib import nullcontext
from pathlib import Path

# one thread per rank, decided before torch is imported (it reads this once, at import); the
# launchers set it already, this covers a rank started by hand
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from mpi4py import MPI

from ...config import RunConfig
from ...summary import Summary, build_summary, rank_report
from ...telemetry import chrome_trace, recording
from ..launch.blame import NOT_ONE_JOB
from ..live import LIVE_FOLDER, LiveChannel, LiveFile
from .context import Context


def run_rank(cfg: RunConfig, comm: MPI.Comm, run_dir: Path | None, resume: Path | None = None,
             observers=(), live: LiveChannel | None = None) -> Summary | None:
    """Train on this rank; returns the summary on rank 0 (None elsewhere).

    ``live``: the run's live channel (:mod:`workbench.runtime.live`: the ranks' live files for a batch
    run, the signed stream for a notebook's): it gets the rank's plan, every span and metric record as it
    happens, the traceback the moment the rank raises, and how it ended. ``observers``: more
    :class:`~workbench.telemetry.Observer` objects that see every span and metric record.
    """
    torch.set_num_threads(1)
    start = time.perf_counter()
    try:
        # the registry names each rank's class; importing it (the algorithms and the communication
        # stack: tens of ms) is set-up, before the common start
        implementation = cfg.spec.implementation_class(comm.Get_rank())
        ctx = Context(cfg, comm, run_dir, [*observers, *([live] if live is not None else [])])
        setup = ctx.t0 - start  # Context ends with a barrier: ctx.t0 is the common start
        if live is not None:
            live.plan(ctx.steps)
        algorithm = implementation(ctx)
        # a master-based run's reports travel apart from its exchanges: the master, serving, takes any message
        reports = comm.Dup() if cfg.spec.master_based else comm
        recorder = recording(ctx.telemetry) if ctx.telemetry else nullcontext()
        with recorder:
            final = algorithm.run(**({"resume_dir": resume} if resume else {}))
        wall = ctx.now()  # training only: imports, data loading and model set-up are `setup`
        summary = _finish(ctx, final, wall, setup, run_dir, reports, lost=getattr(algorithm, "lost", ()))
    except BaseException as exc:  # the rank's records and traceback go out before -m mpi4py aborts the job
        if live is not None:
            live.error(f"rank {comm.Get_rank()} failed: {exc!r}\n" + traceback.format_exc())
            live.close("failed")
        raise
    if live is not None:
        live.close("finished")
    return summary


def _finish(ctx: Context, final: torch.Tensor, wall: float, setup: float,
            run_dir: Path | None, reports: MPI.Comm, lost=()) -> Summary | None:
    """Rank 0 gathers every rank's report over ``reports`` (but those of the ``lost`` ranks) and writes the
    run's files."""
    cfg, comm = ctx.cfg, ctx.comm
    events = ctx.telemetry.events if ctx.telemetry else []
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    mine = rank_report(ctx.rank, wall, setup, ctx.steps_completed, ctx.cancelled, ctx.metrics, events,
                       ctx.traffic.as_dict(), {"data_bytes": ctx.data.nbytes, "max_rss_bytes": peak})
    everyone = gather_reports(reports, cfg.spec.master_based, mine, lost)
    if ctx.rank != 0:
        return None
    final_eval = ctx.evaluate(final, final=True)
    checksum = hashlib.sha256(final.numpy().tobytes()).hexdigest() if cfg.spec.synchronous else None
    summary = build_summary(cfg, everyone, final_eval, ctx.flat.numel, weights_checksum=checksum)
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


#: the tag of a worker's report to its master at the end of a master-based run
TAG_REPORT = 14


def gather_reports(comm: MPI.Comm, master_based: bool, mine, lost=()) -> list | None:
    """Every rank's report on rank 0 (None elsewhere): a gather for the lock-step family; in a master-based
    run each worker sends its report to the master, which takes those of the workers not ``lost`` (a
    collective would wait for a rank whose process failed)."""
    if not master_based:
        return comm.gather(mine, root=0)
    if comm.Get_rank() != 0:
        comm.send(mine, dest=0, tag=TAG_REPORT)
        return None
    return [mine] + [comm.recv(source=r, tag=TAG_REPORT) for r in range(1, comm.Get_size()) if r not in lost]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="workbench.runtime.rank.worker")
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--resume", type=Path)
    args = parser.parse_args(argv)
    cfg = RunConfig.from_dict(json.loads((args.run_dir / "config.json").read_text()))
    size = MPI.COMM_WORLD.Get_size()
    if size != cfg.ranks:  # e.g. srun without a PMI this MPI uses: every task is rank 0 of 1
        raise SystemExit(f"{NOT_ONE_JOB}: this rank is rank {MPI.COMM_WORLD.Get_rank()} of {size}, "
                         f"the run has {cfg.ranks} ranks")
    live = LiveFile(args.run_dir / LIVE_FOLDER, MPI.COMM_WORLD.Get_rank())
    summary = run_rank(cfg, MPI.COMM_WORLD, args.run_dir, args.resume, live=live)
    if summary is not None:
        print(json.dumps({k: summary[k] for k in ("algorithm", "final_test_accuracy", "wall_seconds",
                                                   "comm_fraction")}), flush=True)


if __name__ == "__main__":
    main()
