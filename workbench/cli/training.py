"""``workbench train`` and ``workbench compare``: training under mpiexec (or srun inside a Slurm
allocation, ``--launcher``), every run recorded.

Every training flag is a RunConfig option's declaration (:func:`workbench.config.options`): its
flag, type, help and default are said there once; an option not given takes RunConfig's default
(``--lr``, ``--rho`` and ``--momentum``: the algorithm's own, :attr:`RunConfig.hyper`).
"""
from __future__ import annotations

import argparse
import sys

from ..config import RunConfig, options, without_ignored
from ..optim.registry import ALGORITHMS
from ..runtime.launch.blame import MPILaunchError
from ..runtime.launch.launcher import LAUNCHER_NAMES
from ..summary import PRINTED_KEYS
from .common import fusion_bytes_argument, interrupt_code, open_store, percent, positive_int, positive_seconds, say
from ..runtime.client.batch_run import BatchRun

def srun_arguments(text: str) -> list[str]:
    """``--srun-args``: one string of srun arguments, split as a shell would."""
    import shlex
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"cannot split {text!r} into arguments: {exc}") from None


def launcher_of(args) -> tuple[str, list[str], dict]:
    """``(launcher, srun_args, placement)`` of the command: ``--launcher``, else srun inside a Slurm
    allocation; ``placement``: ``{"vcluster": VirtualCluster, "ppn": K}`` with ``--vcluster``.
    ConfigError for ``--srun-args`` without srun, srun that is not installed, ``--ppn`` without
    ``--vcluster``, or a virtual cluster that is not up."""
    from ..config import ConfigError
    from ..runtime.launch import slurm
    from ..runtime.launch.mpiexec import default_launcher
    placement = {}
    if args.ppn is not None and not args.vcluster:
        raise ConfigError("--ppn: ranks per node of a virtual cluster; give --vcluster NAME too")
    if args.vcluster:
        if args.launcher == "srun":
            raise ConfigError("--launcher slurm: a --vcluster run starts its ranks with mpiexec across the nodes; for srun, "
                              "submit with the cluster's Slurm (`eval $(workbench vcluster env NAME)`, then sbatch)")
        from ..runtime.launch.heartbeat import timeout_seconds
        timeout_seconds()  # the nodes' heartbeats: a bad $WORKBENCH_HEARTBEAT_TIMEOUT is one line, now
        from ..vcluster import PlanError, VirtualCluster, VirtualClusterError
        try:
            vc = VirtualCluster.attach(args.vcluster)
            vc.mpiexec_args(max(c.ranks for c in args.configs), args.ppn or 1)  # enough nodes for the ranks
        except (PlanError, VirtualClusterError) as exc:
            raise ConfigError(f"--vcluster: {exc}") from None
        placement = {"vcluster": vc, "ppn": args.ppn or 1}
        args.launcher = "mpiexec"
    launcher = args.launcher or default_launcher()
    if args.srun_args and launcher != "srun":
        raise ConfigError(f"--srun-args: only with srun, and the ranks start with {launcher}"
                          + ("" if args.launcher else " (SLURM_JOB_ID is not set)") + "; add --launcher slurm")
    if launcher == "srun":
        try:
            slurm.find_srun()
        except FileNotFoundError as exc:
            raise ConfigError(f"--launcher: {exc}") from None
        from ..mpilib import rank_library, srun_mpi_problem
        library = rank_library().get("flavour")
        problem = srun_mpi_problem(library, args.srun_args, slurm.mpi_plugins()) if library else None
        if problem:
            raise ConfigError(f"--srun-args: {problem}")
    else:  # the MPI library, and mpi4py's the same one, before anything starts
        from ..mpilib import MPIFlavourError, check_pairing, find_mpiexec, flavour_of
        try:
            check_pairing(flavour_of(find_mpiexec()))
        except (MPIFlavourError, FileNotFoundError) as exc:
            raise ConfigError(f"mpiexec: {exc}") from None
        if not placement:  # a job on this host alone: the network it gets (docs/security.md)
            from ..runtime.launch import private_net
            try:
                private_net.prefix()
            except private_net.PrivateNetworkError as exc:
                raise ConfigError(str(exc)) from None
    return launcher, args.srun_args, placement


def add_to(sub) -> None:
    train = sub.add_parser("train", help="train one configuration under mpiexec")
    train.add_argument("--algorithm", required=True, help=f"one of: {', '.join(ALGORITHMS)}; or package.module:NAME, "
                                                          "an Algorithm defined in your module (docs/own-algorithm.md)")
    _training_options(train)
    train.add_argument("--out", metavar="DIR", help="run directory (default data/runs/<run-id>)")
    train.add_argument("--resume", metavar="DIR", help="continue a run from its checkpoint (bitwise for sync-*)")
    train.set_defaults(func=train_command, launches=True)

    compare = sub.add_parser("compare", help="train several algorithms and print a table")
    compare.add_argument("--algorithms", required=True, help=f"'all' or a comma-separated list of: "
                                                             f"{', '.join(ALGORITHMS)} (or package.module:NAME)")
    _training_options(compare)
    compare.add_argument("--target-accuracy", type=float, default=0.9,
                         help="accuracy for the time-to-accuracy column (default 0.9)")
    compare.add_argument("--out", metavar="DIR", help="parent directory of the runs "
                                                      "(default data/runs/compare-<time>)")
    compare.set_defaults(func=compare_command, launches=True)


def _training_options(p: argparse.ArgumentParser) -> None:
    """Options shared by train and compare: one flag per declared RunConfig option
    (:func:`workbench.config.options`), then the launch options. An option not given is left out,
    so RunConfig's own default applies; a wrong value is caught by RunConfig's validation."""
    groups = {"training": p}
    for name, declared in options().items():
        if declared.flag is None:
            continue
        if declared.group not in groups:
            groups[declared.group] = p.add_argument_group(declared.group)
        _add_option(groups[declared.group], name, declared)
    p.add_argument("--per-layer", action="store_true", help=argparse.SUPPRESS)  # deprecated: --fusion-bytes 0
    _launch_options(p)


def _add_option(group, name: str, declared) -> None:
    """One RunConfig option as a flag: a bool as ``--x/--no-x``, the others with their declared type."""
    if isinstance(declared.default, bool):
        group.add_argument(declared.flag, dest=name, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                           help=f"{declared.help} (default {'on' if declared.default else 'off'})")
        return
    default = "" if declared.default is None else f" (default {declared.default})"
    group.add_argument(declared.flag, dest=name, default=argparse.SUPPRESS, help=declared.help + default,
                       **{"type": _TYPES.get(name, str), **declared.cli})


def _launch_options(p: argparse.ArgumentParser) -> None:
    """How and where the ranks start (not part of the run's configuration)."""
    p.add_argument("--timeout", type=positive_seconds, default=1800,
                   help="seconds before the job is killed (finite, > 0; default 1800)")
    p.add_argument("--launcher", type=_launcher, metavar="{mpi,slurm}",
                   help="how the ranks start, the words of wb.Cluster(engines=...): slurm (srun: a job step of the "
                        "current Slurm allocation) or mpi (mpiexec); default: slurm when SLURM_JOB_ID is set, e.g. "
                        "under salloc or in an sbatch script, else mpi")
    p.add_argument("--srun-args", metavar="ARGS", type=srun_arguments, default=[],
                   help="extra srun arguments, one string: --srun-args='--mpi=pmi2' (with --launcher slurm only)")
    p.add_argument("--vcluster", metavar="NAME", help="run the ranks on the nodes of a virtual cluster "
                                                      "(`workbench vcluster up NAME`); the run directory must be one "
                                                      "its nodes see")
    p.add_argument("--ppn", type=positive_int, default=None,
                   help="ranks per node on the virtual cluster, block placement (default 1)")
    p.add_argument("--store", metavar="FILE", help="results store (default $WORKBENCH_STORE or "
                                                   "data/workbench.sqlite)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="a progress bar on stderr while the ranks train: steps, loss, test accuracy (default: on "
                        "when stderr is a terminal; --progress for a batch job's log, redrawn every 30 s)")


def _progress(args) -> bool:
    """``--progress``, or whether stderr is a terminal."""
    return sys.stderr.isatty() if args.progress is None else args.progress


#: ``--launcher`` words (wb.Cluster's ``engines=``) -> the program that starts the ranks
LAUNCHERS = {"mpi": "mpiexec", "slurm": "srun"}


def _launcher(text: str) -> str:
    """``--launcher``: ``mpi`` or ``slurm``; the program names ``mpiexec``/``srun`` still work for one
    release, with a warning."""
    if text in LAUNCHERS:
        return LAUNCHERS[text]
    if text in LAUNCHER_NAMES:
        word = next(k for k, v in LAUNCHERS.items() if v == text)
        print(f"workbench: warning: --launcher {text} is deprecated; say --launcher {word}", file=sys.stderr)
        return text
    raise argparse.ArgumentTypeError(f"must be one of {', '.join(LAUNCHERS)}; got {text!r}")


#: argparse types of options whose text is not their value's Python spelling
_TYPES = {"fusion_bytes": fusion_bytes_argument}


def flag_of(message: str) -> str:
    """A RunConfig error said with the command's flags: ``wire_dtype must be ...`` -> ``--wire-dtype must be ...``."""
    for name, declared in options().items():
        if declared.flag and (message.startswith(name + " ") or message.startswith(name + ":")
                              or message.startswith(name + "=")):
            return declared.flag + message[len(name):]
    return message


def _config(args: argparse.Namespace, algorithm: str, shared: bool = False):
    """The RunConfig of ``algorithm`` with the command's options. An option the algorithm ignores
    (``--collective`` on a master-based one, ``--tau``/``--rho`` on an SGD baseline) is an error,
    unless ``shared`` (compare: the options serve several algorithms): then it is left out for this
    algorithm with a note on stderr."""
    values = {"algorithm": algorithm, **{name: getattr(args, name) for name in options() if hasattr(args, name)}}
    if args.per_layer:
        from ..config import ConfigError
        if values.get("fusion_bytes", 0) != 0:
            raise ConfigError(f"--per-layer is --fusion-bytes 0 (one message per tensor); it contradicts "
                              f"--fusion-bytes {values['fusion_bytes']}: give one of them")
        values["fusion_bytes"] = 0
    if shared:
        values, dropped = without_ignored(values)
        if dropped:
            print(f"workbench {args.command}: note: {algorithm} ignores "
                  f"{', '.join(options()[n].flag for n in dropped)}; run without it", file=sys.stderr)
    return RunConfig(**values)


def _configs_and_store(args, names: list[str], command: str):
    """Validate every configuration before anything launches, then open the store.
    Returns ``(configs, store, (launcher, srun_args, placement))``, or the exit code after printing why not."""
    from ..config import ConfigError
    try:
        if args.per_layer:
            print(f"workbench {command}: warning: --per-layer is deprecated; say --fusion-bytes 0", file=sys.stderr)
        configs = [_config(args, name, shared=command == "compare") for name in names]
        args.configs = configs
        launch = launcher_of(args)
        _check_paths(args, configs, launch[2].get("vcluster"))
    except ConfigError as exc:
        print(f"workbench {command}: error: {flag_of(str(exc))}", file=sys.stderr)
        return 2
    store = open_store(args, command)
    return 1 if store is None else (configs, store, launch)


def _check_paths(args, configs, vcluster=None) -> None:
    """``--out``, ``--resume`` and ``--store``, before anything is created or launched: ConfigError
    naming the option (with ``vcluster``: also when its nodes would not see them). Where a run or
    the store will be written must be a directory that is, or can be, created and written
    (:func:`~workbench.checks.writable_folder`): without ``--out``, the runs folder."""
    from pathlib import Path

    from ..checks import writable_file, writable_folder
    from ..config import ConfigError
    from ..runtime.rank import checkpoint
    from ..store import default_path
    out = Path(args.out) if args.out else None
    if vcluster is not None:
        from ..runtime.launch.batch import check_visible
        check_visible(vcluster, {"--out": out, "--resume": getattr(args, "resume", None)})
    if out is not None and out.exists() and not out.is_dir():
        raise ConfigError(f"--out: {args.out!r} is a file, not a directory")
    for cfg in configs:
        run_dir = out if args.command == "train" else (out / cfg.algorithm if out else None)
        if run_dir is not None and (run_dir / "config.json").exists():
            raise ConfigError(f"--out: {str(run_dir)!r} already holds a run ({run_dir / 'config.json'}); give a "
                              f"new directory" + (" (a resumed run writes into a new one)" if args.command == "train"
                                                  else ""))
        if run_dir is not None:
            writable_folder("--out", run_dir, ConfigError)
    if out is None:
        runs = _runs({"vcluster": vcluster} if vcluster is not None else {})
        writable_folder("--out", runs, ConfigError, fix="the runs go there without --out: give --out DIR"
                                                        + ("" if vcluster is not None else " or set WORKBENCH_RUNS"))
    writable_file("--store", args.store or default_path(), ConfigError,
                  fix="give --store FILE in a folder you can write" + ("" if args.store else
                                                                       " (or set WORKBENCH_STORE)"))
    if getattr(args, "resume", None):
        try:
            checkpoint.check_resume(args.resume, configs[0])
        except ConfigError as exc:
            raise ConfigError(f"--{exc}") from None  # "resume: ..." -> "--resume: ..."


def _runs(placement: dict):
    """The runs folder: the usual one, or on a virtual cluster whose nodes do not see it, its shared folder's."""
    from ..runtime.launch.batch import runs_folder
    from ..runtime.rundir import runs_root
    return runs_folder(placement["vcluster"]) if placement else runs_root()


def _rootless(args, command: str) -> int | None:
    """Not root, with --vcluster: the command runs again inside the cluster's user namespace; its exit code."""
    if not args.vcluster:
        return None
    from ..vcluster import VirtualClusterError, rootless
    try:
        return rootless.reenter(args)
    except VirtualClusterError as exc:
        print(f"workbench {command}: error: --vcluster: {exc}", file=sys.stderr)
        return 2


def _made(run_dir, command: str) -> int | None:
    """Create ``run_dir`` (:func:`~workbench.runtime.rundir.make_run_dir`); the exit code after the
    one-line error where it cannot be (changed since :func:`_check_paths`), else None."""
    from ..config import ConfigError
    from ..runtime.rundir import make_run_dir
    try:
        make_run_dir(run_dir, "--out")
    except ConfigError as exc:
        print(f"workbench {command}: error: {exc}", file=sys.stderr)
        return 2
    return None


def train_command(args) -> int:
    from pathlib import Path

    if (code := _rootless(args, "train")) is not None:
        return code
    from ..runtime.rundir import new_run_id, run_id_for
    prepared = _configs_and_store(args, [args.algorithm], "train")
    if isinstance(prepared, int):
        return prepared
    [cfg], store, (launcher, srun_args, placement) = prepared
    # a resumed run is a new run in a new directory, linked to the one it continues: the old
    # run's row and files stay as they were, whatever happens to the new one
    run_dir = Path(args.out) if args.out else _runs(placement) / new_run_id(cfg)
    run_id = run_id_for(run_dir, cfg, store)
    if (code := _made(run_dir, "train")) is not None:
        return code
    print(f"{'run_id':20s} {run_id}", flush=True)
    if placement:
        vc = placement["vcluster"]
        print(f"{'vcluster':20s} {vc.name}: {cfg.ranks} ranks on {-(-cfg.ranks // placement['ppn'])} of its "
              f"{vc.nodes} nodes, {placement['ppn']} per node", flush=True)
    if launcher == "srun":
        import os

        from ..runtime.launch import slurm
        print(f"{'launcher':20s} srun{' ' + ' '.join(srun_args) if srun_args else ''}"
              f"{' in Slurm job ' + os.environ['SLURM_JOB_ID'] if slurm.in_allocation() else ''}", flush=True)
    resumed_from = None
    if args.resume:
        resumed_from = store.run_id_of(args.resume) or str(Path(args.resume).resolve())
        print(f"{'resumed_from':20s} {resumed_from}", flush=True)
    try:
        result = BatchRun(store, run_id, cfg, run_dir, resumed_from=resumed_from, progress=_progress(args),
                          resume=args.resume, timeout=args.timeout, launcher=launcher, srun_args=srun_args,
                          **placement).run()
    except (MPILaunchError, ValueError, FileNotFoundError) as exc:
        say(f"workbench train: {exc}")
        say(f"workbench train: run {run_id} recorded as failed in {store.path}")
        return 1
    except KeyboardInterrupt as exc:  # SIGINT, SIGTERM, SIGHUP: the job is stopped and recorded
        code, name = interrupt_code(exc)
        say(f"workbench train: interrupted by {name}; run {run_id} recorded as "
             f"{getattr(exc, 'recorded_status', 'cancelled')} in {store.path}")
        return code
    summary = {**result.summary, "run_dir": result.run_dir}
    for key in (*PRINTED_KEYS, "run_dir"):  # the summary's fields, as workbench.summary lists them
        if key in summary:
            print(f"{key:20s} {summary[key]}")
    print(f"{'store':20s} {store.path}")
    return 0


def compare_command(args) -> int:
    from datetime import datetime
    from pathlib import Path

    if (code := _rootless(args, "compare")) is not None:
        return code
    from tabulate import tabulate

    from ..runtime.rundir import run_id_for
    names = list(ALGORITHMS) if args.algorithms == "all" else [a.strip() for a in args.algorithms.split(",")]
    prepared = _configs_and_store(args, names, "compare")
    if isinstance(prepared, int):
        return prepared
    configs, store, (launcher, srun_args, placement) = prepared
    parent = Path(args.out) if args.out else _runs(placement) / f"compare-{datetime.now():%Y%m%d-%H%M%S}"
    rows = []
    for cfg in configs:
        # "<parent>-<algorithm>", made unique in the store (two compares with --out a/x and b/x)
        run_id = run_id_for(parent / cfg.algorithm, cfg, store, name=f"{parent.resolve().name}-{cfg.algorithm}")
        if (code := _made(parent / cfg.algorithm, "compare")) is not None:
            return code
        print(f"{cfg.algorithm}: run {run_id}", flush=True)
        try:
            result = BatchRun(store, run_id, cfg, parent / cfg.algorithm, progress=_progress(args),
                              timeout=args.timeout, launcher=launcher, srun_args=srun_args, **placement).run()
        except MPILaunchError as exc:
            say(f"workbench compare: {cfg.algorithm} failed: {exc}")
            rows.append([cfg.algorithm, "failed", "", "", "", "", run_id])
            continue
        except KeyboardInterrupt as exc:  # SIGINT, SIGTERM, SIGHUP: stop here, record, run no more
            code, name = interrupt_code(exc)
            rest = [c.algorithm for c in configs[configs.index(cfg) + 1:]]
            say(f"workbench compare: interrupted by {name}; run {run_id} recorded as "
                 f"{getattr(exc, 'recorded_status', 'cancelled')} in {store.path}"
                 + (f"; not run: {', '.join(rest)}" if rest else ""))
            return code
        s, tta = result.summary, result.time_to_accuracy(args.target_accuracy)
        rows.append([cfg.algorithm, f"{s['final_test_accuracy']:.3f}", f"{s['wall_seconds']:.2f}",
                     "not reached" if tta is None else f"{tta:.2f}",
                     percent(s["comm_fraction"]), percent(s["comm_fraction_workers"]), run_id])
    print(tabulate(rows, headers=["algorithm", "final test acc", "train wall s",
                                  f"s to {args.target_accuracy:g} acc", "comm share (all ranks)",
                                  "comm share (workers)", "run id"]))
    print(f"\nruns under {parent}, recorded in {store.path}")
    return 0 if all(r[1] != "failed" for r in rows) else 1
