"""Peer: workbench sync-sgd against PyTorch DistributedDataParallel (gloo) on the same model,
data shards, batches and ranks, in one mpiexec job. Prints median step times and their ratio and
writes them as JSON (default benchmarks/results/ddp_peer_<ranks>ranks.json).

    python benchmarks/ddp_peer.py [--ranks 4] [--model wide_mlp] [--steps 40] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def worker(args) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from mpi4py import MPI
    from tabulate import tabulate

    from workbench.bench.machine import Load, describe
    from workbench.config import RunConfig
    from workbench.optim.sync import SyncSGD
    from workbench.runtime.rank.context import Context

    torch.set_num_threads(1)
    load = Load()
    comm = MPI.COMM_WORLD
    cfg = RunConfig(algorithm="sync-sgd", ranks=comm.Get_size(), model=args.model, batch_size=32,
                    epochs=50, collective=args.collective, telemetry=False)
    ctx = Context(cfg, comm, None)
    ours = SyncSGD(ctx)

    def timed(step_fn, steps):
        times = []
        for step in range(steps + 5):
            comm.Barrier()
            start = time.perf_counter()
            step_fn(step)
            times.append(time.perf_counter() - start)
        local = statistics.median(times[5:])  # 5 warm-up steps
        return max(comm.allgather(local))  # the slowest rank's median

    t_ours = timed(ours.step, args.steps)

    from workbench.runtime.launch.ports import free_port
    port = comm.bcast(free_port() if comm.Get_rank() == 0 else None)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=comm.Get_rank(),
                            world_size=comm.Get_size())
    torch.manual_seed(cfg.seed)
    from workbench import models
    model = models.build(cfg.model, ctx.data.num_features, ctx.data.num_classes)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=cfg.hyper.lr, momentum=cfg.hyper.momentum)

    def ddp_step(step):
        X, y = ctx.batches.batch(step)
        opt.zero_grad()
        F.cross_entropy(ddp(X), y).backward()  # DDP all-reduces 25 MB buckets during backward
        opt.step()

    t_ddp = timed(ddp_step, args.steps)
    dist.destroy_process_group()
    if comm.Get_rank() == 0:
        params = ctx.flat.numel
        print(f"sync-sgd vs DDP (gloo): {args.model} ({params:,} parameters), {comm.Get_size()} ranks, "
              f"batch 32 per rank, median of {args.steps} steps, slowest rank")
        print(tabulate([["workbench sync-sgd (" + args.collective + ", one flat buffer)", f"{t_ours * 1e3:.2f}"],
                        ["torch DDP, gloo backend", f"{t_ddp * 1e3:.2f}"],
                        ["ratio workbench / DDP", f"{t_ours / t_ddp:.2f}"]], headers=["", "ms/step"]))
        out = Path(args.json or RESULTS / f"ddp_peer_{comm.Get_size()}ranks.json")
        out.write_text(json.dumps({"model": args.model, "parameters": params, "ranks": comm.Get_size(),
                                   "collective": args.collective, "steps": args.steps, "ours_s": t_ours,
                                   "ddp_s": t_ddp, "ratio": t_ours / t_ddp, "machine": describe(),
                                   "load_average": load.done()}, indent=1))
        print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--model", default="wide_mlp")
    parser.add_argument("--collective", default="auto")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--json", help="where the JSON goes (default benchmarks/results/ddp_peer_<ranks>ranks.json)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    from workbench.runtime.launch.mpiexec import run_mpi
    forwarded = [a for a in sys.argv[1:] if a != "--worker"]
    run_mpi(args.ranks, [str(Path(__file__).resolve()), "--worker", *forwarded], stream=True, timeout=900)


if __name__ == "__main__":
    main()
