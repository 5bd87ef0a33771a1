"""``workbench train`` and ``workbench compare``: training under mpiexec (or srun inside a Slurm
allocation, ``--launcher``), every run recorded.

Options default to :class:`~workbench.config.RunConfig`'s defaults (one place says what they are);
``--lr``, ``--rho`` and ``--momentum`` default to the algorithm's own (``config.DEFAULTS``).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys

from ..comm.names import algorithm_names
from ..comm.options import PRESETS, WIRE_DTYPES
from ..config import RunConfig, without_ignored
from ..optim.registry import ALGORITHMS
from ..runtime.launch.blame import MPILaunchError
from ..runtime.launch.mpiexec import LAUNCHER_NAMES
from ..summary import PRINTED_KEYS
from .common import interrupt_code, open_store, percent, positive_int, positive_seconds, say
from .recording import recorded_train

#: RunConfig's field defaults: what an option not given means
DEFAULT = {f.name: f.default for f in dataclasses.fields(RunConfig)}


def fusion_bytes(text: str) -> int | None:
    """``--fusion-bytes``: ``inf`` (one message per step), ``0``, or a size (``4096``, ``64K``)."""
    if text.strip().lower() in ("inf", "none"):
        return None
    if text.strip() == "0":
        return 0
    from ..sizes import parse_size
    try:
        return parse_size(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be 0, inf or a size like 4096, 64K, 1M; got {text!r}") from None


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
            raise ConfigError("--launcher: a --vcluster run starts its ranks with mpiexec across the nodes; for srun, "
                              "submit with the cluster's Slurm (`eval $(workbench vcluster env NAME)`, then sbatch)")
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
                          + ("" if args.launcher else " (SLURM_JOB_ID is not set)") + "; add --launcher srun")
    if launcher == "srun":
        try:
            slurm.find_srun()
        except FileNotFoundError as exc:
            raise ConfigError(f"--launcher: {exc}") from None
    return launcher, args.srun_args, placement


def add_to(sub) -> None:
    train = sub.add_parser("train", help="train one configuration under mpiexec")
    train.add_argument("--algorithm", required=True, help=f"one of: {', '.join(ALGORITHMS)}")
    _training_options(train)
    train.add_argument("--out", metavar="DIR", help="run directory (default data/runs/<run-id>)")
    train.add_argument("--resume", metavar="DIR", help="continue a run from its checkpoint (bitwise for sync-*)")
    train.set_defaults(func=train_command, launches=True)

    compare = sub.add_parser("compare", help="train several algorithms and print a table")
    compare.add_argument("--algorithms", required=True, help=f"'all' or a comma-separated list of: "
                                                             f"{', '.join(ALGORITHMS)}")
    _training_options(compare)
    compare.add_argument("--target-accuracy", type=float, default=0.9,
                         help="accuracy for the time-to-accuracy column (default 0.9)")
    compare.add_argument("--out", metavar="DIR", help="parent directory of the runs "
                                                      "(default data/runs/compare-<time>)")
    compare.set_defaults(func=compare_command, launches=True)


def _training_options(p: argparse.ArgumentParser) -> None:
    """Options shared by train and compare; defaults from RunConfig. A wrong value is caught by
    RunConfig's own validation, so every check and its message live there."""
    p.add_argument("--ranks", type=int, default=DEFAULT["ranks"], help=f"MPI ranks (default {DEFAULT['ranks']})")
    p.add_argument("--model", default=DEFAULT["model"], help=f"mlp, wide_mlp, cnn, or module:function "
                                                             f"(default {DEFAULT['model']})")
    p.add_argument("--dataset", default=DEFAULT["dataset"], help=f"digits, synthetic, or a .npz path "
                                                                 f"(default {DEFAULT['dataset']})")
    p.add_argument("--epochs", type=int, default=DEFAULT["epochs"], help=f"(default {DEFAULT['epochs']})")
    p.add_argument("--seed", type=int, default=DEFAULT["seed"], help=f"(default {DEFAULT['seed']})")
    p.add_argument("--lr", type=float, help="learning rate (default: the algorithm's)")
    p.add_argument("--rho", type=float, help="elastic coefficient (default: p*lr*rho = 0.9)")
    p.add_argument("--tau", type=int, default=DEFAULT["tau"],
                   help=f"communication period in steps (default {DEFAULT['tau']})")
    p.add_argument("--momentum", type=float, help="momentum (default: the algorithm's)")
    p.add_argument("--batch-size", type=int, default=DEFAULT["batch_size"], help=f"(default {DEFAULT['batch_size']})")
    p.add_argument("--collective", default=DEFAULT["collective"],
                   help=f"all-reduce algorithm of the synchronous algorithms (default {DEFAULT['collective']}): "
                        f"{', '.join(algorithm_names())}")
    p.add_argument("--per-layer", action="store_true", help="one message per layer instead of one flat buffer "
                                                            "(= --fusion-bytes 0)")
    p.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=DEFAULT["overlap"],
                   help="overlap communication with compute: sync-sgd issues gradient buckets from the backward "
                        "hooks; the EASGD family exchanges weights while the gradient is computed (default on)")
    g = p.add_argument_group("gradient communication (sync-sgd; --fusion-bytes also sync-easgd)")
    g.add_argument("--communication", metavar="PRESET",
                   help=f"a preset of the options below: {', '.join(PRESETS)}")
    g.add_argument("--fusion-bytes", type=fusion_bytes, default=DEFAULT["fusion_bytes"], metavar="N",
                   help="bucket threshold in bytes (4096, 64K, 1M; 0 = one message per tensor; "
                        "inf = one message per step, the default)")
    g.add_argument("--wire-dtype", default=DEFAULT["wire_dtype"], metavar="DTYPE",
                   help=f"dtype of the gradients on the wire: {', '.join(WIRE_DTYPES)} (default fp32)")
    g.add_argument("--sparse-ratio", type=float, metavar="R",
                   help="coarse-grained sparse communication: share of chunks sent, in (0, 1] (CSC on when given)")
    g.add_argument("--sparse-chunk", type=int, default=DEFAULT["sparse_chunk"], metavar="C",
                   help=f"CSC chunk size in elements (default {DEFAULT['sparse_chunk']})")
    g.add_argument("--warmup-epochs", type=int, default=DEFAULT["warmup_epochs"], metavar="W",
                   help="CSC: dense first, the ratio falling to R over W epochs (default 0)")
    g.add_argument("--no-residual", action="store_true", help="CSC: drop what was not sent (ablation)")
    g.add_argument("--no-momentum-correction", action="store_true",
                   help="CSC: apply momentum after the exchange instead of before the selection (ablation)")
    p.add_argument("--eval-every", type=int, default=DEFAULT["eval_every"],
                   help=f"evaluate every N steps (master: arrivals; default {DEFAULT['eval_every']})")
    p.add_argument("--checkpoint-every", type=int, default=DEFAULT["checkpoint_every"],
                   help="checkpoint every N steps (0: never, the default)")
    p.add_argument("--no-telemetry", action="store_true")
    p.add_argument("--fail-rank", type=int, help="debug: make this rank raise at --fail-step")
    p.add_argument("--fail-step", type=int, help="debug: the step at which --fail-rank raises")
    p.add_argument("--timeout", type=positive_seconds, default=1800,
                   help="seconds before the job is killed (finite, > 0; default 1800)")
    p.add_argument("--launcher", choices=LAUNCHER_NAMES,
                   help="how the ranks start: srun (a job step of the current Slurm allocation) or mpiexec "
                        "(default: srun when SLURM_JOB_ID is set, e.g. under salloc or in an sbatch script; "
                        "else mpiexec)")
    p.add_argument("--srun-args", metavar="ARGS", type=srun_arguments, default=[],
                   help="extra srun arguments, one string: --srun-args='--mpi=pmi2' (with srun only)")
    p.add_argument("--vcluster", metavar="NAME", help="run the ranks on the nodes of a virtual cluster "
                                                      "(`workbench vcluster up NAME`); the run directory must be one "
                                                      "its nodes see")
    p.add_argument("--ppn", type=positive_int, default=None,
                   help="ranks per node on the virtual cluster, block placement (default 1)")
    p.add_argument("--store", metavar="FILE", help="results store (default $WORKBENCH_STORE or "
                                                   "data/workbench.sqlite)")


_OPTION = {"tau": "--tau", "rho": "--rho", "collective": "--collective", "momentum": "--momentum",
           "fusion_bytes": "--fusion-bytes", "wire_dtype": "--wire-dtype", "sparse_ratio": "--sparse-ratio"}


def _config(args: argparse.Namespace, algorithm: str, shared: bool = False):
    """The RunConfig of ``algorithm`` with the command's options. An option the algorithm ignores
    (``--collective`` on a master-based one, ``--tau``/``--rho`` on an SGD baseline) is an error,
    unless ``shared`` (compare: the options serve several algorithms): then it is left out for this
    algorithm with a note on stderr."""
    values = {"algorithm": algorithm, "single_buffer": not args.per_layer, "overlap": args.overlap,
              "telemetry": not args.no_telemetry, "communication": args.communication,
              "fusion_bytes": args.fusion_bytes, "wire_dtype": args.wire_dtype, "sparse_ratio": args.sparse_ratio,
              "sparse_chunk": args.sparse_chunk, "warmup_epochs": args.warmup_epochs,
              "residual": not args.no_residual, "momentum_correction": not args.no_momentum_correction,
              **{name: getattr(args, name) for name in ("ranks", "model", "dataset", "epochs", "seed", "lr", "rho",
                                                        "tau", "momentum", "batch_size", "collective", "eval_every",
                                                        "checkpoint_every", "fail_rank", "fail_step")}}
    if shared:
        values, dropped = without_ignored(values)
        if dropped:
            print(f"workbench {args.command}: note: {algorithm} ignores {', '.join(_OPTION[n] for n in dropped)}; "
                  f"run without it", file=sys.stderr)
    return RunConfig(**values)


def _configs_and_store(args, names: list[str], command: str):
    """Validate every configuration before anything launches, then open the store.
    Returns ``(configs, store, (launcher, srun_args, placement))``, or the exit code after printing why not."""
    from ..config import ConfigError
    try:
        configs = [_config(args, name, shared=command == "compare") for name in names]
        args.configs = configs
        launch = launcher_of(args)
        _check_paths(args, configs, launch[2].get("vcluster"))
    except ConfigError as exc:
        print(f"workbench {command}: error: {exc}", file=sys.stderr)
        return 2
    store = open_store(args, command)
    return 1 if store is None else (configs, store, launch)


def _check_paths(args, configs, vcluster=None) -> None:
    """``--out`` and ``--resume``, before anything is created or launched: ConfigError naming the option
    (with ``vcluster``: also when its nodes would not see them)."""
    from pathlib import Path

    from ..config import ConfigError
    from ..runtime.rank import checkpoint
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


def train_command(args) -> int:
    from pathlib import Path

    if (code := _rootless(args, "train")) is not None:
        return code
    from ..runtime.rundir import make_run_dir, new_run_id, run_id_for
    prepared = _configs_and_store(args, [args.algorithm], "train")
    if isinstance(prepared, int):
        return prepared
    [cfg], store, (launcher, srun_args, placement) = prepared
    # a resumed run is a new run in a new directory, linked to the one it continues: the old
    # run's row and files stay as they were, whatever happens to the new one
    run_dir = Path(args.out) if args.out else _runs(placement) / new_run_id(cfg)
    run_id = run_id_for(run_dir, cfg, store)
    make_run_dir(run_dir, "--out")
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
        result = recorded_train(store, run_id, cfg, run_dir, resumed_from=resumed_from, resume=args.resume,
                                 timeout=args.timeout, launcher=launcher, srun_args=srun_args, **placement)
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

    from ..runtime.rundir import make_run_dir, run_id_for
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
        make_run_dir(parent / cfg.algorithm, "--out")
        print(f"{cfg.algorithm}: run {run_id}", flush=True)
        try:
            result = recorded_train(store, run_id, cfg, parent / cfg.algorithm, timeout=args.timeout,
                                    launcher=launcher, srun_args=srun_args, **placement)
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
