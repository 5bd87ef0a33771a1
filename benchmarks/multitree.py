"""MultiTree reproduction: all-reduce time of ring, double binary tree, 2D ring, halving-doubling
and MultiTree on the paper's six networks (16 GB/s, 150 ns links, 32 KiB to 64 MiB), the tree
step counts against the published ones, the simulator's speed, the flow model beside the
lock-step one, and the calibration against this machine's measured all-reduces.

    .venv/bin/python benchmarks/multitree.py [--json FILE] [--quick]

Every number goes to JSON: benchmarks/results/multitree.json (multitree_quick.json with --quick).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from tabulate import tabulate

from workbench.bench.machine import Load, describe
from workbench.collectives import schedules, simulate, study, topology
from workbench.netsim.calibration import calibrate
from workbench.schedules.topology_aware import multitree_trees
from workbench.schedules.schedule import Schedule

RESULTS = Path(__file__).resolve().parent / "results"
MEASURED = RESULTS / "allreduce_4ranks.json"  # `make bench`


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", help="where every number goes as JSON (default benchmarks/results/multitree.json, "
                                       "multitree_quick.json with --quick)")
    parser.add_argument("--quick", action="store_true", help="skip the 1024-node build and the flow model")
    args = parser.parse_args()
    args.json = args.json or RESULTS / ("multitree_quick.json" if args.quick else "multitree.json")
    load = Load()
    out: dict = {"networks": {}}

    print("## Tree steps T (all-gather half; the all-reduce has 2T steps)\n")
    rows = []
    for side in (4, 8):
        for k in (2, 3, 5):
            _, steps = multitree_trees(topology.torus(side, side), k)
            bound = topology.lower_bound_steps(side * side, 4 * side * side)
            rows.append([f"torus {side}x{side}", k, steps, study.PAPER_TREE_STEPS[(side, k)], bound])
    for name in ("mesh 4x4", "mesh 8x8", "fat-tree 64", "BiGraph 32"):
        topo = study.PAPER_NETWORKS[name]()
        _, steps = multitree_trees(topo, 2)
        rows.append([name, 2, steps, "-", max(topology.lower_bound_steps(topo.nodes, len(topo.links)),
                                               topo.nodes - 1 if not topo.direct else 0)])
    print(tabulate(rows, headers=["network", "k", "T (ours)", "T (published)", "lower bound"]))
    out["tree_steps"] = rows

    print("\n## Speed-up over ring (lock-step model, paper parameters)\n")
    for name, build in study.PAPER_NETWORKS.items():
        topo = build()
        frame = study.compare(topo)
        out["networks"][name] = frame.to_dict(orient="records")
        table = study.speedups(frame).round(2)
        print(f"### {name}: {topo!r}")
        if name in study.PAPER_CLAIMS:
            print(f"paper: {study.PAPER_CLAIMS[name]}")
        print(tabulate(table, headers=["algorithm"] + list(table.columns), floatfmt=".2f"))
        big = frame[frame["bytes"] == max(frame["bytes"])].set_index("algorithm")["seconds"]
        if "ring_2d_bidir" in big:
            print(f"MultiTree over 2D ring at 64M: one-way {big['ring_2d'] / big['multitree']:.2f}x, "
                  f"bidirectional {big['ring_2d_bidir'] / big['multitree']:.2f}x")
        print()

    print("## Interface bandwidth per node (torus 8x8, 64 MiB; multiples of one 16 GB/s link)\n")
    table = study.interface_sweep(study.PAPER_NETWORKS["torus 8x8"]())
    print(tabulate(table, headers="keys", showindex=False, floatfmt=".2f"))
    rows = table.values.tolist()
    out["node_bandwidth"] = rows

    print("\n## Routes on switched networks: chosen by the construction vs static up-down (64 MiB)\n")
    rows = []
    for name in ("fat-tree 64", "BiGraph 32"):
        topo = study.PAPER_NETWORKS[name]()
        chosen = schedules.multitree(topo, 2)
        static = Schedule(chosen.name, chosen.nranks, chosen.nchunks, chosen.steps)
        for label, schedule in (("chosen", chosen), ("static", static)):
            result = simulate(schedule, topo, 64 << 20)
            rows.append([name, label, result.max_link_flows, f"{result.seconds * 1e3:.3f}"])
    print(tabulate(rows, headers=["network", "routes", "most flows on a link", "lock-step ms"]))
    out["routes"] = rows
    print()

    if not args.quick:
        print("## Flow model (ranks run ahead, links shared max-min fairly) vs lock-step, seconds\n")
        rows = []
        for name in ("torus 8x8", "fat-tree 64"):
            topo = study.PAPER_NETWORKS[name]()
            for algorithm in ("ring", "double_binary_tree", "multitree"):
                schedule = study.schedule_on(algorithm, topo)
                for size in (32 << 10, 64 << 20):
                    lock = simulate(schedule, topo, size).seconds
                    start = time.perf_counter()
                    flow = simulate(schedule, topo, size, mode="flow").seconds
                    rows.append([name, algorithm, study.size_label(size), f"{lock * 1e6:.1f}", f"{flow * 1e6:.1f}",
                                 f"{flow / lock:.2f}", f"{time.perf_counter() - start:.1f}"])
        print(tabulate(rows, headers=["network", "algorithm", "size", "lock-step us", "flow us", "flow/lock",
                                      "flow sim s"]))
        out["flow"] = rows

    print("\n## Simulator speed (goals: 256-node torus at 64 MiB < 2 s; trees for 1024 nodes < 30 s)\n")
    rows = []
    sides = (16,) if args.quick else (16, 32)
    for side in sides:
        topo = topology.torus(side, side)
        start = time.perf_counter()
        schedule = schedules.multitree(topo, 2)
        build = time.perf_counter() - start
        start = time.perf_counter()
        simulate(schedule, topo, 64 << 20)
        rows.append([f"torus {side}x{side}", side * side, schedule.params["tree_steps"], f"{build:.2f}",
                     f"{time.perf_counter() - start:.2f}"])
    print(tabulate(rows, headers=["network", "nodes", "T", "build trees s", "simulate 64 MiB s"]))
    out["speed"] = rows

    print(f"\n## Calibration to this machine ({MEASURED})\n")
    for topo in (topology.fully_connected(4), topology.bus(4)):
        cal = calibrate(MEASURED, topo)
        print(cal)
        rows = [[r.algorithm, study.size_label(r.bytes), f"{r.measured_s * 1e3:.3f}", f"{r.predicted_s * 1e3:.3f}",
                 f"{r.error:+.0%}"] for r in cal.table.itertuples()]
        print(tabulate(rows, headers=["algorithm", "size", "measured ms", "predicted ms", "error"]))
        print()
        out[f"calibration_{topo.kind}"] = {"link_latency": cal.link_latency, "link_bandwidth": cal.link_bandwidth,
                                           "within_25pct": cal.within(), "table": rows}
    out.update(machine=describe(), load_average=load.done())
    with open(args.json, "w") as fh:
        json.dump(out, fh, indent=1, default=str)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
