"""Peer: workbench sync-sgd against PyTorch DistributedDataParallel (gloo) on the same model,
data shards, batches and ranks, in one mpiexec job. Prints median step times and their ratio and
writes them as JSON (default benchmarks/results/ddp_peer_<ranks>ranks.json).

    python benchmarks/ddp_peer.py [--ranks 4] [--model wide_mlp] [--dataset digits] [--batch-size 32] [--steps 40]
                                  [--vcluster NAME] [--json FILE]

``--vcluster NAME``: the ranks run on the nodes of a virtual cluster that is up (``workbench vcluster up
NAME``), one per node (``--ppn``); gloo meets at rank 0's node address on ``eth0``
(:func:`workbench.ports.torch_init_method`).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def placement(name: str | None, ranks: int, job_dir: Path, ppn: int = 1) -> dict:
    """``run_mpi`` keywords that put the ranks on the nodes of the virtual cluster ``name`` (none: here)."""
    if name is None:
        return {}
    from workbench.vcluster import VirtualCluster
    return VirtualCluster.attach(name).run_options(ranks, ppn, job_dir=job_dir)


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
    cfg = RunConfig(algorithm="sync-sgd", ranks=comm.Get_size(), model=args.model, dataset=args.dataset,
                    batch_size=args.batch_size,
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

    from workbench.ports import torch_init_method
    dist.init_process_group("gloo", init_method=torch_init_method(comm), rank=comm.Get_rank(),
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
              f"batch {args.batch_size} per rank, median of {args.steps} steps, slowest rank")
        print(tabulate([["workbench sync-sgd (" + args.collective + ", one flat buffer)", f"{t_ours * 1e3:.2f}"],
                        ["torch DDP, gloo backend", f"{t_ddp * 1e3:.2f}"],
                        ["ratio workbench / DDP", f"{t_ours / t_ddp:.2f}"]], headers=["", "ms/step"]))
        out = Path(args.json or RESULTS / f"ddp_peer_{comm.Get_size()}ranks.json")
        out.write_text(json.dumps({"model": args.model, "dataset": args.dataset, "batch_size": args.batch_size,
                                   "parameters": params, "ranks": comm.Get_size(),
                                   "collective": args.collective, "steps": args.steps, "ours_s": t_ours,
                                   "ddp_s": t_ddp, "ratio": t_ours / t_ddp, "machine": describe(),
                                   "vcluster": args.vcluster, "link_rate": args.link_rate,
                                   "load_average": load.done()}, indent=1))
        print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--model", default="wide_mlp")
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--collective", default="auto")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--vcluster", help="run the ranks on this virtual cluster's nodes (one that is up)")
    parser.add_argument("--ppn", type=int, default=1, help="with --vcluster: ranks per node")
    parser.add_argument("--json", help="where the JSON goes (default benchmarks/results/ddp_peer_<ranks>ranks.json)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--link-rate", help=argparse.SUPPRESS)  # the cluster's, for the JSON (set by main)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    from workbench.runtime.launch.launcher import run_mpi
    forwarded = [a for a in sys.argv[1:] if a != "--worker"]
    job_dir = None
    if args.vcluster:  # the job's folder must be one the nodes see: the cluster's shared folder
        from workbench.vcluster import VirtualCluster
        from workbench.vcluster.plan import format_rate
        vc = VirtualCluster.attach(args.vcluster)
        job_dir = vc.shared / "jobs"
        forwarded += ["--link-rate", format_rate(vc.plan.bandwidth)]
    run_mpi(args.ranks, [str(Path(__file__).resolve()), "--worker", *forwarded], stream=True, timeout=900,
            **placement(args.vcluster, args.ranks, job_dir, args.ppn))


if __name__ == "__main__":
    main()
