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
SIGINT, SIGTERM and SIGHUP stop the whole MPI job (cooperatively first, killed after a grace
period) and leave the run recorded as ``cancelled``; the exit code is 128 + the signal.
This process never imports ``mpi4py.MPI``: only the ranks initialise MPI.
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
    from .bench.sizes import parse_size
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


def _positive_seconds(text: str) -> float:
    """A finite number of seconds > 0 (``--timeout``)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value > 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text!r}")
    return value


def _training_options(p: argparse.ArgumentParser) -> None:
    """Options shared by train and compare; defaults (None: not given) come from RunConfig."""
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--model", default="mlp", help="mlp, wide_mlp, cnn, or module:function")
    p.add_argument("--dataset", default="digits", help="digits, synthetic, or a .npz path")
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float)
    p.add_argument("--rho", type=float, help="elastic coefficient (default: p*lr*rho = 0.9)")
    p.add_argument("--tau", type=int, default=None, help="communication period in steps (default 1)")
    p.add_argument("--momentum", type=float)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--collective", default=None, help=f"all-reduce algorithm of the synchronous algorithms "
                                                      f"(default native): {', '.join(algorithm_names())}")
    p.add_argument("--per-layer", action="store_true", help="one message per layer instead of one flat buffer")
    p.add_argument("--no-overlap", action="store_true", help="do not overlap communication with compute")
    p.add_argument("--eval-every", type=int, default=None, help="evaluate every N steps (master: arrivals)")
    p.add_argument("--checkpoint-every", type=int, default=0, help="checkpoint every N steps (0: never)")
    p.add_argument("--no-telemetry", action="store_true")
    p.add_argument("--fail-rank", type=int, help="debug: make this rank raise at --fail-step")
    p.add_argument("--fail-step", type=int, help="debug: the step at which --fail-rank raises")
    p.add_argument("--timeout", type=_positive_seconds, default=1800,
                   help="seconds before the job is killed (finite, > 0; default 1800)")
    p.add_argument("--store", metavar="FILE", help="results store (default $WORKBENCH_STORE or "
                                                   "data/workbench.sqlite)")


_OPTION = {"tau": "--tau", "rho": "--rho", "collective": "--collective", "momentum": "--momentum"}


def _config(args: argparse.Namespace, algorithm: str, shared: bool = False):
    """The RunConfig of ``algorithm`` with the command's options. An option the algorithm ignores
    (``--collective`` on a master-based one, ``--tau``/``--rho`` on an SGD baseline) is an error,
    unless ``shared`` (compare: the options serve several algorithms): then it is left out for this
    algorithm with a note on stderr."""
    from .config import RunConfig, without_ignored
    values = {"algorithm": algorithm, "ranks": args.ranks, "model": args.model, "dataset": args.dataset,
              "seed": args.seed, "lr": args.lr, "rho": args.rho, "momentum": args.momentum,
              "single_buffer": not args.per_layer,
              "overlap": not args.no_overlap, "checkpoint_every": args.checkpoint_every,
              "telemetry": not args.no_telemetry, "fail_rank": args.fail_rank, "fail_step": args.fail_step}
    for name in ("epochs", "batch_size", "eval_every", "tau", "collective"):
        if getattr(args, name) is not None:
            values[name] = getattr(args, name)
    if shared:
        values, dropped = without_ignored(values)
        if dropped:
            print(f"workbench {args.command}: note: {algorithm} ignores {', '.join(_OPTION[n] for n in dropped)}; "
                  f"run without it", file=sys.stderr)
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


def _recorded_train(store, run_id: str, cfg, run_dir, resumed_from: str | None = None, **options):
    """``runtime.batch.train`` with the run recorded in ``store``: a ``running`` row before mpiexec
    starts (so a crash leaves a trace), then the finished run, or the failure and its error.
    Returns the finished run's :class:`~workbench.results.RunResult`.

    Interrupted (SIGINT, SIGTERM, SIGHUP: ``batch.train`` has stopped the job), the run is recorded
    as its folder says: with its summary when rank 0 wrote one in this run (``cancelled``, or
    ``finished`` if it ended before the signal took effect), else ``cancelled`` with the signal as
    its error; never left ``running``. The exception goes on with ``recorded_status`` set. Store
    writes are not cut short by a signal."""
    import time
    from pathlib import Path

    from .results import RunResult
    from .runtime.batch import train
    from .runtime.launcher import deferred_signals
    started = time.time()
    try:
        with deferred_signals():
            store.start_run(run_id, cfg.to_dict(), run_dir=str(Path(run_dir).resolve()), resumed_from=resumed_from)
        train(cfg, run_dir, **options)
        result = RunResult.from_run_dir(run_dir, run_id)
        with deferred_signals():
            store.finish(result)
        return result
    except KeyboardInterrupt as exc:
        with _signals_ignored():  # stopping already: a second signal must not leave the row running
            exc.recorded_status = _record_interrupted(store, run_id, run_dir, started, exc)
        raise
    except BaseException as exc:
        with _signals_ignored():
            store.fail(run_id, str(exc))
        raise


def _record_interrupted(store, run_id: str, run_dir, started: float, exc: BaseException) -> str:
    """Record an interrupted run from its folder; returns the status recorded."""
    from pathlib import Path

    from .results import RunResult
    try:
        # written by this run (a few seconds' slack: rank 0 may write on another host's clock)
        if Path(run_dir, "summary.json").stat().st_mtime >= started - 5:
            result = RunResult.from_run_dir(run_dir, run_id)
            store.finish(result)
            return result.status
    except (OSError, ValueError, KeyError):  # no summary, or one cut short by the kill
        pass
    store.fail(run_id, str(exc) or "interrupted from the keyboard", status="cancelled")
    return "cancelled"


def _signals_ignored():
    import signal

    from .runtime.launcher import handling_signals
    return handling_signals(signal.SIG_IGN)


def _say(text: str) -> None:
    """Print to stderr; a terminal that is gone (SIGHUP) or a closed pipe is not an error."""
    try:
        print(text, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _interrupt_code(exc: BaseException) -> tuple[int, str]:
    """The exit code (128 + signal) and the signal's name of an interruption."""
    import signal

    from .runtime.launcher import signal_name
    signum = getattr(exc, "signum", signal.SIGINT)
    return 128 + signum, signal_name(signum)


def _configs_and_store(args, names: list[str], command: str):
    """Validate every configuration before anything launches, then open the store.
    Returns ``(configs, store)``, or the exit code after printing why not."""
    from .config import ConfigError
    try:
        configs = [_config(args, name, shared=command == "compare") for name in names]
        _check_paths(args, configs)
    except ConfigError as exc:
        print(f"workbench {command}: error: {exc}", file=sys.stderr)
        return 2
    store = _open_store(args, command)
    return 1 if store is None else (configs, store)


def _check_paths(args, configs) -> None:
    """``--out`` and ``--resume``, before anything is created or launched: ConfigError naming the option."""
    from pathlib import Path

    from .config import ConfigError
    from .runtime import checkpoint
    out = Path(args.out) if args.out else None
    if out is not None and out.exists() and not out.is_dir():
        raise ConfigError(f"--out: {args.out!r} is a file, not a directory")
    for cfg in configs:
        run_dir = out if args.command == "train" else (out / cfg.algorithm if out else None)
        if run_dir is not None and (run_dir / "config.json").exists():
            raise ConfigError(f"--out: {str(run_dir)!r} already holds a run ({run_dir / 'config.json'}); give a "
                              f"new directory" + (" (a resumed run writes into a new one)" if args.command == "train"
                                                  else ""))
    if getattr(args, "resume", None):
        try:
            checkpoint.check_resume(args.resume, configs[0])
        except ConfigError as exc:
            raise ConfigError(f"--{exc}") from None  # "resume: ..." -> "--resume: ..."


def _train(args) -> int:
    from pathlib import Path

    from .runtime.batch import make_run_dir, new_run_id, run_id_for, runs_root
    prepared = _configs_and_store(args, [args.algorithm], "train")
    if isinstance(prepared, int):
        return prepared
    [cfg], store = prepared
    # a resumed run is a new run in a new directory, linked to the one it continues: the old
    # run's row and files stay as they were, whatever happens to the new one
    run_dir = Path(args.out) if args.out else runs_root() / new_run_id(cfg)
    run_id = run_id_for(run_dir, cfg, store)
    make_run_dir(run_dir, "--out")
    print(f"{'run_id':20s} {run_id}", flush=True)
    resumed_from = None
    if args.resume:
        resumed_from = store.run_id_of(args.resume) or str(Path(args.resume).resolve())
        print(f"{'resumed_from':20s} {resumed_from}", flush=True)
    try:
        result = _recorded_train(store, run_id, cfg, run_dir, resumed_from=resumed_from, resume=args.resume,
                                 timeout=args.timeout)
    except (MPILaunchError, ValueError, FileNotFoundError) as exc:
        _say(f"workbench train: {exc}")
        _say(f"workbench train: run {run_id} recorded as failed in {store.path}")
        return 1
    except KeyboardInterrupt as exc:  # SIGINT, SIGTERM, SIGHUP: the job is stopped and recorded
        code, name = _interrupt_code(exc)
        _say(f"workbench train: interrupted by {name}; run {run_id} recorded as "
             f"{getattr(exc, 'recorded_status', 'cancelled')} in {store.path}")
        return code
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

    from .runtime.batch import make_run_dir, run_id_for, runs_root
    names = list(ALGORITHMS) if args.algorithms == "all" else [a.strip() for a in args.algorithms.split(",")]
    prepared = _configs_and_store(args, names, "compare")
    if isinstance(prepared, int):
        return prepared
    configs, store = prepared
    parent = Path(args.out) if args.out else runs_root() / f"compare-{datetime.now():%Y%m%d-%H%M%S}"
    rows = []
    for cfg in configs:
        # "<parent>-<algorithm>", made unique in the store (two compares with --out a/x and b/x)
        run_id = run_id_for(parent / cfg.algorithm, cfg, store, name=f"{parent.resolve().name}-{cfg.algorithm}")
        make_run_dir(parent / cfg.algorithm, "--out")
        print(f"{cfg.algorithm}: run {run_id}", flush=True)
        try:
            result = _recorded_train(store, run_id, cfg, parent / cfg.algorithm, timeout=args.timeout)
        except MPILaunchError as exc:
            _say(f"workbench compare: {cfg.algorithm} failed: {exc}")
            rows.append([cfg.algorithm, "failed", "", "", "", "", run_id])
            continue
        except KeyboardInterrupt as exc:  # SIGINT, SIGTERM, SIGHUP: stop here, record, run no more
            code, name = _interrupt_code(exc)
            rest = [c.algorithm for c in configs[configs.index(cfg) + 1:]]
            _say(f"workbench compare: interrupted by {name}; run {run_id} recorded as "
                 f"{getattr(exc, 'recorded_status', 'cancelled')} in {store.path}"
                 + (f"; not run: {', '.join(rest)}" if rest else ""))
            return code
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
    if args.command not in ("train", "compare", "bench"):
        return _command(args)
    from .runtime.launcher import handling_signals, raise_interrupted
    try:
        # SIGTERM and SIGHUP end these commands like Ctrl-C: as an exception, so the store is
        # updated and no MPI process is left (while a job runs, the launcher handles them itself)
        with handling_signals(raise_interrupted):
            return _command(args)
    except KeyboardInterrupt as exc:  # before or after a run: nothing is running
        code, name = _interrupt_code(exc)
        _say(f"workbench {args.command}: interrupted by {name}")
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


def _command(args) -> int:
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
        from .bench.sizes import format_size
        worker = ["-m", "workbench.bench.allreduce",
                  "--sizes", ",".join(format_size(s) for s in args.sizes),
                  "--algorithms", ",".join(args.algorithms), "--dtype", args.dtype]
        if args.no_gloo:
            worker.append("--no-gloo")
        if args.json:
            worker += ["--json", args.json]
        try:
            run_mpi(args.ranks, worker, timeout=args.timeout, stream=True)
        except (MPILaunchError, ValueError) as exc:
            _say(f"workbench: {exc}")
            return 1
        return 0
    return 2  # argparse's required subcommands make this unreachable


if __name__ == "__main__":
    sys.exit(main())
