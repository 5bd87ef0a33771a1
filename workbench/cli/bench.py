"""``workbench bench allreduce``: all-reduce time per algorithm and size under mpiexec."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..comm.names import SUPPORTED_DTYPES, algorithm_names
from ..runtime.launch.launcher import MPILaunchError, run_mpi
from .common import parse_sizes, positive_int, say

DEFAULT_SIZES = "4K,64K,1M,8M,64M"


def _parse_algorithms(text: str) -> list[str]:
    names = algorithm_names()
    if text == "all":
        return names
    chosen = [a.strip() for a in text.split(",") if a.strip()]
    bad = [a for a in chosen if a not in names]
    if bad or not chosen:
        raise argparse.ArgumentTypeError(
            f"--algorithms: unknown {', '.join(map(repr, bad)) or 'empty list'}; "
            f"choose 'all' or a comma-separated list of: {', '.join(names)}")
    return chosen


def add_to(sub) -> None:
    bench = sub.add_parser("bench", help="reproducible measurements")
    bench_sub = bench.add_subparsers(dest="what", required=True)
    ar = bench_sub.add_parser("allreduce", help="all-reduce time per algorithm and size, vs "
                              "native MPI and torch.distributed gloo")
    ar.add_argument("--ranks", type=positive_int, default=4, help="MPI ranks (default 4)")
    ar.add_argument("--sizes", type=parse_sizes, default=parse_sizes(DEFAULT_SIZES),
                    help=f"comma-separated message sizes in bytes, K/M/G suffixes "
                         f"(default {DEFAULT_SIZES})")
    ar.add_argument("--algorithms", type=_parse_algorithms, default=algorithm_names(),
                    help=f"'all' or a comma-separated subset of: {', '.join(algorithm_names())}")
    ar.add_argument("--dtype", choices=SUPPORTED_DTYPES, default="float32")
    ar.add_argument("--no-gloo", action="store_true", help="skip the torch.distributed gloo peer")
    ar.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    ar.add_argument("--timeout", type=float, default=600, help="seconds before the job is killed")
    ar.add_argument("--repetitions", type=positive_int, default=None,
                    help="timed calls per size and algorithm (default 100/40/15/7 by size)")
    ar.add_argument("--warmup", type=positive_int, default=3, help="untimed rounds first (default 3)")
    ar.add_argument("--vcluster", metavar="NAME", help="run the ranks on a virtual cluster's nodes")
    ar.add_argument("--ppn", type=positive_int, default=1, help="ranks per node on --vcluster (default 1)")
    ar.set_defaults(func=allreduce, launches=True)


def allreduce(args) -> int:
    from ..checks import writable_file
    from ..sizes import format_size
    if args.json:  # rank 0 writes it after the benchmark: checked before the ranks start
        try:
            writable_file("--json", args.json)
        except ValueError as exc:
            say(f"workbench bench allreduce: error: {exc}")
            return 2
    worker = ["-m", "workbench.bench.allreduce",
              "--sizes", ",".join(format_size(s) for s in args.sizes),
              "--algorithms", ",".join(args.algorithms), "--dtype", args.dtype]
    if args.no_gloo:
        worker.append("--no-gloo")
    if args.json:
        worker += ["--json", str(Path(args.json).resolve())]
    if args.repetitions:
        worker += ["--repetitions", str(args.repetitions)]
    worker += ["--warmup", str(args.warmup)]
    options = {}
    try:
        if args.vcluster:
            from ..vcluster import VirtualCluster
            vc = VirtualCluster.attach(args.vcluster)
            options = vc.run_options(args.ranks, args.ppn)
            if args.json and not vc.visible(Path(args.json).resolve().parent):
                raise ValueError(f"--json: {args.json} is not seen by the nodes of vcluster {vc.name}")
        run_mpi(args.ranks, worker, timeout=args.timeout, stream=True, **options)
    except (MPILaunchError, ValueError, RuntimeError) as exc:
        say(f"workbench: {exc}")
        return 1
    return 0
