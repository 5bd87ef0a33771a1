"""The ``workbench`` command.

    workbench bench allreduce --ranks 4 --sizes 4K,64K,1M,8M,64M --algorithms all [--json FILE]
    workbench algorithms             the collective algorithm names

Arguments are validated here, before mpiexec is launched; a bad value is an error that names
the option and the allowed values.
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from .collectives import SUPPORTED_DTYPES, algorithm_names
from .runtime.launcher import MPILaunchError, run_mpi

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


def _parse_sizes(text: str) -> list[int]:
    from .bench.allreduce import parse_size
    try:
        return [parse_size(s) for s in text.split(",")]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="workbench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    bench = sub.add_parser("bench", help="reproducible measurements")
    bench_sub = bench.add_subparsers(dest="what", required=True)
    ar = bench_sub.add_parser("allreduce", help="all-reduce time per algorithm and size, vs "
                              "native MPI and torch.distributed gloo")
    ar.add_argument("--ranks", type=_positive_int, default=4, help="MPI ranks (default 4)")
    ar.add_argument("--sizes", type=_parse_sizes, default=_parse_sizes(DEFAULT_SIZES),
                    help=f"comma-separated message sizes in bytes, K/M/G suffixes "
                         f"(default {DEFAULT_SIZES})")
    ar.add_argument("--algorithms", type=_parse_algorithms, default=algorithm_names(),
                    help=f"'all' or a comma-separated subset of: {', '.join(algorithm_names())}")
    ar.add_argument("--dtype", choices=SUPPORTED_DTYPES, default="float32")
    ar.add_argument("--no-gloo", action="store_true", help="skip the torch.distributed gloo peer")
    ar.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    ar.add_argument("--timeout", type=float, default=600, help="seconds before the job is killed")

    sub.add_parser("algorithms", help="list the collective algorithm names")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "algorithms":
        print("\n".join(algorithm_names()))
        return 0
    if args.command == "bench" and args.what == "allreduce":
        from .bench.allreduce import format_size
        worker = ["-m", "workbench.bench.allreduce",
                  "--sizes", ",".join(format_size(s) for s in args.sizes),
                  "--algorithms", ",".join(args.algorithms), "--dtype", args.dtype]
        if args.no_gloo:
            worker.append("--no-gloo")
        if args.json:
            worker += ["--json", args.json]
        try:
            run_mpi(args.ranks, worker, timeout=args.timeout, stream=True)
        except MPILaunchError as exc:
            print(f"workbench: {exc}", file=sys.stderr)
            return 1
        return 0
    return 2  # argparse's required subcommands make this unreachable


if __name__ == "__main__":
    sys.exit(main())
