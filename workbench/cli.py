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
    workbench algorithms             the training and collective algorithm names

Arguments are validated here, before mpiexec is launched; a bad value is an error that names
the option and the allowed values. ``train`` and ``compare`` record every run in the results
store (``--store FILE``, default ``$WORKBENCH_STORE`` or ``data/workbench.sqlite``): a
``running`` row before launch, then the finished run or the failure with its error.
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from .collectives import SUPPORTED_DTYPES, algorithm_names
from .optim.registry import ALGORITHMS, algorithms
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

    train = sub.add_parser("train", help="train one configuration under mpiexec")
    train.add_argument("--algorithm", required=True, help=f"one of: {', '.join(ALGORITHMS)}")
    _training_options(train)
    train.add_argument("--out", metavar="DIR", help="run directory (default data/runs/<run-id>)")
    train.add_argument("--resume", metavar="DIR", help="continue a run from its checkpoint (bitwise for sync-*)")

    compare = sub.add_parser("compare", help="train several algorithms and print a table")
    compare.add_argument("--algorithms", required=True, help=f"'all' or a comma-separated list of: "
                                                             f"{', '.join(ALGORITHMS)}")
    _training_options(compare)
    compare.add_argument("--target-accuracy", type=float, default=0.9,
                         help="accuracy for the time-to-accuracy column (default 0.9)")
    compare.add_argument("--out", metavar="DIR", help="parent directory of the runs "
                                                      "(default data/runs/compare-<time>)")

    runs = sub.add_parser("runs", help="list the runs in the results store, newest first")
    runs.add_argument("--store", metavar="FILE", help="results store (default $WORKBENCH_STORE or "
                                                      "data/workbench.sqlite)")
    runs.add_argument("--algorithm", choices=list(ALGORITHMS), metavar="ALGORITHM",
                      help=f"only this algorithm: {', '.join(ALGORITHMS)}")
    runs.add_argument("--status", choices=("running", "finished", "failed", "cancelled"),
                      help="only runs with this status")
    runs.add_argument("--limit", type=_positive_int, default=20, help="at most this many rows (default 20)")

    sim = sub.add_parser("simulate", help="time all-reduce schedules on a simulated network")
    sim.add_argument("--topology", required=True, type=_parse_topology, metavar="KIND:SHAPE",
                     help="e.g. torus:8x8, mesh:4x4, ring:16, fully_connected:8, bus:4, fat_tree:64x8, bigraph:32x4")
    sim.add_argument("--algorithms", type=_parse_sim_algorithms, default=None,
                     help="comma-separated (default: the MultiTree paper's set): " + ", ".join(_sim_names()))
    sim.add_argument("--sizes", type=_parse_sizes, default=None,
                     help="comma-separated message sizes, K/M/G suffixes (default 32K,128K,512K,2M,8M,64M)")
    sim.add_argument("--bandwidth", type=float, default=None, help="bytes/s per link (default 16e9, the paper's)")
    sim.add_argument("--latency", type=float, default=None, help="seconds per hop (default 150e-9, the paper's)")
    sim.add_argument("--node-bandwidth", type=float, default=None,
                     help="bytes/s one rank's interface sends (and receives) over all its links together "
                          "(default: unlimited, every link at full speed)")
    sim.add_argument("--calibration", metavar="FILE",
                     help="take bandwidth and latency from a fit to this bench JSON (see `workbench calibrate`)")
    sim.add_argument("--calibration-topology", type=_parse_topology, default=None, metavar="KIND:SHAPE",
                     help="the network the calibration measurements ran on (default bus:<ranks>)")
    sim.add_argument("--mode", choices=("lockstep", "flow"), default="lockstep",
                     help="lockstep (the paper's model, default) or flow (ranks run ahead, max-min fair links)")
    sim.add_argument("--k", type=_positive_int, default=2, help="MultiTree's k-ary growth (>= 2, default 2)")
    sim.add_argument("--json", metavar="FILE", help="also write the rows as JSON")

    cal = sub.add_parser("calibrate", help="fit the simulator's link latency and bandwidth to measured all-reduces")
    cal.add_argument("--json", default="benchmarks/results/allreduce_4ranks.json", metavar="FILE",
                     help="a `workbench bench allreduce --json` file (default benchmarks/results/allreduce_4ranks.json)")
    cal.add_argument("--topology", type=_parse_topology, default=None, metavar="KIND:SHAPE",
                     help="the network the ranks ran on, as a model (default bus:<ranks>: one host)")

    sub.add_parser("algorithms", help="list the training and collective algorithm names")
    return parser


def _parse_topology(text: str):
    from .collectives import ScheduleError, topology
    try:
        return topology.parse(text)
    except ScheduleError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _sim_names() -> tuple[str, ...]:
    from .collectives.study import SIM_ALGORITHMS
    return SIM_ALGORITHMS


def _parse_sim_algorithms(text: str) -> list[str]:
    chosen = [a.strip() for a in text.split(",") if a.strip()]
    bad = [a for a in chosen if a not in _sim_names()]
    if bad or not chosen:
        raise argparse.ArgumentTypeError(f"unknown {', '.join(map(repr, bad)) or 'empty list'}; "
                                         f"choose from: {', '.join(_sim_names())}")
    return chosen


def _calibration(path: str, topo):
    import json
    from pathlib import Path

    from .collectives import topology
    from .collectives.calibrate import calibrate
    if topo is None:
        ranks = json.loads(Path(path).read_text()).get("ranks", 4) if Path(path).exists() else 4
        topo = topology.bus(int(ranks))
    return calibrate(path, topo)


def _simulate(args) -> int:
    from tabulate import tabulate

    from .collectives import ScheduleError, study
    from .collectives.simulator import PAPER_BANDWIDTH, PAPER_LATENCY
    bandwidth, latency = args.bandwidth or PAPER_BANDWIDTH, args.latency if args.latency is not None else PAPER_LATENCY
    try:
        if args.calibration:
            if args.bandwidth or args.latency is not None:
                raise ScheduleError("--calibration replaces --bandwidth and --latency; give one or the other")
            cal = _calibration(args.calibration, args.calibration_topology)
            bandwidth, latency = cal.link_bandwidth, cal.link_latency
            print(f"calibrated on {args.calibration}: {cal}")
        frame = study.compare(args.topology, args.algorithms or study.PAPER_ALGORITHMS,
                              args.sizes or study.PAPER_SIZES, bandwidth, latency, mode=args.mode, k=args.k,
                              node_bandwidth=args.node_bandwidth)
    except (ScheduleError, ValueError, OSError) as exc:
        print(f"workbench simulate: error: {exc}", file=sys.stderr)
        return 2
    node = f", {args.node_bandwidth / 1e9:.3g} GB/s per node" if args.node_bandwidth else ""
    print(f"{args.topology!r}; links {bandwidth / 1e9:.3g} GB/s, {latency * 1e9:.4g} ns per hop{node}; "
          f"{args.mode} model\n")
    rows = [[r.algorithm, study.size_label(r.bytes), r.steps, f"{r.seconds * 1e6:.2f}", f"{r.busbw_GBps:.2f}",
             f"{r.speedup_vs_ring:.2f}x" if "speedup_vs_ring" in frame else "-"] for r in frame.itertuples()]
    print(tabulate(rows, headers=["algorithm", "size", "steps", "time us", "busbw GB/s", "vs ring"]))
    if args.json:
        frame.to_json(args.json, orient="records", indent=1)
        print(f"\nwrote {args.json}")
    return 0


def _calibrate(args) -> int:
    from tabulate import tabulate

    from .collectives import ScheduleError
    try:
        cal = _calibration(args.json, args.topology)
    except (ScheduleError, ValueError, OSError) as exc:
        print(f"workbench calibrate: error: {exc}", file=sys.stderr)
        return 2
    print(f"{cal}\n")
    rows = [[r.algorithm, r.bytes, f"{r.measured_s * 1e3:.3f}", f"{r.predicted_s * 1e3:.3f}", f"{r.error:+.0%}"]
            for r in cal.table.itertuples()]
    print(tabulate(rows, headers=["algorithm", "bytes", "measured ms", "predicted ms", "error"]))
    return 0


def _training_options(p: argparse.ArgumentParser) -> None:
    """Options shared by train and compare; defaults come from RunConfig."""
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--model", default="mlp", help="mlp, wide_mlp, cnn, or module:function")
    p.add_argument("--dataset", default="digits", help="digits, synthetic, or a .npz path")
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float)
    p.add_argument("--rho", type=float, help="elastic coefficient (default: p*lr*rho = 0.9)")
    p.add_argument("--tau", type=int, default=1, help="communication period in steps")
    p.add_argument("--momentum", type=float)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--collective", default="native", help=f"all-reduce algorithm: {', '.join(algorithm_names())}")
    p.add_argument("--per-layer", action="store_true", help="one message per layer instead of one flat buffer")
    p.add_argument("--no-overlap", action="store_true", help="do not overlap communication with compute")
    p.add_argument("--eval-every", type=int, default=None, help="evaluate every N steps (master: arrivals)")
    p.add_argument("--checkpoint-every", type=int, default=0, help="checkpoint every N steps (0: never)")
    p.add_argument("--no-telemetry", action="store_true")
    p.add_argument("--fail-rank", type=int, help="debug: make this rank raise at --fail-step")
    p.add_argument("--fail-step", type=int, help="debug: the step at which --fail-rank raises")
    p.add_argument("--timeout", type=float, default=1800, help="seconds before the job is killed")
    p.add_argument("--store", metavar="FILE", help="results store (default $WORKBENCH_STORE or "
                                                   "data/workbench.sqlite)")


def _config(args: argparse.Namespace, algorithm: str):
    from .config import RunConfig
    values = {"algorithm": algorithm, "ranks": args.ranks, "model": args.model, "dataset": args.dataset,
              "seed": args.seed, "lr": args.lr, "rho": args.rho, "tau": args.tau, "momentum": args.momentum,
              "collective": args.collective, "single_buffer": not args.per_layer,
              "overlap": not args.no_overlap, "checkpoint_every": args.checkpoint_every,
              "telemetry": not args.no_telemetry, "fail_rank": args.fail_rank, "fail_step": args.fail_step}
    for name in ("epochs", "batch_size", "eval_every"):
        if getattr(args, name) is not None:
            values[name] = getattr(args, name)
    return RunConfig(**values)


def _open_store(args, command: str):
    """The results store named by ``--store`` (default ``$WORKBENCH_STORE`` or
    ``data/workbench.sqlite``), or None after printing why it cannot be opened."""
    import sqlite3

    from .store import Store, default_path
    try:
        return Store(args.store)
    except (OSError, sqlite3.Error, RuntimeError) as exc:
        print(f"workbench {command}: cannot open the results store {args.store or default_path()}: {exc}",
              file=sys.stderr)
        return None


def _recorded_train(store, run_id: str, cfg, run_dir, **options):
    """``runtime.batch.train`` with the run recorded in ``store``: a ``running`` row before mpiexec
    starts (so a crash leaves a trace), then the finished run, or the failure and its error.
    Returns the finished run's :class:`~workbench.results.RunResult`."""
    from pathlib import Path

    from .results import RunResult
    from .runtime.batch import train
    store.start_run(run_id, cfg.to_dict(), run_dir=str(Path(run_dir).resolve()))
    try:
        train(cfg, run_dir, **options)
    except KeyboardInterrupt:
        store.fail(run_id, "interrupted from the keyboard", status="cancelled")
        raise
    except BaseException as exc:
        store.fail(run_id, str(exc))
        raise
    result = RunResult.from_run_dir(run_dir, run_id)
    store.finish(result)
    return result


def _configs_and_store(args, names: list[str], command: str):
    """Validate every configuration before anything launches, then open the store.
    Returns ``(configs, store)``, or the exit code after printing why not."""
    from .config import ConfigError
    try:
        configs = [_config(args, name) for name in names]
    except ConfigError as exc:
        print(f"workbench {command}: error: {exc}", file=sys.stderr)
        return 2
    store = _open_store(args, command)
    return 1 if store is None else (configs, store)


def _train(args) -> int:
    from pathlib import Path

    from .runtime.batch import new_run_id, runs_root
    prepared = _configs_and_store(args, [args.algorithm], "train")
    if isinstance(prepared, int):
        return prepared
    [cfg], store = prepared
    run_dir = Path(args.out or args.resume or runs_root() / new_run_id(cfg))
    run_id = run_dir.name
    print(f"{'run_id':20s} {run_id}", flush=True)
    try:
        result = _recorded_train(store, run_id, cfg, run_dir, resume=args.resume, timeout=args.timeout)
    except (MPILaunchError, ValueError, FileNotFoundError) as exc:
        print(f"workbench train: {exc}", file=sys.stderr)
        print(f"workbench train: run {run_id} recorded as failed in {store.path}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"workbench train: interrupted; run {run_id} recorded as cancelled in {store.path}",
              file=sys.stderr)
        return 130
    summary = {**result.summary, "run_dir": result.run_dir}
    for key in ("algorithm", "ranks", "final_test_accuracy", "final_loss", "wall_seconds", "steps",
                "comm_fraction", "bytes_sent", "weights_checksum", "run_dir"):
        if key in summary:
            print(f"{key:20s} {summary[key]}")
    print(f"{'store':20s} {store.path}")
    return 0


def _percent(value) -> str:
    return "" if value is None or value != value else f"{100 * value:.1f}%"  # None or NaN: blank


def _compare(args) -> int:
    from datetime import datetime
    from pathlib import Path

    from tabulate import tabulate

    from .runtime.batch import runs_root
    names = list(ALGORITHMS) if args.algorithms == "all" else [a.strip() for a in args.algorithms.split(",")]
    prepared = _configs_and_store(args, names, "compare")
    if isinstance(prepared, int):
        return prepared
    configs, store = prepared
    parent = Path(args.out) if args.out else runs_root() / f"compare-{datetime.now():%Y%m%d-%H%M%S}"
    rows = []
    for cfg in configs:
        run_id = f"{parent.name}-{cfg.algorithm}"  # unique across compares, unlike the directory name
        print(f"{cfg.algorithm}: run {run_id}", flush=True)
        try:
            result = _recorded_train(store, run_id, cfg, parent / cfg.algorithm, timeout=args.timeout)
        except MPILaunchError as exc:
            print(f"workbench compare: {cfg.algorithm} failed: {exc}", file=sys.stderr)
            rows.append([cfg.algorithm, "failed", "", "", "", "", run_id])
            continue
        s, tta = result.summary, result.time_to_accuracy(args.target_accuracy)
        rows.append([cfg.algorithm, f"{s['final_test_accuracy']:.3f}", f"{s['wall_seconds']:.2f}",
                     "not reached" if tta is None else f"{tta:.2f}",
                     _percent(s["comm_fraction"]), _percent(s["comm_fraction_workers"]), run_id])
    print(tabulate(rows, headers=["algorithm", "final test acc", "train wall s",
                                  f"s to {args.target_accuracy:g} acc", "comm share (all ranks)",
                                  "comm share (workers)", "run id"]))
    print(f"\nruns under {parent}, recorded in {store.path}")
    return 0 if all(r[1] != "failed" for r in rows) else 1


def _runs(args) -> int:
    from pathlib import Path

    import pandas as pd
    from tabulate import tabulate

    from .store import default_path
    path = Path(args.store) if args.store else default_path()
    if not path.exists():  # listing must not create an empty store
        print(f"no runs: the results store {path} does not exist yet (workbench train creates it)")
        return 0
    store = _open_store(args, "runs")
    if store is None:
        return 1
    every = store.runs(algorithm=args.algorithm, status=args.status)
    if every.empty:
        print(f"no runs in {store.path}" + (" matching the filters" if args.algorithm or args.status else ""))
        return 0

    def number(value, spec: str) -> str:
        return "" if pd.isna(value) else format(value, spec)

    rows = [[r.run_id, f"{r.created:%Y-%m-%d %H:%M:%S}", r.status, r.algorithm, number(r.ranks, "d"),
             number(r.final_test_accuracy, ".3f"), number(r.final_loss, ".3f"), number(r.wall_seconds, ".2f"),
             _percent(r.comm_fraction), "" if pd.isna(r.error) else r.error.splitlines()[0][:70]]
            for r in every.head(args.limit).itertuples()]
    print(tabulate(rows, headers=["run id", "created", "status", "algorithm", "ranks", "final test acc",
                                  "final loss", "train wall s", "comm share", "error"]))
    print(f"\n{len(rows)} of {len(every)} runs in {store.path}, newest first")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "algorithms":
        print("training algorithms:")
        for name, description in algorithms().items():
            print(f"  {name:15s} {description}")
        print("collective algorithms: " + ", ".join(algorithm_names()))
        return 0
    if args.command == "train":
        return _train(args)
    if args.command == "compare":
        return _compare(args)
    if args.command == "runs":
        return _runs(args)
    if args.command == "simulate":
        return _simulate(args)
    if args.command == "calibrate":
        return _calibrate(args)
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
