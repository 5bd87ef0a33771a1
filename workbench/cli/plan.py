"""``workbench plan``: a burst-parallel plan (DeepPool, MLSys'22: every layer its own data-parallel
width) from the shell.

    workbench plan --model vgg16 --batch 32 --gpus 8 --amplification 2.0
    workbench plan --model wrn101_2 --batch 32 --gpus 64 --amplification inf --json plan.json
    workbench plan --model inception_v3 --batch 16 --gpus 8 --data-parallel
    workbench plan --model M.json --profile P.prof --batch 32 --gpus 8 --amplification 2 --calibration BENCH.json
    workbench plan --model vgg16 --batch 32 --gpus 8 --amplification 2 --cost-model deeppool

``--model``: ``vgg16``, ``wrn101_2``, ``inception_v3`` (DeepPool's layer lists and A100 tables,
shipped) or a model JSON (``--model-file`` says the same); ``--profile``: a ``.prof`` table
(default the model's own). ``--amplification A``: no layer may use more than ``A`` times its
single-GPU time in GPU time (``inf``: no limit); ``--data-parallel``: every layer on all GPUs.
``--cost-model workbench`` (default: :mod:`workbench.burst.planner`, the published 2.66e5
bytes/us and 240 us per transfer, or this machine's network with ``--calibration``) or
``deeppool`` (the published planner reproduced, :mod:`workbench.burst.deeppool`).

``--json FILE`` writes ``BurstPlan.to_dict()``: ``{"iteration_ms", "gpu_ms", "gpus_used", "model",
"batch", "gpus", "cost_model", "amplification", "data_parallel", "layers": [{"id", "type",
"gpus", "ranks", "batch_per_gpu", "samples", "compute_ms", "sync_ms", "transfer_ms", "start_ms",
"end_ms", "amplification"}, ...], "transfers": [{"src", "dst", "src_ranks", "dst_ranks", "bytes",
"ms"}, ...]}`` (layer ids as in the model file).
"""
from __future__ import annotations

import argparse
import math
import sys

COST_MODELS = ("workbench", "deeppool")


def parse_amplification(text: str) -> float:
    """``--amplification``: a number > 1, or ``inf`` (no limit)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 1:
        raise argparse.ArgumentTypeError(f"must be a number > 1, or inf (no limit); got {text!r}")
    return value


def _one_line_errors(parser: argparse.ArgumentParser) -> None:
    """Every bad option is one line on stderr and exit 2, like the planner's own errors (unknown
    options too: argparse would leave them to ``workbench``'s parser, which prints its usage)."""
    def error(message: str):
        print(f"{parser.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)

    def parse_known_args(args=None, namespace=None, _parse=parser.parse_known_args):
        namespace, extras = _parse(args, namespace)
        if extras:
            error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras

    parser.error, parser.parse_known_args = error, parse_known_args


def add_to(sub) -> None:
    from ..schedules import SCHEDULES as COLLECTIVES
    p = sub.add_parser("plan", help="plan burst parallelism: every layer its own number of GPUs (DeepPool)",
                       description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    _one_line_errors(p)
    p.add_argument("--model", metavar="NAME|M.json", help="vgg16, wrn101_2, inception_v3 or a model JSON")
    p.add_argument("--model-file", metavar="M.json", help="a model JSON (instead of --model)")
    p.add_argument("--profile", metavar="P.prof", help="per-layer time table (default: the model's own)")
    p.add_argument("--batch", type=int, required=True, help="global batch (samples per iteration)")
    p.add_argument("--gpus", type=int, required=True, help="GPUs of the job, a power of two")
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--amplification", type=parse_amplification, metavar="A",
                     help="amplification limit per layer, > 1 (inf: no limit)")
    how.add_argument("--data-parallel", action="store_true", help="plain data parallelism: every layer on all GPUs")
    p.add_argument("--cost-model", choices=COST_MODELS, default="workbench",
                   help="workbench (default) or deeppool (the published planner)")
    p.add_argument("--calibration", metavar="BENCH.json",
                   help="this machine's network, fitted to a `workbench bench allreduce --json` file")
    p.add_argument("--collective", choices=tuple(COLLECTIVES), default="ring",
                   help="workbench: the gradient all-reduce's schedule (default ring)")
    p.add_argument("--missing", choices=("error", "zero"), default=None,
                   help="workbench: layer types without any row in the table (default zero for the shipped "
                        "tables, error for --profile)")
    p.add_argument("--json", metavar="OUT", help="also write the plan as JSON (keys in `workbench plan -h`)")
    p.set_defaults(func=run)


def _inputs(args):
    from ..burst.graph import DATA, BurstError, load_model, load_profile
    if args.model and args.model_file and args.model != args.model_file:
        raise BurstError("give --model or --model-file, not both")
    name = args.model or args.model_file
    if not name:
        raise BurstError("--model (vgg16, wrn101_2, inception_v3 or a model JSON) is required")
    model = load_model(name)
    if args.profile:
        table = load_profile(args.profile)
    elif model.profile_path is not None:
        table = load_profile(model.profile_path)
    else:
        raise BurstError(f"model {name} names no profile file; give --profile")
    shipped = str(table.source).startswith(str(DATA))
    return model, table, shipped


def _plan(args, model, table, shipped):
    amplification = math.inf if args.data_parallel else args.amplification
    if args.cost_model == "deeppool":
        from ..burst.deeppool import plan_deeppool
        options = {}
        if args.calibration:
            from ..netsim.calibration import calibrate_file
            cal = calibrate_file(args.calibration)
            options = {"bandwidth": cal.link_bandwidth / 1e6, "latency_us": cal.link_latency * 1e6}
        plan = plan_deeppool(model, table, args.batch, args.gpus, amplification=amplification,
                             data_parallel=args.data_parallel, **options)
        return plan, "deeppool: the published planner" + (f", network of {args.calibration}" if options else
                                                          ", 2.66e5 bytes/us, 240 us per transfer")
    from ..burst.costs import CostModel
    from ..burst.planner import plan as make_plan
    missing = args.missing or ("zero" if shipped else "error")
    if args.calibration:
        cost = CostModel.calibrated(args.calibration, args.collective, missing=missing)
    else:
        cost = CostModel.paper(collective=args.collective, missing=missing)
    plan = make_plan(model, table, args.batch, args.gpus, amplification, args.data_parallel, cost)
    return plan, cost.describe()


def run(args) -> int:
    from tabulate import tabulate

    from ..burst.graph import BurstError
    from ..checks import writable_file
    try:
        if args.json:  # written after the planning: checked before it
            writable_file("--json", args.json)
        model, table, shipped = _inputs(args)
        plan, described = _plan(args, model, table, shipped)
        if args.json:
            plan.write_json(args.json)
    except (BurstError, ValueError, OSError, KeyError) as exc:
        print(f"workbench plan: error: {exc}", file=sys.stderr)
        return 2
    limit = "data parallel" if plan.data_parallel else f"amplification limit {_limit(plan.amplification)}"
    print(f"{model.title or model.name}: {len(model.layers)} layers, global batch {plan.batch}, {plan.gpus} GPUs, "
          f"{limit}")
    print(f"cost model {described}\n")
    rows = [[l.id, l.type, l.gpus, f"{l.ranks[0]}-{l.ranks[-1]}" if l.gpus > 1 else l.ranks[0],
             f"{l.compute_ms:.3f}", f"{l.sync_ms:.3f}", f"{l.transfer_ms:.3f}", f"{l.start_ms:.3f}"]
            for l in plan.layers]
    print(tabulate(rows, headers=["layer", "type", "gpus", "ranks", "compute ms", "sync ms", "transfer ms",
                                  "start ms"]))
    compute = sum(l.compute_ms for l in plan.layers)
    sync = sum(l.sync_ms for l in plan.layers)
    transfer = sum(l.transfer_ms for l in plan.layers)
    print(f"\nsums over layers: compute {compute:.3f} ms, sync {sync:.3f} ms, transfer {transfer:.3f} ms")
    print(f"iteration {plan.iteration_ms:.3f} ms, GPU time {plan.gpu_ms:.3f} ms, "
          f"{plan.gpus_used} of {plan.gpus} GPUs used")
    if args.json:
        print(f"\nwrote {args.json}")
    return 0


def _limit(value) -> str:
    return "inf" if value is None or math.isinf(value) else f"{value:g}"
