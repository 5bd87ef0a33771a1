"""Topology-aware all-reduce schedules timed for real, run on every rank under mpiexec:
the simulator's layouts (:func:`workbench.netsim.study.schedule_on`: the ring along the topology's
ring embedding, the 2D ring on the grid, MultiTree grown on it) executed over MPI, so that a
virtual cluster's measurements stand beside ``workbench simulate`` on the same network.

    python -m mpi4py -m workbench.bench.schedules --topology torus:4x4 \\
        --algorithms ring,ring_2d,double_binary_tree,multitree --sizes 4M,16M --repetitions 3 --json FILE

Rank r is vertex r of the topology (a virtual cluster's node r with one rank per node). Method as
:mod:`workbench.bench.allreduce`: interleaved, a Barrier before each call, the slowest rank's time,
the median of the repetitions.
"""
from __future__ import annotations

import argparse
import json
import platform
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from mpi4py import MPI

from ..comm.buffers import FlatBuffer
from ..comm.executor import execute, private_comm
from ..comm.tuning import time_interleaved
from ..network import parse
from ..netsim.study import schedule_on
from ..sizes import format_size, parse_size


def run(topology: str, algorithms: list[str], sizes: list[int], repetitions: int, warmup: int,
        comm: MPI.Comm) -> dict:
    """Median seconds per (algorithm, size) of the schedules laid out on ``topology``."""
    topo = parse(topology)
    if topo.nodes != comm.Get_size():
        raise SystemExit(f"--topology {topology} has {topo.nodes} nodes; launch as many ranks, not {comm.Get_size()}")
    built = {name: schedule_on(name, topo) for name in algorithms}
    private = private_comm(comm)
    n = comm.Get_size()
    results = []
    for nbytes in sizes:
        data = np.zeros(nbytes // 4, dtype=np.float32)
        ops = [lambda s=s: execute(s, FlatBuffer(data), private) for s in built.values()]
        rounds = time_interleaved(comm, ops, repetitions, warmup=warmup)
        for name, times in zip(built, rounds):
            median = float(np.median(times))
            results.append({"algorithm": name, "bytes": nbytes, "size": format_size(nbytes), "median_s": median,
                            "min_s": float(times.min()), "reps": len(times), "steps": built[name].num_steps,
                            "busbw_GBps": nbytes / median / 1e9 * 2 * (n - 1) / n})
    return {"topology": topology, "ranks": n, "host": platform.node(),
            "mpi_library": MPI.Get_library_version().splitlines()[0].strip(),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "results": results}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="workbench.bench.schedules")
    parser.add_argument("--topology", required=True)
    parser.add_argument("--algorithms", required=True)
    parser.add_argument("--sizes", required=True)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--json", required=True)
    args = parser.parse_args(argv)
    comm = MPI.COMM_WORLD
    report = run(args.topology, args.algorithms.split(","), [parse_size(s) for s in args.sizes.split(",")],
                 args.repetitions, args.warmup, comm)
    if comm.Get_rank() == 0:
        Path(args.json).write_text(json.dumps(report, indent=1))
        for r in report["results"]:
            print(f"{r['algorithm']:20s} {r['size']:>5s} {r['median_s'] * 1e3:10.1f} ms", flush=True)


if __name__ == "__main__":
    main()
