"""``workbench predict``: the scale-out predictor (:mod:`workbench.netsim.predict`) from the shell.

    workbench predict --model alexnet --ranks 1,8,64,512 --fusion-bytes 0          # dense, per tensor
    workbench predict --fusion-bytes 64M --overlap --wire-dtype fp16 --sparse-ratio 0.01
    workbench predict --algorithm easgd --ranks 4,16 --tau 1
    workbench predict --algorithm streaming-diloco --sync-every 100 --fragments 4 --sync-delay 5 --outer-wire-dtype bf16
    workbench predict --profile layers.csv --calibration benchmarks/results/allreduce_4ranks.json
    workbench predict --calibration VCLUSTER_BENCH.json --calibration-topology fully_connected:4 --ranks 64,512

Units: ``--bandwidth`` bytes/s per link (default 7e9: 56 Gbit/s, GradientFlow's network),
``--latency`` seconds per all-reduce step (default 5e-6), ``--burst`` bytes a link sends at once
after an idle spell (a shaped link's token bucket; default 0), ``--socket-buffer`` bytes a connection
carries before its receiver asks for them (TCP's socket buffers; default 0), ``--fusion-bytes`` bytes of float32
gradient (``0``: one message per tensor, ``none``: one per step; K/M/G suffixes),
``--gpu-flops`` FLOP/s, ``--update-s`` seconds. ``--profile`` is a CSV with the columns
``name,parameters,forward_s,backward_s[,tensors]`` (layers in forward order).

``--json FILE`` writes ``{"command": "predict", "model", "algorithm", "tau", "update_s", "profile":
{layers, parameters, compute_s, batch, gpu_flops, efficiency}, "network": {model, collective,
bandwidth_Bps, latency_s, burst_bytes, socket_buffer_bytes}, "options": {the Communication fields}, "rows": [{algorithm, ranks,
step_s, compute_s, comm_s, exposed_comm_s, comm_share, wire_bytes, messages, buckets, speedup,
efficiency}, ...]}``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .common import fusion_bytes_argument
from .network import parse_topology

#: the rank counts of GradientFlow's scaling study
DEFAULT_RANKS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
#: the keys of the JSON file ``--json`` writes
JSON_KEYS = ("command", "model", "algorithm", "tau", "update_s", "profile", "network", "options", "rows")


def burst_argument(text: str, none: str = "no burst") -> int:
    """``--burst`` (and ``--socket-buffer``): 0 or a size (:func:`workbench.sizes.parse_size`: ``64K``)."""
    from ..sizes import parse_size
    if text.strip() == "0":
        return 0
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (or 0: {none})") from None


def socket_buffer_argument(text: str) -> int:
    return burst_argument(text, "a send returns once delivered")


def parse_ranks(text: str) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]``: a comma-separated list of integers >= 1."""
    try:
        ranks = [int(part) for part in text.split(",")]
    except ValueError:
        ranks = []
    if not ranks or min(ranks) < 1:
        raise argparse.ArgumentTypeError(f"must be a comma-separated list of integers >= 1 (rank counts); got {text!r}")
    return ranks


def add_to(sub) -> None:
    from ..comm.options import PRESETS, WIRE_DTYPES
    from ..netsim.predict import PREDICTABLE
    from ..schedules import SCHEDULES as COLLECTIVES
    p = sub.add_parser("predict", help="predict step time, communication share and scaling on N ranks",
                       description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=("alexnet",), default="alexnet",
                   help="built-in profile (default alexnet: torchvision's shapes, compute from FLOPs)")
    p.add_argument("--profile", metavar="FILE.csv", help="a measured per-layer profile instead of --model")
    p.add_argument("--batch", type=int, default=None, help="alexnet: images per rank (default 128)")
    p.add_argument("--gpu-flops", type=float, default=None, help="alexnet: one GPU's peak FLOP/s (default 125e12)")
    p.add_argument("--efficiency", type=float, default=None,
                   help="alexnet: share of --gpu-flops sustained (default 0.11: 3.3K images/s per GPU)")
    p.add_argument("--ranks", type=parse_ranks, default=None,
                   help="comma-separated rank counts (default 1,2,4,...,512; from 2 for easgd)")
    p.add_argument("--bandwidth", type=float, default=None, help="bytes/s per link (default 7e9 = 56 Gbit/s)")
    p.add_argument("--latency", type=float, default=None, help="seconds per all-reduce step (default 5e-6)")
    p.add_argument("--burst", type=burst_argument, default=None, metavar="SIZE",
                   help="bytes (payload, as --bandwidth) a link sends at once after an idle spell: a shaper's token "
                        "bucket (a virtual cluster's link up to 262 Mbit/s: 64 KiB on the wire, 61.2K of TCP "
                        "payload); default 0")
    p.add_argument("--socket-buffer", type=socket_buffer_argument, default=None, metavar="SIZE",
                   help="bytes a connection carries before its receiver asks for them (TCP's socket buffers: the "
                        "kernel's tcp_wmem + tcp_rmem maxima: 36M on this machine); easgd's master receives the "
                        "next worker's weights while it sends a reply; default 0")
    p.add_argument("--calibration", metavar="FILE",
                   help="take bandwidth and latency from a fit to this bench JSON (see `workbench calibrate`)")
    p.add_argument("--calibration-topology", type=parse_topology, default=None, metavar="KIND:SHAPE",
                   help="the network the calibration measurements ran on (default bus:<ranks>: one host; "
                        "fully_connected:4 for 4 nodes on a switch, each rank its own port)")
    p.add_argument("--simulate", action="store_true",
                   help="time each all-reduce with the topology simulator instead of the closed form (slow at 512)")
    p.add_argument("--topology", default="fully_connected:{n}",
                   help="with --simulate: the network, {n} for the rank count (default fully_connected:{n})")
    p.add_argument("--collective", choices=tuple(COLLECTIVES), default="ring", help="all-reduce schedule (default ring)")
    p.add_argument("--communication", "--preset", dest="communication", choices=tuple(PRESETS), default=None,
                   metavar="PRESET", help=f"start from a communication preset ({', '.join(PRESETS)}), as train's "
                                          f"--communication; the options below override it (--preset: the old name)")
    p.add_argument("--fusion-bytes", type=fusion_bytes_argument, default=argparse.SUPPRESS,  # absent: the preset's
                   help="bucket threshold: 0 (per tensor), a size (64M), inf or none (one message per step, the default)")
    p.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=None,
                   help="issue buckets while backward runs (default off)")
    p.add_argument("--wire-dtype", choices=tuple(WIRE_DTYPES), default=None, help="gradient dtype on the wire")
    p.add_argument("--sparse-ratio", type=float, default=None, help="CSC: share of chunks sent, in (0, 1]")
    p.add_argument("--sparse-chunk", type=int, default=None, help="CSC: chunk size in elements (default 64)")
    p.add_argument("--algorithm", choices=PREDICTABLE, default="sync-sgd", help="training algorithm (default sync-sgd)")
    p.add_argument("--tau", "--sync-every", type=int, default=1,
                   help="EASGD: steps between exchanges; local-sgd, diloco, streaming-diloco: sync_every (default 1)")
    p.add_argument("--fragments", type=int, default=1, help="streaming-diloco: parameter fragments (default 1)")
    p.add_argument("--sync-delay", type=int, default=0,
                   help="streaming-diloco: local steps a fragment's exchange overlaps (default 0)")
    p.add_argument("--outer-wire-dtype", choices=("fp32", "bf16", "fp16"), default="fp32",
                   help="diloco, streaming-diloco: dtype of the outer gradients on the wire (default fp32)")
    p.add_argument("--update-s", type=float, default=0.0, help="seconds of the optimizer update per step (default 0)")
    p.add_argument("--json", metavar="FILE", help="also write the prediction as JSON (keys in `workbench predict -h`)")
    p.set_defaults(func=run)


def _options(args) -> dict:
    from ..comm.options import resolve
    options = resolve(args.communication)
    given = {"overlap": args.overlap, "wire_dtype": args.wire_dtype, "sparse_ratio": args.sparse_ratio,
             "sparse_chunk": args.sparse_chunk}
    options.update({k: v for k, v in given.items() if v is not None})
    if hasattr(args, "fusion_bytes"):  # given: None (inf, none) overrides a preset's buckets too
        options["fusion_bytes"] = args.fusion_bytes
    if options.get("sparse_ratio") is None:  # the presets' CSC warm-up means nothing without CSC
        options.pop("warmup_epochs", None)
    return options


def _profile(args):
    from ..netsim import profile as profiles
    if args.profile:
        if any(v is not None for v in (args.batch, args.gpu_flops, args.efficiency)):
            raise ValueError("--batch, --gpu-flops and --efficiency describe --model alexnet; a --profile has "
                             "its own compute times")
        layers = profiles.profile_from_table(args.profile)
        return layers, {"source": args.profile}
    defaults = {"batch": profiles.DEFAULT_BATCH, "gpu_flops": profiles.DEFAULT_GPU_FLOPS,
                "efficiency": profiles.DEFAULT_EFFICIENCY}
    kwargs = {name: default if getattr(args, name) is None else getattr(args, name)
              for name, default in defaults.items()}
    return profiles.alexnet_profile(**kwargs), kwargs


def _network(args):
    from ..netsim import costs
    if args.calibration_topology is not None and not args.calibration:
        raise ValueError("--calibration-topology describes --calibration's measurements; give --calibration FILE")
    if args.calibration:
        if args.bandwidth is not None or args.latency is not None or args.simulate or args.burst is not None \
                or args.socket_buffer is not None:
            raise ValueError("--calibration replaces --bandwidth, --latency, --burst, --socket-buffer and --simulate; "
                             "give one or the other")
        from ..netsim.calibration import calibrate_file
        cal = calibrate_file(args.calibration, args.calibration_topology)
        print(f"calibrated on {args.calibration}: {cal}")
        return costs.from_calibration(cal, args.collective), "calibration"
    bandwidth = costs.GRADIENTFLOW_BANDWIDTH if args.bandwidth is None else args.bandwidth
    latency = costs.DEFAULT_LATENCY if args.latency is None else args.latency
    if args.simulate:
        for flag, value in (("--burst", args.burst), ("--socket-buffer", args.socket_buffer)):
            if value is not None:
                raise ValueError(f"{flag} is the closed form's (the simulator's links have none); leave out "
                                 f"--simulate or {flag}")
        return costs.Simulated(bandwidth, latency, args.collective, args.topology), "simulated"
    if args.collective not in costs.CLOSED_FORMS:  # the library's error names its class; here, the flag
        raise ValueError(f"--collective must be one of {', '.join(costs.CLOSED_FORMS)} for the closed form "
                         f"(add --simulate [--topology T] for the others); got {args.collective!r}")
    return costs.AlphaBeta(bandwidth, latency, args.collective, args.burst or 0, args.socket_buffer or 0), "closed form"


def run(args) -> int:
    from tabulate import tabulate

    from ..checks import writable_file
    from ..netsim.predict import scaling
    try:
        if args.json:  # written after the prediction: checked before it
            writable_file("--json", args.json)
        layers, described = _profile(args)
        network, kind = _network(args)
        ranks = args.ranks or [n for n in DEFAULT_RANKS if n > 1 or args.algorithm != "easgd"]
        options = _options(args)
        frame = scaling(layers, ranks, network, options, algorithm=args.algorithm, tau=args.tau,
                        update_s=args.update_s, fragments=args.fragments, sync_delay=args.sync_delay,
                        outer_wire_dtype=args.outer_wire_dtype)
    except (ValueError, OSError, KeyError) as exc:   # profile, network, option and prediction errors
        print(f"workbench predict: error: {exc}", file=sys.stderr)
        return 2
    from ..comm.options import Communication
    opts = Communication(**options)
    compute = sum(l.forward_s + l.backward_s for l in layers)
    params = sum(l.parameters for l in layers)
    print(f"{args.profile or args.model}: {len(layers)} layers, {params / 1e6:.1f}M parameters, "
          f"forward + backward {compute * 1e3:.2f} ms per step; {args.algorithm}"
          + (f", tau {args.tau}" if args.algorithm != "sync-sgd" else "") + f"; {opts.describe()}")
    print(f"network: {network.describe()}\n")
    rows = [[r.ranks, f"{r.step_s * 1e3:.2f}", f"{r.exposed_comm_s * 1e3:.2f}", f"{r.comm_share:.1%}",
             f"{r.wire_bytes / 1e6:.2f}", f"{r.messages:g}", f"{r.speedup:.1f}x", f"{r.efficiency:.1%}"]
            for r in frame.itertuples()]
    print(tabulate(rows, headers=["ranks", "step ms", "exposed comm ms", "comm share", "wire MB/step",
                                  "messages", "speedup", "efficiency"]))
    if args.json:
        report = {"command": "predict", "model": args.profile or args.model, "algorithm": args.algorithm,
                  "tau": args.tau, "update_s": args.update_s,
                  "profile": {"layers": len(layers), "parameters": params, "compute_s": compute, **described},
                  "network": {"model": kind, "collective": network.collective, "bandwidth_Bps": network.bandwidth,
                              "latency_s": network.latency, "burst_bytes": getattr(network, "burst", 0),
                              "socket_buffer_bytes": getattr(network, "socket_buffer", 0)},
                  "options": opts.to_dict(), "rows": frame.to_dict("records")}
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=1))
        print(f"\nwrote {args.json}")
    return 0
