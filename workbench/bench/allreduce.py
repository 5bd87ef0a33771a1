"""All-reduce benchmark, run on every rank under mpiexec (``workbench bench allreduce``).

mpi4py ``demo/osu_*`` style: for each size, every algorithm gets warm-up calls, then
repetitions each preceded by ``Barrier``, algorithms interleaved round by round
(:func:`~workbench.comm.tuning.time_interleaved`); a repetition's time is the slowest
rank's; the table shows the median. Bandwidths follow nccl-tests: ``algbw = bytes / time`` and
``busbw = algbw * 2(n-1)/n``. ``torch.distributed``'s gloo all-reduce is measured in the same
processes as a peer.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from mpi4py import MPI

from ..comm import allreduce
from ..comm.tuning import bucket_of, time_interleaved, tuner_for
from ..ports import free_port
from ..sizes import format_size, parse_size
from .machine import Load, describe

GLOO = "gloo"


def repetitions_for(nbytes: int) -> int:
    """More repetitions for small messages, where noise dominates."""
    if nbytes <= 64 << 10:
        return 100
    if nbytes <= 1 << 20:
        return 40
    if nbytes <= 8 << 20:
        return 15
    return 7


def _make_buffer(nbytes: int, dtype: str):
    import torch
    n = nbytes // np.dtype("float16" if dtype == "bfloat16" else dtype).itemsize
    # zeros: in-place sums repeated hundreds of times would overflow to inf otherwise
    return torch.zeros(n, dtype=getattr(torch, dtype))


def rendezvous_host() -> str:
    """Where rank 0 listens for a peer library's rendezvous: 127.0.0.1, or on a virtual cluster's
    node (``WORKBENCH_VCLUSTER`` set) the node's own address, which the other nodes reach."""
    import os
    import socket
    return socket.gethostbyname(socket.gethostname()) if os.environ.get("WORKBENCH_VCLUSTER") else "127.0.0.1"


def _gloo_group(comm: MPI.Comm):
    """Start torch.distributed (gloo, on :func:`rendezvous_host`) on the MPI ranks; None if it fails."""
    import torch.distributed as dist
    host = port = None
    if comm.Get_rank() == 0:
        host = rendezvous_host()
        port = free_port(host)
    host, port = comm.bcast((host, port), root=0)
    try:
        dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}",
                                rank=comm.Get_rank(), world_size=comm.Get_size())
        return dist
    except Exception as exc:  # a peer that cannot start is reported, not fatal
        if comm.Get_rank() == 0:
            print(f"gloo peer unavailable: {exc}", file=sys.stderr)
        return None


def run(sizes: list[int], algorithms: list[str], dtype: str, gloo: bool, comm: MPI.Comm,
        repetitions: int | None = None, warmup: int = 3) -> dict:
    """Measure every (size, algorithm); returns the JSON-able report (same on all ranks).
    ``repetitions``: per size (default :func:`repetitions_for`); ``warmup``: untimed rounds first."""
    import torch
    torch.set_num_threads(1)
    load = Load()
    n = comm.Get_size()
    dist = _gloo_group(comm) if gloo else None
    results, auto_choice = [], {}
    for nbytes in sizes:
        buf = _make_buffer(nbytes, dtype)
        names = list(algorithms)
        ops = [lambda name=name: allreduce(buf, comm, name) for name in names]
        reps = repetitions or repetitions_for(nbytes)
        rounds = list(time_interleaved(comm, ops, reps, warmup=warmup))
        if dist is not None:
            # gloo alone, afterwards: its threads keep polling after a call returns and slow
            # whatever MPI algorithm would come next in an interleaved round.
            names.append(GLOO)
            rounds += list(time_interleaved(comm, [lambda: dist.all_reduce(buf)], reps, warmup=warmup))
        for name, times in zip(names, rounds):
            median = float(np.median(times))
            algbw = nbytes / median / 1e9
            results.append({"bytes": nbytes, "size": format_size(nbytes), "algorithm": name,
                            "median_s": median, "mean_s": float(times.mean()), "min_s": float(times.min()),
                            "reps": len(times),
                            "algbw_GBps": algbw, "busbw_GBps": algbw * 2 * (n - 1) / n})
        if "auto" in algorithms and n > 1:
            key = f"{dtype}:{bucket_of(buf.numel() * buf.element_size())}"
            auto_choice[format_size(nbytes)] = tuner_for(comm).table[key]["algorithm"]
    native = {r["bytes"]: r["median_s"] for r in results if r["algorithm"] == "native"}
    for r in results:
        r["vs_native"] = r["median_s"] / native[r["bytes"]] if r["bytes"] in native else None
    if dist is not None:
        dist.destroy_process_group()
    return {"ranks": n, "dtype": dtype, "mpi_library": MPI.Get_library_version().splitlines()[0].strip(),
            "torch": torch.__version__, "host": platform.node(), "machine": describe(), "load_average": load.done(),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "auto_choice": auto_choice, "results": results}


def format_report(report: dict) -> str:
    """One table per size: algorithm, median time, algbw, busbw, ratio to native."""
    from tabulate import tabulate
    out = [f"all-reduce, {report['ranks']} ranks, {report['dtype']}, {report['mpi_library']}, "
           f"torch {report['torch']}"]
    for size in dict.fromkeys(r["size"] for r in report["results"]):
        rows = []
        for r in (r for r in report["results"] if r["size"] == size):
            name = r["algorithm"]
            if name == "auto" and size in report["auto_choice"]:
                name = f"auto ({report['auto_choice'][size]})"
            rows.append([name, r["median_s"] * 1e3, r["algbw_GBps"], r["busbw_GBps"],
                         "" if r["vs_native"] is None else f"{r['vs_native']:.2f}x"])
        out.append(f"\n{size}B")
        out.append(tabulate(rows, headers=["algorithm", "median ms", "algbw GB/s", "busbw GB/s",
                                           "time vs native"], floatfmt=".3f"))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="workbench.bench.allreduce")
    parser.add_argument("--sizes", required=True)
    parser.add_argument("--algorithms", required=True)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--no-gloo", action="store_true")
    parser.add_argument("--json")
    parser.add_argument("--repetitions", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args(argv)
    comm = MPI.COMM_WORLD
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    report = run(sizes, args.algorithms.split(","), args.dtype, not args.no_gloo, comm, args.repetitions, args.warmup)
    if comm.Get_rank() == 0:
        print(format_report(report), flush=True)
        if args.json:
            path = Path(args.json)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(report, indent=1))
            print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
