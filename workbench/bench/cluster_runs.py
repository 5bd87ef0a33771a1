"""Training benchmarks on a virtual cluster: the arguments, the placement, the cluster's lifetime and
the training window (``benchmarks/codesign.py``, ``benchmarks/ordering.py``).

Placement, one rank per node, so that every worker has a node and a link of its own: a synchronous
algorithm runs N ranks on nodes 0..N-1; a master-based one runs N+1 ranks (``RunConfig.workers`` is
ranks - 1 = N), the master on node 0 and the N workers on nodes 1..N, with a link of its own as a
parameter server has (on N nodes the master would share node 0 with one worker, whose exchanges
would cross shared memory instead of a link). The cluster therefore has N+1 nodes on one switch.

No MPI or torch here: the virtual cluster and the telemetry arithmetic are pure.
"""
from __future__ import annotations

import argparse
import os
import statistics
from contextlib import contextmanager
from typing import Iterator

from ..vcluster.plan import MAX_NODES

#: training nodes at most: a cluster's nodes at most, one of them the master's
MAX_TRAINING_NODES = MAX_NODES - 1


class ClusterArgumentError(ValueError):
    """A cluster setting a benchmark cannot use; the one-line message names the option."""


def add_cluster_arguments(parser: argparse.ArgumentParser, several_rates: bool) -> None:
    """``--nodes N``, ``--bandwidth RATE`` (``RATE[,RATE...]`` when ``several_rates``) and
    ``--vcluster NAME`` on ``parser``; check them with :func:`check_cluster_args`."""
    parser.add_argument("--nodes", type=int, help="virtual cluster: training nodes, one worker each (the master "
                                                  "of a master-based algorithm gets one more)")
    parser.add_argument("--bandwidth", help="virtual cluster: every port's rate in tc's units (100mbit)"
                                            + (", or several, comma-separated" if several_rates else ""))
    parser.add_argument("--vcluster", help="a running virtual cluster of at least --nodes + 1 nodes on a switch, "
                                           "at its own rate (instead of --bandwidth)")


def check_cluster_args(args: argparse.Namespace, several_rates: bool = False) -> None:
    """Check ``args.nodes`` (2..:data:`MAX_TRAINING_NODES`), ``args.bandwidth`` (tc rates) and ``args.vcluster`` (a name, not
    with ``--bandwidth``; both only with ``--nodes``) and set ``args.rates``: bits/s in order, ``[]``
    without ``--nodes``, ``[None]`` with ``--vcluster`` (the running cluster's own rate). Raises
    :class:`ClusterArgumentError`, one line naming the option."""
    from ..vcluster.plan import PlanError, check_name, parse_rate
    args.rates = []
    if args.nodes is None:
        for name in ("bandwidth", "vcluster"):
            if getattr(args, name) is not None:
                raise ClusterArgumentError(f"--{name}: needs --nodes N (the training nodes on the virtual cluster)")
        return
    if isinstance(args.nodes, bool) or not 2 <= args.nodes <= MAX_TRAINING_NODES:
        raise ClusterArgumentError(f"--nodes: must be 2..{MAX_TRAINING_NODES} training nodes (one more for a "
                                   f"master); got {args.nodes}")
    if args.vcluster is not None:
        if args.bandwidth is not None:
            raise ClusterArgumentError("--bandwidth: not with --vcluster (a running cluster's links keep the rate "
                                       "they were made with)")
        try:
            check_name(args.vcluster)
        except PlanError as exc:
            raise ClusterArgumentError(f"--vcluster: {str(exc).split(': ', 1)[1]}") from None
        args.rates = [None]
        return
    if not args.bandwidth:
        raise ClusterArgumentError("--bandwidth: needs a link rate with --nodes, like 20mbit")
    rates = args.bandwidth.split(",")
    if len(rates) > 1 and not several_rates:
        raise ClusterArgumentError(f"--bandwidth: one rate here; got {len(rates)} ({args.bandwidth})")
    try:
        args.rates = [parse_rate(rate) for rate in rates]
    except PlanError as exc:
        raise ClusterArgumentError(f"--{exc}") from None


def training_ranks(algorithm: str, nodes: int) -> int:
    """Ranks of ``algorithm`` on ``nodes`` training nodes: one more for a master-based one's master."""
    from ..optim.registry import definition_of
    return nodes + definition_of(algorithm).master_based


@contextmanager
def virtual_cluster(nodes: int, rate: int | None, attach: str | None = None,
                    prefix: str = "bench") -> Iterator:
    """A cluster for ``nodes`` training nodes and a master (``nodes`` + 1 nodes on a switch): the running
    cluster ``attach`` (left up; refused when it has too few nodes), or one at ``rate`` bits/s per port
    named ``prefix`` and 4 digits of this process's id, brought up here and always taken down."""
    from ..vcluster import VirtualCluster
    if attach is not None:
        vc = VirtualCluster.attach(attach)
        if vc.nodes < nodes + 1:
            raise ClusterArgumentError(f"--vcluster: {attach} has {vc.nodes} nodes; {nodes} training nodes and a "
                                       f"master need {nodes + 1}")
        yield vc
        return
    vc = VirtualCluster(f"{prefix}{os.getpid() % 10000}", nodes=nodes + 1, bandwidth=rate)
    vc.up()
    try:
        yield vc
    finally:
        vc.down()


def cluster_record(vc) -> dict:
    """What a benchmark's JSON says about the cluster it ran on."""
    from ..vcluster.plan import format_rate
    return {"name": vc.name, "nodes": vc.nodes, "topology": vc.plan.topology,
            "bandwidth": format_rate(vc.plan.bandwidth), "bandwidth_bits": vc.plan.bandwidth,
            "queue_bytes": vc.plan.queue}


def training_window(events: list[dict]) -> dict:
    """Seconds of training and each training rank's communication share, without evaluations.

    ``events``: the run's trace events (``trace.json``). The window of a rank runs from the
    common start to the end of its last span that is not an ``evaluate``; its share is
    :func:`workbench.telemetry.comm_fraction` over that window with the evaluations left out. Returns
    ``{"seconds": the longest window, "comm_fraction": {rank: share}, "compute_step_seconds": the
    median forward_backward span}`` (ranks without a forward_backward span, a master, have no share).
    """
    from ..telemetry import comm_fraction
    spans = [e for e in events if e.get("ph") == "X" and e.get("name") != "evaluate"]
    by_rank: dict[int, list[dict]] = {}
    for e in spans:
        by_rank.setdefault(e["pid"], []).append(e)
    ends = {rank: max(e["ts"] + e["dur"] for e in evs) / 1e6 for rank, evs in by_rank.items()}
    steps = [e["dur"] / 1e6 for e in spans if e["name"] == "forward_backward"]
    trains = sorted(rank for rank, evs in by_rank.items() if any(e["name"] == "forward_backward" for e in evs))
    return {"seconds": max(ends.values(), default=0.0),
            "comm_fraction": {rank: comm_fraction(by_rank[rank], ends[rank]) for rank in trains},
            "compute_step_seconds": statistics.median(steps) if steps else None}
