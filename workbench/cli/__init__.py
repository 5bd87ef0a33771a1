"""The ``workbench`` command.

    workbench train --algorithm sync-easgd --ranks 4 [--epochs 10 --lr ... --out DIR]
    workbench compare --algorithms sync-easgd,easgd [--target-accuracy 0.9 ...]
    workbench runs [--store FILE] [--algorithm A] [--status S] [--limit 20]
                                     the newest runs recorded in the results store
    workbench bench allreduce --ranks 4 --sizes 4K,64K,1M,8M,64M --algorithms all [--json FILE]
    workbench simulate --topology torus:8x8 [--algorithms ring,multitree,...] [--sizes 32K,64M]
                       [--bandwidth 16e9 --latency 150e-9 | --calibration FILE] [--node-bandwidth B]
                       [--mode flow] [--k 2]
                                     all-reduce time on a simulated network, speed-up over ring
    workbench calibrate [--json benchmarks/results/allreduce_4ranks.json] [--topology bus:4]
                                     fit link latency/bandwidth to measured all-reduces
    workbench predict [--model alexnet | --profile FILE.csv] [--ranks 1,8,64,512] [--simulate ...]
                                     step time, communication share and scaling on N ranks
    workbench plan --model vgg16 --batch 32 --gpus 8 (--amplification 2 | --data-parallel)
                                     burst parallelism: every layer its own number of GPUs
    workbench vcluster up|status|list|exec|mpiexec|env|down NAME ...
                                     a virtual cluster: nodes as namespaces joined by shaped links
    workbench algorithms             the training and collective algorithm names
    workbench info                   the MPI library a rank would load, its mpiexec, mpi4py, torch, Slurm

Arguments are validated here, before mpiexec is launched; a bad value is an error that names
the option and the allowed values. ``train`` and ``compare`` record every run in the results
store (``--store FILE``, default ``$WORKBENCH_STORE`` or ``data/workbench.sqlite``): a
``running`` row before launch, then the finished run or the failure with its error.
SIGINT, SIGTERM and SIGHUP stop the whole MPI job (cooperatively first, killed after a grace
period) and leave the run recorded as ``cancelled``; the exit code is 128 + the signal.
This process never imports ``mpi4py.MPI``: only the ranks initialise MPI.

One module per group of subcommands; each adds its parsers (``add_to``) and names the function
that runs it with ``set_defaults(func=...)``.
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from . import bench, network, plan, predict, runs, training, vcluster
from .common import interrupt_code, say


def list_algorithms(args) -> int:
    from ..comm.names import algorithm_names
    from ..optim.registry import algorithms
    print("training algorithms:")
    width = max(map(len, algorithms()))
    for name, description in algorithms().items():
        print(f"  {name:{width}s} {description}")
    print("collective algorithms: " + ", ".join(algorithm_names()))
    return 0


def info(args) -> int:
    """What this installation runs with, without initialising MPI here: the mpiexec the launchers run
    and its library (:mod:`workbench.mpilib`), what a rank would load (asked of a child Python), whether
    they agree, mpi4py, torch and Slurm. Exit 1 when the ranks could not start as one job."""
    import shutil
    import sys as _sys
    from importlib import metadata

    from ..mpilib import FLAVOUR_ENV, FLAVOURS, MPIFlavourError, check_pairing, find_mpiexec, flavour_of, rank_library

    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "not installed"
    rows = [("workbench", version("workbench")), ("python", f"{_sys.executable} ({_sys.version.split()[0]})"),
            ("torch", version("torch")), ("mpi4py", version("mpi4py"))]
    code = 0
    try:
        mpiexec = find_mpiexec()
        mpi = flavour_of(mpiexec)
        rows += [("mpiexec", mpiexec), ("mpiexec is", f"{mpi.title} {mpi.version}".strip()
                                         + (f" (said by {FLAVOUR_ENV})" if FLAVOUR_ENV in __import__("os").environ else ""))]
    except (FileNotFoundError, MPIFlavourError) as exc:
        rows.append(("mpiexec", f"error: {exc}"))
        mpi, code = None, 1
    found = rank_library()
    if "error" in found:
        rows.append(("a rank loads", f"error: {found['error']}"))
        code = 1
    else:
        rows.append(("a rank loads", found["library"]))
    if mpi is not None and "error" not in found:
        try:
            check_pairing(mpi)
            rows.append(("one job", "yes: mpiexec and mpi4py use the same library"))
        except MPIFlavourError as exc:
            rows.append(("one job", f"no: {exc}"))
            code = 1
    rows.append(("MPI libraries known", ", ".join(f"{f.name} ({f.title})" for f in FLAVOURS.values())))
    rows.append(("srun", shutil.which("srun") or "not on PATH"))
    rows.append(("single-host jobs", _network_row()))
    for key, value in rows:
        print(f"{key:20s} {value}")
    return code


def _network_row() -> str:
    """Which network a job on this host alone gets (docs/security.md)."""
    from ..runtime.launch import private_net
    try:
        chosen = private_net.mode()
    except private_net.PrivateNetworkError as exc:
        return f"error: {exc}"
    reason = None if chosen == "host" else private_net.why_not()
    if chosen == "host":
        return f"the host's network ({private_net.ENV}=host): other users can reach their ports"
    if reason is None:
        return f"a network of their own ({private_net.ENV}={chosen}): no port reachable by other users"
    return (f"the host's network: no network namespace for this user ({reason}); other users can reach their "
            "ports")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="workbench", description=__doc__.split("\n\nOne module")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.set_defaults(launches=False)  # commands that launch MPI jobs set it: see main()
    sub = parser.add_subparsers(dest="command", required=True)
    bench.add_to(sub)
    training.add_to(sub)
    runs.add_to(sub)
    network.add_to(sub)
    predict.add_to(sub)
    plan.add_to(sub)
    vcluster.add_to(sub)
    sub.add_parser("algorithms", help="list the training and collective algorithm names").set_defaults(
        func=list_algorithms)
    sub.add_parser("info", help="the MPI library a rank would load, its mpiexec, mpi4py, torch, Slurm").set_defaults(
        func=info)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    # `workbench vcluster exec NAME --node I -- CMD...`: what follows the first `--` is a command, not ours
    ours, command = (given[:given.index("--")], given[given.index("--") + 1:]) if "--" in given else (given, None)
    args = parser.parse_args(ours)
    if command is not None:
        if not hasattr(args, "argv"):
            parser.error(f"unrecognized arguments: -- {' '.join(command)}")
        args.argv = command
    args.argv_given = given  # a rootless cluster's commands run again inside its user namespace
    from ..paths import UnsafeFolder
    from ..runtime.launch.signals import handling_signals, raise_interrupted
    try:
        if not args.launches:
            return args.func(args)
        # SIGTERM and SIGHUP end these commands like Ctrl-C: as an exception, so the store is
        # updated and no MPI process is left (while a job runs, the launcher handles them itself)
        with handling_signals(raise_interrupted):
            return args.func(args)
    except UnsafeFolder as exc:  # another user's folder, or one others may write: nothing was started
        say(f"workbench {args.command}: {exc}")
        return 2
    except KeyboardInterrupt as exc:  # before or after a run: nothing is running
        code, name = interrupt_code(exc)
        say(f"workbench {args.command}: interrupted by {name}")
        return code
    finally:
        _settle_output()


def _settle_output() -> None:
    """Flush stdout and stderr; where the terminal is gone (SIGHUP), send what is left to
    /dev/null so that exiting does not fail on it."""
    import os
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            try:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, stream.fileno())
                os.close(devnull)
            except (OSError, ValueError):
                pass
