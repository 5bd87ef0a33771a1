"""The virtual cluster measured (issue 22): how fast it comes up, what its links deliver to MPI, how
the simulator's predictions compare, MultiTree on a 4x4 torus of real TCP, and what a partition does.

    python benchmarks/vcluster.py [--sections up,allreduce,torus,partition] [--quick]

- ``up``: ``VirtualCluster.up()`` / ``down()`` for 4 and 16 nodes, with and without Slurm.
- ``allreduce``: 4 nodes on a switch at 1 Gbit/s and 100 Mbit/s (and 100 Mbit/s with 1 MiB queues), 1-64 MiB, every schedule and MPICH's
  native ``MPI_Allreduce`` (``workbench.bench.allreduce`` on the nodes, one rank each); busbw as
  nccl-tests defines it against the link's bound ``2(n-1)/n * S / B``; beside it ``workbench simulate``
  on ``switch:4`` with the link rate times TCP's payload share (1448 of every 1514 bytes on the wire:
  MTU 1500, TCP timestamps) and the per-hop latency measured here (a TCP ping-pong between two nodes).
- ``torus``: 16 nodes as a 4x4 torus at 50/100/200 Mbit/s per link, 4-16 MiB: ring (along the torus's
  ring embedding), 2D ring, double binary tree and MultiTree over real TCP through forwarding nodes
  (``workbench.bench.schedules``), beside the simulator's lock-step prediction on ``torus:4x4``.
- ``partition``: how long until a run that loses a node (its links down) ends with the node named,
  through the ranks' heartbeats, and what MPI itself does without them (within ``--partition-wait`` s).

Writes benchmarks/results/vcluster.json (every number, the machine and its load) and prints tables.
Root only (namespaces, Slurm). The CPU is shared by every node: see the README's caveats.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

from tabulate import tabulate

from workbench.bench.machine import Load, describe, write_report
from workbench.netsim.costs import TCP_PAYLOAD_SHARE
from workbench.vcluster.probe import one_way_latency as ping_pong_latency

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parent.parent
PAYLOAD = TCP_PAYLOAD_SHARE  # TCP payload bytes per byte on the wire (MTU 1500, timestamps on)
MIB = 1 << 20


def _cluster(name, nodes, topology="switch", bandwidth="1gbit", slurm=False, shared=None, queue=None):
    from workbench.vcluster import VirtualCluster
    return VirtualCluster(name, nodes, topology, bandwidth, slurm=slurm, shared=shared, queue=queue)


def measure_up(repeats: int, scratch: Path) -> list[dict]:
    rows = []
    for nodes, slurm, times in ((4, False, repeats), (16, False, repeats), (4, True, max(1, repeats - 1)),
                                (16, True, 1)):
        for _ in range(times):
            vc = _cluster("bup", nodes, slurm=slurm, shared=scratch / "up")
            vc.up()
            t = time.monotonic()
            vc.down()
            rows.append({"nodes": nodes, "slurm": slurm, "up_s": vc.up_seconds, "down_s": time.monotonic() - t})
    table = {}
    for r in rows:
        table.setdefault((r["nodes"], r["slurm"]), []).append(r)
    print(tabulate([[n, "yes" if s else "no", len(v), f"{statistics.median(x['up_s'] for x in v):.2f}",
                     f"{statistics.median(x['down_s'] for x in v):.2f}"] for (n, s), v in table.items()],
                   headers=["nodes", "Slurm", "runs", "up s (median)", "down s (median)"]))
    return rows


def measure_allreduce(rates: list[tuple[str, str | None]], sizes: list[int], repetitions: int, scratch: Path) -> dict:
    from workbench.netsim.study import compare
    from workbench.network import switch
    from workbench.runtime.launch.launcher import run_mpi
    from workbench.sizes import format_size
    from workbench.vcluster.plan import parse_rate
    algorithms = ["ring", "recursive_doubling", "halving_doubling", "binary_tree", "double_binary_tree", "native"]
    out = {}
    for rate, queue in rates:
        key = rate + (f", queue {queue}" if queue else "")
        with _cluster("bar", 4, "switch", rate, shared=scratch / "allreduce", queue=queue) as vc:
            latency = ping_pong_latency(vc)
            report_path = vc.shared / f"allreduce-{rate}.json"
            run_mpi(4, ["-m", "workbench.bench.allreduce", "--sizes", ",".join(format_size(s) for s in sizes),
                        "--algorithms", ",".join(algorithms), "--no-gloo", "--repetitions", str(repetitions),
                        "--warmup", "1", "--json", str(report_path)],
                    timeout=3600, cwd=ROOT, **vc.run_options(4))
            report = json.loads(report_path.read_text())
            sent = vc.bytes_sent()
        bits = parse_rate(rate)
        # the simulator: a hop is one link; a message crosses two (uplink, downlink) on a switch
        sim = compare(switch(4), [a for a in algorithms if a != "native"], sizes, bits / 8 * PAYLOAD, latency / 2)
        predicted = {(r.algorithm, r.bytes): r.seconds for r in sim.itertuples()}
        rows = []
        for r in report["results"]:
            bound = 2 * 3 / 4 * r["bytes"] * 8 / bits
            row = {**r, "bound_s": bound, "of_bound": bound / r["median_s"],
                   "predicted_s": predicted.get((r["algorithm"], r["bytes"]))}
            row["predicted_over_measured"] = row["predicted_s"] / r["median_s"] if row["predicted_s"] else None
            rows.append(row)
        out[key] = {"one_way_latency_s": latency, "link_bytes_sent": sent, "queue": queue, "rows": rows}
        print(f"\n4 nodes on a switch at {key}: one-way latency {latency * 1e6:.0f} us (TCP ping-pong)")
        print(tabulate([[r["algorithm"], r["size"], f"{r['median_s'] * 1e3:.1f}", f"{r['busbw_GBps'] * 8e3:.1f}",
                         f"{r['of_bound']:.2f}", f"{r['predicted_s'] * 1e3:.1f}" if r["predicted_s"] else "-",
                         f"{r['predicted_over_measured']:.2f}" if r["predicted_over_measured"] else "-"]
                        for r in rows],
                       headers=["algorithm", "size", "median ms", "busbw Mbit/s", "of bound", "simulated ms",
                                "sim/meas"]))
    return out


def measure_torus(rates: list[str], sizes: list[int], repetitions: int, scratch: Path) -> dict:
    from workbench.netsim.study import compare
    from workbench.network import torus
    from workbench.runtime.launch.launcher import run_mpi
    from workbench.sizes import format_size
    from workbench.vcluster.plan import parse_rate
    algorithms = ["ring", "ring_2d", "double_binary_tree", "multitree"]
    out = {}
    for rate in rates:
        with _cluster("bto", 16, "torus:4x4", rate, shared=scratch / "torus") as vc:
            latency = ping_pong_latency(vc)
            path = vc.shared / f"torus-{rate}.json"
            run_mpi(16, ["-m", "workbench.bench.schedules", "--topology", "torus:4x4", "--algorithms",
                         ",".join(algorithms), "--sizes", ",".join(format_size(s) for s in sizes), "--repetitions",
                         str(repetitions), "--json", str(path)], timeout=3600, cwd=ROOT, **vc.run_options(16))
            report = json.loads(path.read_text())
        sim = compare(torus(4, 4), algorithms, sizes, parse_rate(rate) / 8 * PAYLOAD, latency)
        predicted = {(r.algorithm, r.bytes): r.seconds for r in sim.itertuples()}
        ring = {r["bytes"]: r["median_s"] for r in report["results"] if r["algorithm"] == "ring"}
        rows = []
        for r in report["results"]:
            p = predicted[(r["algorithm"], r["bytes"])]
            rows.append({**r, "predicted_s": p, "predicted_over_measured": p / r["median_s"],
                         "speedup_vs_ring": ring[r["bytes"]] / r["median_s"],
                         "predicted_speedup_vs_ring": predicted[("ring", r["bytes"])] / p})
        out[rate] = {"one_way_latency_s": latency, "rows": rows}
        print(f"\n16 nodes, 4x4 torus at {rate} per link (one-way latency {latency * 1e6:.0f} us)")
        print(tabulate([[r["algorithm"], r["size"], r["steps"], f"{r['median_s'] * 1e3:.0f}",
                         f"{r['predicted_s'] * 1e3:.0f}", f"{r['predicted_over_measured']:.2f}",
                         f"{r['speedup_vs_ring']:.2f}x", f"{r['predicted_speedup_vs_ring']:.2f}x"] for r in rows],
                       headers=["algorithm", "size", "steps", "measured ms", "simulated ms", "sim/meas",
                                "vs ring", "simulated vs ring"]))
    return out


FOREVER = ("import time\nimport numpy as np\nfrom mpi4py import MPI\na = np.ones(1 << 14)\nwhile True:\n"
           "    MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, a)\n    time.sleep(0.01)\n")


def measure_partition(repeats: int, wait: float, scratch: Path) -> dict:
    from workbench.runtime.launch.launcher import MPILaunchError, run_mpi
    out = {"heartbeat": [], "mpi_alone": None}
    with _cluster("bpa", 4, shared=scratch / "partition") as vc:
        program = vc.shared / "forever.py"
        program.write_text(FOREVER)

        def cut_later(node, when):
            def cut():
                time.sleep(3)
                when["cut"] = time.monotonic()
                vc.set_link(node, False)
            threading.Thread(target=cut, daemon=True).start()

        for _ in range(repeats):
            when = {}
            cut_later(2, when)
            try:
                run_mpi(4, [str(program)], timeout=120, cwd=ROOT, **vc.run_options(4))
            except MPILaunchError as exc:
                out["heartbeat"].append({"seconds": time.monotonic() - when["cut"], "error": str(exc).splitlines()[0]})
            vc.set_link(2, True)
        # without heartbeats: does MPI (libfabric TCP, hydra) notice by itself?
        when = {}
        cut_later(2, when)
        options = vc.run_options(4)
        options.pop("heartbeat")
        try:
            run_mpi(4, [str(program)], timeout=wait + 3, cwd=ROOT, **options)
            outcome = "ended by itself without error"
        except MPILaunchError as exc:
            outcome = str(exc).splitlines()[0][:300]
        out["mpi_alone"] = {"waited_s": time.monotonic() - when["cut"], "outcome": outcome}
        vc.set_link(2, True)
    print("\npartition of node 2 (its links down) during a 4-rank all-reduce loop:")
    print(tabulate([[f"{r['seconds']:.1f}", r["error"][:110]] for r in out["heartbeat"]],
                   headers=["s to the error", "error"]))
    print(f"without heartbeats, after {out['mpi_alone']['waited_s']:.0f} s: {out['mpi_alone']['outcome']}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sections", default="up,allreduce,torus,partition")
    parser.add_argument("--quick", action="store_true", help="fewer sizes and repetitions")
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--partition-wait", type=float, default=120.0)
    parser.add_argument("--json", type=Path, default=RESULTS / "vcluster.json")
    args = parser.parse_args()
    sections = args.sections.split(",")
    scratch = Path(tempfile.mkdtemp(prefix="wb-vcluster-bench-", dir="/var/tmp"))
    previous = json.loads(args.json.read_text()) if args.json.exists() else {}
    load = Load()
    report = {**previous, "machine": describe(), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    sizes = [1 * MIB, 8 * MIB, 64 * MIB] if args.quick else [s * MIB for s in (1, 2, 4, 8, 16, 32, 64)]
    if "up" in sections:
        report["up"] = measure_up(2 if args.quick else 3, scratch)
    if "allreduce" in sections:
        report["allreduce"] = measure_allreduce([("1gbit", None), ("100mbit", None), ("100mbit", "1M")], sizes,
                                                args.repetitions, scratch)
    if "torus" in sections:
        report["torus"] = measure_torus(["50mbit", "100mbit", "200mbit"] if not args.quick else ["100mbit"],
                                        [4 * MIB, 8 * MIB, 16 * MIB] if not args.quick else [4 * MIB],
                                        args.repetitions, scratch)
    if "partition" in sections:
        report["partition"] = measure_partition(1 if args.quick else 3, args.partition_wait, scratch)
    write_report(args.json, report, load)


if __name__ == "__main__":
    main()
