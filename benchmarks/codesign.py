"""Co-design: original EASGD vs Sync EASGD (the SC'17 paper's 87% -> 14% communication share, 5.3x),
with the ablations single buffer vs per-layer messages, tree vs sequential reduction and overlap on/off.
Prints a table and writes it as JSON.

    python benchmarks/codesign.py [--ranks 4] [--epochs 2] [--json FILE]          # one host, shared memory
    python benchmarks/codesign.py --nodes 4 --bandwidth 20mbit[,10mbit,50mbit]     # on a virtual cluster
    python benchmarks/codesign.py --vcluster NAME --nodes 4                         # on a running one, at its rate

**One host** (default, ``codesign_<ranks>ranks.json``): ``--ranks`` ranks through shared memory, wide_mlp
on digits, batch 32; "communication" is memory copies competing with compute for the same cores.

**Virtual cluster** (``--nodes N``, ``codesign_vcluster.json``): brings up a virtual cluster (named
``scd<pid>``, 4 digits) of N+1 nodes on one switch, every port shaped to the first ``--bandwidth``
rate, and takes it down at the end (``--vcluster NAME``: a running cluster of at least N+1 nodes
instead, at its own rate, left up). Placement (``workbench/bench/cluster_runs.py``), one rank per
node: Sync EASGD runs N ranks on nodes 0..N-1; the master-based original EASGD N+1 ranks
(``cfg.workers`` = ranks - 1 = N), the master on node 0 and the N workers on nodes 1..N, so that in
both every worker has a node and a link of its own, and the master a link of its own as a parameter
server has. Every variant runs at the first rate; the headline pair (the first and the last
variant) again at each further rate, on a cluster of its own: a sweep of the regime. Runs evaluate
once, at the end; the time per epoch and the communication shares are taken over the training
window, from the trace, without that evaluation (10,000 LeNet forward passes: 3-10 s on this
machine, a third of a Sync EASGD epoch). The table's "W/B over a step" is the regime each run met:
one copy of the model on a link (W/B, from the rate) over the median forward and backward (c).

Settings chosen for the virtual cluster (defaults of ``--nodes``), from what was measured here:
LeNet (61,706 parameters, W = 246,824 bytes per exchange; the paper's MNIST model) on Fashion-MNIST
(``/usr/share/datasets/fashion-mnist``), batch 128 (117 steps per worker per epoch): large enough that
a step is compute, not Python overhead, and an epoch still a few minutes. A step's forward and
backward (c) took 29 ms on one idle core, 98-128 ms on the nodes at load average 8-9 and 0.21-0.33 s at
19-27 (4-5 ranks and other sessions' jobs on 2 cores). The regime is x = (W/B) / c, one copy of the
model on a link in compute steps; the paper's is "an exchange costs several steps" at the master.
At load ~20, 5, 10 and 20 Mbit/s give W/B = 395, 197 and 99 ms, x = 1.8, 0.8 and 0.3: the master's
link saturated (4 W/B a round against c + 2 W/B), at the edge, and the workers' compute in charge
(``python benchmarks/codesign.py --nodes 4 --bandwidth 5mbit,10mbit,20mbit``). On an idler machine
the same x needs 4-10 times the rate; the table's "W/B over a step" says which regime a run met.

What the two algorithms can reach at all on a full-duplex switch, with x = (W/B) / c (c a compute
step): a round-robin worker waits for the other N-1 exchanges, share 1 - 1/(N x) when N x > 1 + 2x;
Sync EASGD hides its all-reduce behind the gradient, share 1 - 1/(1.5 x) when 1.5 x > 1, else 0.
At N = 4 the original's share >= 80% needs x >= 1.25, where Sync EASGD's is >= 47%; Sync EASGD's
<= 20% needs x <= 0.83, where the original's is <= 70%; and the speed-up, 4 x / max(1, 1.5 x), is
at most 4 / 1.5 = 2.67x. The paper's 5.3x would need more than the master's link (an inference):
a master serving half-duplex (8 W/B a round), and the device copies and per-layer latencies of its
KNL platform.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from tabulate import tabulate

from workbench.bench.cluster_runs import (ClusterArgumentError, add_cluster_arguments, check_cluster_args,
                                         cluster_record, training_ranks, training_window, virtual_cluster)
from workbench.bench.machine import Load, describe
from workbench.config import RunConfig
from workbench.runtime.launch.batch import train

RESULTS = Path(__file__).resolve().parent / "results"

VARIANTS = [  # (label, RunConfig changes); the first and the last are the headline pair
    ("original EASGD (round-robin master), per-layer messages", dict(algorithm="easgd", fusion_bytes=0)),
    ("original EASGD (round-robin master), single buffer", dict(algorithm="easgd")),
    ("Sync EASGD, sequential reduction (linear), per-layer", dict(algorithm="sync-easgd", collective="linear", fusion_bytes=0)),
    ("Sync EASGD, sequential reduction (linear), single buffer", dict(algorithm="sync-easgd", collective="linear")),
    ("Sync EASGD, tree (binary_tree), single buffer", dict(algorithm="sync-easgd", collective="binary_tree")),
    ("Sync EASGD, ring, single buffer", dict(algorithm="sync-easgd", collective="ring")),
    ("Sync EASGD, ring, single buffer, no overlap", dict(algorithm="sync-easgd", collective="ring", overlap=False)),
    ("Sync EASGD, native MPI_Allreduce, single buffer", dict(algorithm="sync-easgd", collective="native")),
]
HEADLINE = [VARIANTS[0], VARIANTS[-1]]
#: evaluate only at the end on the virtual cluster (the last step is always an evaluation point)
EVAL_ONLY_AT_END = 10**9


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The arguments, checked (:func:`~workbench.bench.cluster_runs.check_cluster_args`), with the
    defaults of the mode filled in. Raises :class:`~workbench.bench.cluster_runs.ClusterArgumentError`."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=4, help="one host: MPI ranks")
    add_cluster_arguments(parser, several_rates=True)  # all variants at the first rate, the headline pair at the others
    parser.add_argument("--epochs", type=int, help="epochs (default 2 on one host, 1 on a virtual cluster)")
    parser.add_argument("--model", help="default wide_mlp on one host, lenet on a virtual cluster")
    parser.add_argument("--dataset", help="default digits on one host, fashion-mnist on a virtual cluster")
    parser.add_argument("--batch", type=int, help="samples per worker step (default 32 on one host, 128 on a "
                                                  "virtual cluster)")
    parser.add_argument("--json", help="where the JSON goes (default benchmarks/results/codesign_<ranks>ranks.json, "
                                       "or codesign_vcluster.json)")
    args = parser.parse_args(argv)
    check_cluster_args(args, several_rates=True)
    on_cluster = args.nodes is not None
    args.epochs = args.epochs or (1 if on_cluster else 2)
    args.model = args.model or ("lenet" if on_cluster else "wide_mlp")
    args.dataset = args.dataset or ("fashion-mnist" if on_cluster else "digits")
    args.batch = args.batch or (128 if on_cluster else 32)
    args.json = args.json or RESULTS / ("codesign_vcluster.json" if on_cluster else f"codesign_{args.ranks}ranks.json")
    return args


def measure(label: str, changes: dict, args, run_dir: Path, vc=None) -> dict:
    """Run one variant (on ``vc`` when given, placed as in the module docstring) and return its record."""
    ranks = training_ranks(changes["algorithm"], args.nodes) if vc is not None else args.ranks
    extra = {"eval_every": EVAL_ONLY_AT_END} if vc is not None else {}
    cfg = RunConfig(ranks=ranks, model=args.model, dataset=args.dataset, epochs=args.epochs,
                    batch_size=args.batch, **extra, **changes)
    link_before = vc.bytes_sent() if vc is not None else 0
    s = train(cfg, run_dir, vcluster=vc, ppn=1) if vc is not None else train(cfg, run_dir)
    window = training_window(json.loads((run_dir / "trace.json").read_text())["traceEvents"])
    shares = list(window["comm_fraction"].values())
    record = {"variant": label, "config": changes, "ranks": ranks,
              "seconds_per_epoch": window["seconds"] / args.epochs, "training_seconds": window["seconds"],
              "comm_fraction_workers": statistics.mean(shares) if shares else s["comm_fraction_workers"],
              "comm_fraction_by_rank": window["comm_fraction"],
              "compute_step_seconds": window["compute_step_seconds"],
              "summary_wall_seconds": s["wall_seconds"], "summary_comm_fraction": s["comm_fraction"],
              "summary_comm_fraction_workers": s["comm_fraction_workers"],
              "final_test_accuracy": s["final_test_accuracy"], "bytes_sent": s["bytes_sent"],
              "wire_bytes": s["wire_bytes"], "parameters": s["parameters"]}
    if vc is not None:
        record.update(bandwidth_bits=vc.plan.bandwidth, link_bytes=vc.bytes_sent() - link_before,
                      exchange_seconds=4 * s["parameters"] * 8 / vc.plan.bandwidth)  # W/B: one model on a link
    print(f"done: {label} ({record['seconds_per_epoch']:.2f} s/epoch, "
          f"{100 * record['comm_fraction_workers']:.0f}% communication)", flush=True)
    return record


def table(records: list[dict], title: str) -> str:
    base = records[0]["seconds_per_epoch"]
    rows = [[r["variant"], f"{r['seconds_per_epoch']:.2f}", f"{base / r['seconds_per_epoch']:.2f}x",
             f"{100 * r['comm_fraction_workers']:.0f}%", _steps_per_exchange(r), f"{r['final_test_accuracy']:.3f}",
             f"{r['bytes_sent'] / 1e6:.0f}"] for r in records]
    return f"\n{title}\n" + tabulate(rows, headers=["variant", "s/epoch", "speed-up vs first", "comm share (workers)",
                                                     "W/B over a step", "test acc", "MB sent"])


def _steps_per_exchange(record: dict) -> str:
    """x = (W/B) / c: one copy of the model on a link, in compute steps (the regime; "-" on one host)."""
    if record.get("exchange_seconds") is None or not record["compute_step_seconds"]:
        return "-"
    return f"{record['exchange_seconds'] / record['compute_step_seconds']:.2f}"


def run_on_cluster(args) -> dict:
    """Every variant at the first rate, the headline pair at each further rate, each rate on a
    cluster of its own (a link's rate is set when the cluster comes up)."""
    records, clusters = [], []
    for i, rate in enumerate(args.rates):
        with virtual_cluster(args.nodes, rate, args.vcluster, prefix="scd") as vc, \
                tempfile.TemporaryDirectory(dir=vc.shared) as tmp:
            clusters.append(cluster_record(vc))
            rows = [measure(label, changes, args, Path(tmp) / str(j), vc)
                    for j, (label, changes) in enumerate(VARIANTS if i == 0 else HEADLINE)]
        records += rows
        print(table(rows, f"co-design on {args.nodes} nodes at {clusters[-1]['bandwidth']} per port, {args.model}, "
                          f"{args.dataset}, batch {args.batch}, {args.epochs} epoch(s)"))
    return {"mode": "vcluster", "nodes": args.nodes, "clusters": clusters,
            "placement": "one rank per node; Sync EASGD on nodes 0..N-1; original EASGD's master on node 0 "
                         "and its N workers on nodes 1..N", "variants": records}


def run_on_host(args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        records = [measure(label, changes, args, Path(tmp) / str(i)) for i, (label, changes) in enumerate(VARIANTS)]
    print(table(records, f"co-design, {args.model} ({args.ranks} ranks, {args.epochs} epochs, batch {args.batch}, "
                         f"{args.dataset})"))
    return {"mode": "host", "ranks": args.ranks, "variants": records}


def main(argv: list[str] | None = None) -> None:
    load = Load()
    try:
        args = parse_args(argv)
        result = run_on_cluster(args) if args.nodes is not None else run_on_host(args)
    except ClusterArgumentError as exc:
        raise SystemExit(f"codesign.py: {exc}") from None
    result.update({"model": args.model, "dataset": args.dataset, "epochs": args.epochs, "batch_size": args.batch,
                   "machine": describe(), "load_average": load.done()})
    Path(args.json).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
