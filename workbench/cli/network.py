"""``workbench simulate`` and ``workbench calibrate``: all-reduce schedules on a simulated network."""
from __future__ import annotations

import argparse
import sys

from .common import parse_sizes, positive_int


def add_to(sub) -> None:
    sim = sub.add_parser("simulate", help="time all-reduce schedules on a simulated network")
    sim.add_argument("--topology", required=True, type=parse_topology, metavar="KIND:SHAPE",
                     help="e.g. torus:8x8, mesh:4x4, ring:16, fully_connected:8, bus:4, fat_tree:64x8, bigraph:32x4")
    sim.add_argument("--algorithms", type=_parse_sim_algorithms, default=None,
                     help="comma-separated (default: the MultiTree paper's set): " + ", ".join(_sim_names()))
    sim.add_argument("--sizes", type=parse_sizes, default=None,
                     help="comma-separated message sizes, K/M/G suffixes (default 32K,128K,512K,2M,8M,64M)")
    sim.add_argument("--bandwidth", type=float, default=None, help="bytes/s per link (default 16e9, the paper's)")
    sim.add_argument("--latency", type=float, default=None, help="seconds per hop (default 150e-9, the paper's)")
    sim.add_argument("--node-bandwidth", type=float, default=None,
                     help="bytes/s one rank's interface sends (and receives) over all its links together "
                          "(default: unlimited, every link at full speed)")
    sim.add_argument("--calibration", metavar="FILE",
                     help="take bandwidth and latency from a fit to this bench JSON (see `workbench calibrate`)")
    sim.add_argument("--calibration-topology", type=parse_topology, default=None, metavar="KIND:SHAPE",
                     help="the network the calibration measurements ran on (default bus:<ranks>)")
    sim.add_argument("--mode", choices=("lockstep", "flow"), default="lockstep",
                     help="lockstep (the paper's model, default) or flow (ranks run ahead, max-min fair links)")
    sim.add_argument("--k", type=positive_int, default=2, help="MultiTree's k-ary growth (>= 2, default 2)")
    sim.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    sim.set_defaults(func=simulate)

    cal = sub.add_parser("calibrate", help="fit the simulator's link latency and bandwidth to measured all-reduces")
    cal.add_argument("--json", default="benchmarks/results/allreduce_4ranks.json", metavar="FILE",
                     help="a `workbench bench allreduce --json` file (default benchmarks/results/allreduce_4ranks.json)")
    cal.add_argument("--topology", type=parse_topology, default=None, metavar="KIND:SHAPE",
                     help="the network the ranks ran on, as a model (default bus:<ranks>: one host)")
    cal.set_defaults(func=calibrate)


def parse_topology(text: str):
    from ..network import TopologyError, parse
    try:
        return parse(text)
    except TopologyError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _sim_names() -> tuple[str, ...]:
    from ..netsim.names import SIM_ALGORITHMS
    return SIM_ALGORITHMS


def _parse_sim_algorithms(text: str) -> list[str]:
    chosen = [a.strip() for a in text.split(",") if a.strip()]
    bad = [a for a in chosen if a not in _sim_names()]
    if bad or not chosen:
        raise argparse.ArgumentTypeError(f"unknown {', '.join(map(repr, bad)) or 'empty list'}; "
                                         f"choose from: {', '.join(_sim_names())}")
    return chosen


def simulate(args) -> int:
    from tabulate import tabulate

    from ..checks import writable_file
    from ..netsim import study
    from ..netsim.calibration import calibrate_file
    from ..netsim.simulator import PAPER_BANDWIDTH, PAPER_LATENCY
    bandwidth, latency = args.bandwidth or PAPER_BANDWIDTH, args.latency if args.latency is not None else PAPER_LATENCY
    try:
        if args.json:  # written after the simulation: checked before it
            writable_file("--json", args.json)
        if args.calibration:
            if args.bandwidth or args.latency is not None:
                raise ValueError("--calibration replaces --bandwidth and --latency; give one or the other")
            cal = calibrate_file(args.calibration, args.calibration_topology)
            bandwidth, latency = cal.link_bandwidth, cal.link_latency
            print(f"calibrated on {args.calibration}: {cal}")
        frame = study.compare(args.topology, args.algorithms or study.PAPER_ALGORITHMS,
                              args.sizes or study.PAPER_SIZES, bandwidth, latency, mode=args.mode, k=args.k,
                              node_bandwidth=args.node_bandwidth)
    except (ValueError, OSError) as exc:  # the network, simulation and calibration errors are ValueErrors
        print(f"workbench simulate: error: {exc}", file=sys.stderr)
        return 2
    node = f", {args.node_bandwidth / 1e9:.3g} GB/s per node" if args.node_bandwidth else ""
    print(f"{args.topology!r}; links {bandwidth / 1e9:.3g} GB/s, {latency * 1e9:.4g} ns per hop{node}; "
          f"{args.mode} model\n")
    rows = [[r.algorithm, study.size_label(r.bytes), r.steps, f"{r.seconds * 1e6:.2f}", f"{r.busbw_GBps:.2f}",
             f"{r.speedup_vs_ring:.2f}x" if "speedup_vs_ring" in frame else "-"] for r in frame.itertuples()]
    print(tabulate(rows, headers=["algorithm", "size", "steps", "time us", "busbw GB/s", "vs ring"]))
    if args.json:
        from pathlib import Path
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)  # as predict and bench do
        frame.to_json(args.json, orient="records", indent=1)
        print(f"\nwrote {args.json}")
    return 0


def calibrate(args) -> int:
    from tabulate import tabulate

    from ..netsim.calibration import calibrate_file
    try:
        cal = calibrate_file(args.json, args.topology)
    except (ValueError, OSError) as exc:  # the network, simulation and calibration errors are ValueErrors
        print(f"workbench calibrate: error: {exc}", file=sys.stderr)
        return 2
    print(f"{cal}\n")
    rows = [[r.algorithm, r.bytes, f"{r.measured_s * 1e3:.3f}", f"{r.predicted_s * 1e3:.3f}", f"{r.error:+.0%}"]
            for r in cal.table.itertuples()]
    print(tabulate(rows, headers=["algorithm", "bytes", "measured ms", "predicted ms", "error"]))
    return 0
