"""``predict_check.py --vcluster RATE``: the scale-out predictor against real multi-node runs. Its
step time for ``sync-sgd`` on the virtual cluster (one rank per node, a switch, every port shaped to
RATE) against the measured one, for wide_mlp, lenet and resnet18 on Fashion-MNIST at 2 and 4 nodes
(goal: within +-15%).

Per node count: a virtual cluster (``VirtualCluster(NAME, nodes, "switch", RATE)``, always taken
down) and the kernel's one-way latency on it (:func:`workbench.vcluster.probe.one_way_latency`:
half a TCP ping-pong's round trip between two nodes). The network model is
:func:`workbench.netsim.costs.tcp_link`: each rank its own link of RATE x TCP's payload share
(1448 of every 1514 bytes), a latency per ring step and the shaper's burst
(:func:`workbench.vcluster.wiring.burst_bytes`: 64 KiB at 200 Mbit/s, sent at once after the link
was idle for 2.6 ms, which a step's compute is: a quarter of lenet's 247 KB a step; the
``no_burst`` variant leaves it out). Then, per repeat and model, measured one right after the
other (the machine is shared: the background load moves between them):

1. **latency under load**: a 4 KiB ring all-reduce on the cluster's ranks (30 repetitions, mean) over
   its 2(N-1) steps: the per-step latency MPI ranks meet now (the ping-pong's 20-35 us is the
   kernel's; ranks on cores shared with other busy processes wait for the scheduler at every step,
   5-10 ms at load 20). The network model: ``tcp_link(RATE, that latency, burst_bytes=...)``.
2. **profile** (:func:`workbench.bench.step.profile_step`, ``processes=nodes, lockstep=True``): the
   layers' forward and backward, the update, measured by as many processes as the cluster has ranks,
   all at once on this machine's cores, each in a session of its own as each rank is, meeting at a
   spinning barrier before every step as the ranks meet at the all-reduce, and before it yielding
   the CPU for the step's predicted communication time (``pause_s``), as a rank waits for its
   all-reduce (``--no-pause``: back to back); ``skew_s`` is the slowest one's extra time per step.
   The nodes of the virtual cluster are namespaces: their ranks share the same cores, so this is
   their compute.
3. **measurement**: ``sync-sgd`` through :func:`workbench.runtime.launch.batch.train` with
   ``vcluster=vc, ppn=1``, ``collective="ring"``, telemetry on; the step time is the run's steady
   state from its trace (:func:`workbench.telemetry.steady_step_seconds`: from the start of step
   ``SKIP`` to the start of the last, so neither the first connections nor the final evaluation
   are in it).
4. 1 and 2 again, right after the run: the other jobs on the machine come and go within minutes.
5. **prediction** (:func:`workbench.netsim.predict.predict`, ring all-reduce) from the mean of the
   two profiles (:meth:`~workbench.bench.step.StepProfile.mean_with`) and of the two latencies,
   with the skew (``lockstep``: the goal's variant); the same from the inputs before the run alone
   (``before_only``), with the kernel's latency (``ping_latency``), without the skew (``no_skew``).
   A ratio is prediction / measurement per pair, then the median over pairs.

**The EASGD family** (``--algorithms``, default ``sync-sgd``): each of :data:`ALGORITHMS` runs with the
settings there, and the prediction is :func:`~workbench.netsim.predict.predict`'s for that algorithm
(:mod:`workbench.netsim.exchanges`: the shaper's burst spent on each exchange, and for ``easgd`` the
sockets' buffers, ``net.ipv4.tcp_wmem``'s and ``tcp_rmem``'s maxima, which let the next worker's weights
come in while the master sends a reply). ``easgd`` runs N workers and a master on a node of its own (the cluster has
N + 1 nodes; the others use nodes 0..N-1); its master applies an arrival in about an SGD update's time,
so ``apply_s`` is the profile's update; it has no skew term (its workers do not wait for each other).
The profile's pause is the algorithm's predicted communication a step; a run's step count is rounded
up so that the measured window holds whole periods of ``tau`` (``sync_every``) steps.

Data: the first ``steps x nodes x batch`` training rows of Fashion-MNIST (and ``TEST_ROWS`` test
rows), written as an ``.npz`` in the cluster's shared folder, so each run is one epoch of exactly
``steps`` steps per rank (resnet18 takes ~65 ms per sample forward and backward on one core here).

    python benchmarks/predict_check.py --vcluster 200mbit [--nodes 2,4] [--models wide_mlp,lenet,resnet18]
        [--repeats 2] [--configs dense] [--algorithms sync-sgd,sync-easgd,easgd,...] [--quick] [--json FILE]

Writes benchmarks/results/predict_check_vcluster.json (every profile, prediction and run, the
machine and its load) and prints the ratio table. Root only (namespaces).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from predict_check import CONFIGS, trace_breakdown

RESULTS = Path(__file__).resolve().parent / "results"
#: model -> (batch per rank, steps per run, profile repetitions): each run a few seconds to a few
#: minutes on the shared 2 cores
PLANS = {"wide_mlp": (32, 50, 40), "lenet": (32, 100, 40), "resnet18": (8, 14, 5), "mlp": (32, 20, 10)}
#: steps left out at the start of each run (connections, first allocations)
SKIP = 3
TOLERANCE = 0.15
TEST_ROWS = 50
#: prediction variants: (network latency, skew term); the first is the goal's
VARIANTS = {"lockstep": ("bracket", "mpi", True), "before_only": ("before", "mpi_before", True),
            "ping_latency": ("bracket", "ping", True), "no_skew": ("bracket", "mpi", False),
            "no_burst": ("bracket", "mpi_no_burst", True), "no_socket_buffer": ("bracket", "mpi_no_buffer", True)}
VARIANT_LABELS = {"lockstep": "lock-step profile + skew, MPI latency under load, both the mean of before and after the run",
                  "before_only": "the same from the profile and latency before the run only",
                  "ping_latency": "the kernel's latency (TCP ping-pong) instead of MPI's",
                  "no_skew": "no skew term",
                  "no_burst": "the links without their shaper's burst (every byte at the rate)",
                  "no_socket_buffer": "a transfer that waits for its receiver (easgd's master: no weights come in "
                                      "while it replies)"}
#: the algorithms ``--algorithms`` takes and their run settings (RunConfig fields; sync-sgd's come from
#: ``--configs``; ``algorithm`` where the name is a variant's): each the default exchange of its
#: family, H = 10 for the descendants
ALGORITHMS = {"sync-sgd": {},
              "sync-easgd": {"tau": 1, "fusion_bytes": None, "overlap": True},
              "sync-easgd-no-overlap": {"algorithm": "sync-easgd", "tau": 1, "fusion_bytes": None, "overlap": False},
              "sync-easgd-native": {"algorithm": "sync-easgd", "tau": 1, "fusion_bytes": None, "overlap": True,
                                    "collective": "native"},
              "easgd": {"tau": 1},
              "local-sgd": {"sync_every": 10, "fusion_bytes": None},
              "diloco": {"sync_every": 10, "fusion_bytes": None},
              "streaming-diloco": {"sync_every": 10, "fragments": 2, "sync_delay": 2, "outer_wire_dtype": "bf16",
                                   "fusion_bytes": None}}
#: the message of the latency probe: small enough that its bandwidth term is a few percent
PROBE_BYTES = 4096


def parse(argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vcluster", required=True, metavar="RATE", help="every link's rate (tc units: 200mbit)")
    parser.add_argument("--nodes", default="2,4", help="comma-separated node counts (one rank per node)")
    parser.add_argument("--queue", default=None, metavar="SIZE",
                        help="bytes each link may queue (128K, 2M; default: the virtual cluster's, 5 ms at the rate, "
                             "at least 128 KiB); deeper ports keep an incast (easgd's workers at the master) from "
                             "dropping")
    parser.add_argument("--models", default="wide_mlp,lenet,resnet18")
    parser.add_argument("--configs", default="dense", help=f"of {', '.join(c[0] for c in CONFIGS)}")
    parser.add_argument("--algorithms", default="sync-sgd", help=f"of {', '.join(ALGORITHMS)} (sync-sgd in each "
                                                                  f"--configs)")
    parser.add_argument("--repeats", type=int, default=2, help="pairs (inputs, run, inputs) per model and node count")
    parser.add_argument("--no-pause", dest="pause", action="store_false",
                        help="profile back to back, without yielding for the predicted communication between steps")
    parser.add_argument("--name", default=f"p{os.getpid() % 10000}", help="the clusters' name prefix")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds one run may take")
    parser.add_argument("--quick", action="store_true", help="1 repeat, a third of the steps and profile repetitions")
    parser.add_argument("--json", type=Path, default=RESULTS / "predict_check_vcluster.json")
    args = parser.parse_args(argv)
    args.nodes = [int(n) for n in args.nodes.split(",")]
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in args.models if m not in PLANS]
    if unknown:
        parser.error(f"--models: {unknown[0]!r} has no plan; one of {', '.join(PLANS)}")
    configs = {c[0]: c for c in CONFIGS}
    args.configs = [configs[c] for c in args.configs.split(",") if c in configs] or parser.error(
        f"--configs: one or more of {', '.join(configs)}")
    args.algorithms = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    if not args.algorithms or set(args.algorithms) - set(ALGORITHMS):
        parser.error(f"--algorithms: one or more of {', '.join(ALGORITHMS)}; got {','.join(args.algorithms)!r}")
    if args.quick:
        args.repeats = 1
    return args


def algorithm_of(key: str) -> str:
    """The registered algorithm a key of :data:`ALGORITHMS` runs."""
    return ALGORITHMS[key].get("algorithm", key)


def master_based(key: str) -> bool:
    from workbench.optim.registry import ALGORITHMS as REGISTRY
    return REGISTRY[algorithm_of(key)].master_based


def runs(args) -> list[tuple[str, tuple]]:
    """(algorithm, configuration) pairs to measure: sync-sgd in each ``--configs``, every other
    algorithm in its own settings (:data:`ALGORITHMS`)."""
    out = []
    for algorithm in args.algorithms:
        if algorithm == "sync-sgd":
            out += [(algorithm, config) for config in args.configs]
        else:
            settings = ALGORITHMS[algorithm]
            options = {k: v for k, v in settings.items() if k in ("fusion_bytes", "overlap")}
            out.append((algorithm, (algorithm, f"{algorithm}, {settings}", options)))
    return out


def period(algorithm: str) -> int:
    """Steps from one exchange to the next."""
    settings = ALGORITHMS[algorithm]
    return settings.get("sync_every", settings.get("tau", 1))


def predict_kwargs(algorithm: str, update_s: float, skew_s: float) -> dict:
    """:func:`~workbench.netsim.predict.predict`'s arguments beyond the profile, ranks, network and
    options for ``algorithm`` (from :data:`ALGORITHMS`): easgd's master applies in ``update_s`` and
    has no ``skew_s``."""
    settings = ALGORITHMS[algorithm]
    kwargs = {"algorithm": algorithm_of(algorithm), "tau": period(algorithm), "update_s": update_s,
              **{k: settings[k] for k in ("fragments", "sync_delay", "outer_wire_dtype") if k in settings}}
    if algorithm_of(algorithm) == "easgd":
        kwargs["apply_s"] = update_s
    else:
        kwargs["skew_s"] = skew_s
    return kwargs


def plan(args, model: str, every: int = 1) -> tuple[int, int, int]:
    """(batch per rank, steps per run, profile repetitions) of ``model``; the steps rounded up so that
    the measured window (step ``SKIP`` to the last) holds whole periods of ``every`` steps."""
    batch, steps, repeats = PLANS[model]
    if args.quick:
        steps, repeats = max(SKIP + 4, steps // 3), max(3, repeats // 3)
    return batch, SKIP + 1 + -(-(steps - SKIP - 1) // every) * every, repeats


def fashion_subset(folder: Path, rows: int) -> Path:
    """The first ``rows`` training rows and :data:`TEST_ROWS` test rows of Fashion-MNIST as an .npz."""
    from workbench import data
    path = folder / f"fashion-mnist-{rows}.npz"
    if not path.exists():
        full = data.load("fashion-mnist")
        data.save_arrays(path, full.X_train[:rows].numpy(), full.y_train[:rows].numpy(),
                         full.X_test[:TEST_ROWS].numpy(), full.y_test[:TEST_ROWS].numpy())
    return path


def mpi_latency(vc, nodes: int, rate_bits: float, folder: Path, timeout: float) -> dict:
    """Seconds per ring step that MPI ranks on ``vc`` see now: a :data:`PROBE_BYTES` ring all-reduce
    (``workbench.bench.allreduce``, one rank per node, 30 repetitions, mean) over its 2(N-1) steps,
    less each step's bandwidth term. Ranks that busy-wait in MPI on cores shared with other work
    pay the scheduler's delay at every step; a blocking TCP ping-pong does not (the kernel wakes a
    sleeper at once), so this is the latency a run's all-reduce meets on a loaded machine. The probe's
    bytes fit the links' burst (:func:`workbench.vcluster.wiring.burst_bytes`, refilled between
    repetitions), so only what exceeds it is taken off as transfer time."""
    from workbench.netsim.costs import TCP_PAYLOAD_SHARE, wire_bytes
    from workbench.vcluster.wiring import burst_bytes
    from workbench.runtime.launch.launcher import run_mpi
    path = folder / f"latency-{time.time_ns()}.json"
    run_mpi(nodes, ["-m", "workbench.bench.allreduce", "--sizes", str(PROBE_BYTES), "--algorithms", "ring",
                       "--no-gloo", "--repetitions", "30", "--warmup", "3", "--json", str(path)],
            timeout=timeout, cwd=Path(__file__).resolve().parent.parent, **vc.run_options(nodes))
    (row,) = json.loads(path.read_text())["results"]
    steps = 2 * (nodes - 1)
    sent = wire_bytes("ring", nodes, PROBE_BYTES) / TCP_PAYLOAD_SHARE   # a rank's bytes on the wire
    transfer = max(sent - burst_bytes(rate_bits), 0) / (rate_bits / 8) / steps
    return {"latency_s": max(row["mean_s"] / steps - transfer, 0.0), "probe": row, "load_1min": os.getloadavg()[0]}


def communication_seconds(model: str, nodes: int, network, options: dict, algorithm: str = "sync-sgd") -> float:
    """The predicted seconds of one step's communication alone (every layer's compute zero): what a
    rank waits for each step, the profile's pause (``algorithm``'s exchange: its share of a step)."""
    import torch
    from workbench import models
    from workbench.bench.layers import parameterised_layers
    from workbench.netsim.predict import predict
    from workbench.netsim.profile import LayerProfile
    torch.manual_seed(0)
    layers = []
    for name, module in parameterised_layers(models.build(model, 28 * 28, 10)):
        tensors = tuple(p.numel() for p in module.parameters(recurse=False) if p.requires_grad)
        layers.append(LayerProfile(name, sum(tensors), 0.0, 0.0, tensors))
    kwargs = predict_kwargs(algorithm, 0.0, 0.0)
    return predict(layers, nodes + master_based(algorithm), network, options, **kwargs).step_s


def predictions(profiles: dict, nodes: int, networks: dict, options: dict, algorithm: str = "sync-sgd") -> dict:
    """Each variant of :data:`VARIANTS`: the predicted step, compute, communication (seconds) of
    ``algorithm`` on ``nodes`` training nodes (a master-based one's master on one more)."""
    from workbench.netsim.predict import predict
    out = {}
    for variant, (which, network, with_skew) in VARIANTS.items():
        profile = profiles[which]
        kwargs = predict_kwargs(algorithm, profile.update_s, profile.skew_s if with_skew else 0.0)
        skew = kwargs.get("skew_s", 0.0)
        p = predict(profile.layers, nodes + master_based(algorithm), networks[network], options, **kwargs)
        out[variant] = {"step_s": p.step_s, "compute_s": p.compute_s, "comm_s": p.comm_s,
                        "exposed_comm_s": p.exposed_comm_s, "skew_s": skew, "latency_s": networks[network].latency,
                        "wire_bytes": p.wire_bytes, "messages": p.messages}
    return out


def measure(vc, model: str, dataset: Path, batch: int, options: dict, run_dir: Path, timeout: float,
            algorithm: str = "sync-sgd", nodes: int | None = None) -> dict:
    """One run of ``algorithm`` on ``nodes`` training nodes of ``vc`` (default all; a master-based one's
    master on node 0 and its workers on the next ``nodes``), one rank per node: its steady step time
    and breakdown."""
    from workbench.config import RunConfig
    from workbench.runtime.launch.batch import train
    from workbench.telemetry import steady_step_seconds
    settings = {**{k: v for k, v in ALGORITHMS[algorithm].items() if k != "algorithm"}, **options}
    nodes = vc.nodes if nodes is None else nodes
    if not master_based(algorithm):   # a master's workers exchange with it: no all-reduce
        settings.setdefault("collective", "ring")
    cfg = RunConfig(algorithm=algorithm_of(algorithm), ranks=nodes + master_based(algorithm), model=model,
                    dataset=str(dataset), epochs=1, batch_size=batch, eval_every=100_000, telemetry=True, **settings)
    load = os.getloadavg()
    before = vc.links()
    s = train(cfg, run_dir, timeout=timeout, vcluster=vc, ppn=1)
    after = vc.links()
    moved = {key: sum(link[key] for link in after) - sum(link[key] for link in before)
             for key in ("bytes_sent", "drops")}
    events = json.loads((run_dir / "trace.json").read_text())["traceEvents"]
    return {"step_s": steady_step_seconds(events, SKIP), "spans": span_stats(events, master_based(algorithm)),
            "steps_per_worker": s["steps_per_worker"],
            "wall_seconds": s["wall_seconds"], "wire_bytes_per_step": s["wire_bytes_per_step"],
            "link_bytes": moved["bytes_sent"], "link_drops": moved["drops"],
            "trace": trace_breakdown(run_dir, skip=SKIP),
            "final_test_accuracy": s["final_test_accuracy"], "load_average_before": load,
            "load_average_after": os.getloadavg()}


def span_stats(events: list[dict], master: bool) -> dict:
    """Per role (``master``: rank 0 of a master-based run; ``workers``: the others), each span's
    median, total and longest seconds, how many there were and how many took over 0.1 s (TCP's
    retransmission timeout is 0.2 s): where a step's (or an arrival's) time went."""
    roles: dict = {}
    for e in events:
        if e.get("ph", "X") == "X" and "dur" in e:
            role = "master" if master and e.get("pid", 0) == 0 else "workers"
            roles.setdefault(role, {}).setdefault(e["name"], []).append(e["dur"] / 1e6)
    return {role: {name: {"median_s": statistics.median(d), "total_s": sum(d), "max_s": max(d), "count": len(d),
                          "over_100ms": sum(x > 0.1 for x in d)} for name, d in sorted(spans.items())}
            for role, spans in roles.items()}


def inputs(args, vc, nodes: int, model: str, dataset: Path, options: dict, folder: Path,
           algorithm: str = "sync-sgd") -> tuple[dict, object]:
    """What a prediction needs, measured now: the MPI latency (:func:`mpi_latency`) and the profile of
    ``nodes`` processes at once, pausing for the communication that latency predicts."""
    from workbench.bench.step import profile_step
    from workbench.netsim.costs import tcp_link
    from workbench.vcluster.plan import parse_rate
    rate = parse_rate(args.vcluster)
    batch, _, profile_repeats = plan(args, model)
    latency = mpi_latency(vc, nodes, rate, folder, args.timeout)
    pause = (communication_seconds(model, nodes, tcp_link(rate, latency["latency_s"], socket_buffer=socket_buffer()),
                                   options, algorithm) if args.pause else 0.0)
    load = os.getloadavg()
    profile = profile_step(model, batch, dataset=str(dataset), processes=nodes, lockstep=True, pause_s=pause,
                           repeats=profile_repeats, warmup=2, wire_dtypes=(), ranks=nodes, timeout=args.timeout)
    latency.update(profile=profile.to_dict(), load_average_before=load, load_average_after=os.getloadavg())
    return latency, profile


@functools.cache
def socket_buffer() -> int:
    """Bytes a TCP connection's two sockets hold at most: ``net.ipv4.tcp_wmem``'s and ``tcp_rmem``'s
    maxima (a new network namespace copies the host's)."""
    return sum(int(Path(f"/proc/sys/net/ipv4/{name}").read_text().split()[2]) for name in ("tcp_wmem", "tcp_rmem"))


def pair(args, vc, nodes: int, ping: float, model: str, algorithm: str, config: tuple, folder: Path,
         repeat: int) -> dict:
    """The MPI latency and a profile of ``nodes`` processes at once, the run of ``algorithm`` on
    ``nodes`` training nodes of ``vc``, the same two again;
    the predictions from their means (and from the first alone). ``ping``: the kernel's one-way
    latency on ``vc`` (seconds)."""
    from workbench.netsim.costs import tcp_link
    from workbench.vcluster.plan import parse_rate
    from workbench.vcluster.wiring import burst_bytes
    rate = parse_rate(args.vcluster)
    batch, steps, _ = plan(args, model, period(algorithm))
    dataset = fashion_subset(folder, steps * nodes * batch)
    key, _, options = config
    before, profile_before = inputs(args, vc, nodes, model, dataset, options, folder, algorithm)
    run = measure(vc, model, dataset, batch, options, folder / f"{model}-{key}-{repeat}", args.timeout, algorithm,
                  nodes)
    after, profile_after = inputs(args, vc, nodes, model, dataset, options, folder, algorithm)
    latency = (before["latency_s"] + after["latency_s"]) / 2
    burst, buffered = burst_bytes(rate), socket_buffer()
    networks = {"mpi": tcp_link(rate, latency, burst_bytes=burst, socket_buffer=buffered),
                "mpi_before": tcp_link(rate, before["latency_s"], burst_bytes=burst, socket_buffer=buffered),
                "ping": tcp_link(rate, ping, burst_bytes=burst, socket_buffer=buffered),
                "mpi_no_burst": tcp_link(rate, latency, socket_buffer=buffered),
                "mpi_no_buffer": tcp_link(rate, latency, burst_bytes=burst)}
    profiles = {"bracket": profile_before.mean_with(profile_after), "before": profile_before}
    row = {"model": model, "nodes": nodes, "algorithm": algorithm, "config": key, "repeat": repeat,
           "batch_size": batch, "steps": steps, "socket_buffer_bytes": buffered, "before": before, "after": after,
           "run": run, "predictions": predictions(profiles, nodes, networks, options, algorithm)}
    row["ratio"] = {v: row["predictions"][v]["step_s"] / run["step_s"] for v in VARIANTS}
    p = row["predictions"]["lockstep"]
    print(f"{nodes} nodes {model} {key} #{repeat}: measured {run['step_s'] * 1e3:.1f} ms/step, predicted "
          f"{p['step_s'] * 1e3:.1f} (ratio {row['ratio']['lockstep']:.2f}; compute {p['compute_s'] * 1e3:.1f} + skew "
          f"{p['skew_s'] * 1e3:.1f}, comm {p['comm_s'] * 1e3:.1f} at {latency * 1e6:.0f} us per step; before only: "
          f"{row['ratio']['before_only']:.2f}, ping latency: {row['ratio']['ping_latency']:.2f}, no burst: "
          f"{row['ratio']['no_burst']:.2f}, no socket buffer: {row['ratio']['no_socket_buffer']:.2f}); "
          f"{run['link_drops']} packets dropped; load {os.getloadavg()[0]:.1f}", flush=True)
    return row


def on_cluster(args, nodes: int, scratch: Path, into: dict, save) -> None:
    """Every pair for ``nodes`` nodes on one virtual cluster, brought up here and always taken down;
    the cluster's figures go ``into`` the report, which ``save()`` writes after each pair."""
    from workbench.netsim.costs import tcp_link
    from workbench.vcluster import VirtualCluster
    from workbench.vcluster.plan import parse_rate
    from workbench.vcluster.probe import one_way_latency
    from workbench.vcluster.wiring import burst_bytes
    folder = scratch / f"n{nodes}"
    # keep=True: the record names no owner, so no other process's `up` takes this one for a dead
    # process's and removes it mid-run; it is taken down in `finally`. A master-based algorithm's
    # master gets a node of its own, one more
    master = any(master_based(a) for a in args.algorithms)
    vc = VirtualCluster(f"{args.name}n{nodes}"[:8], nodes + master, "switch", args.vcluster, shared=folder,
                        queue=args.queue, keep=True)
    try:
        vc.up()
        ping = one_way_latency(vc)
        rate = parse_rate(args.vcluster)
        network = tcp_link(rate, ping, burst_bytes=burst_bytes(rate))
        print(f"\n{nodes} nodes on a switch at {args.vcluster}: one-way latency {ping * 1e6:.0f} us (TCP ping-pong); "
              f"{network.describe()}", flush=True)
        into.update(one_way_latency_s=ping, network=network.describe(), bandwidth_Bps=network.bandwidth,
                    queue_bytes=vc.status()["queue_bytes"], rows=[])
        for repeat in range(args.repeats):
            for model in args.models:
                for algorithm, config in runs(args):
                    into["rows"].append(pair(args, vc, nodes, ping, model, algorithm, config, folder, repeat))
                    save()
    finally:
        vc.down()


def summarise(report: dict) -> tuple[list, list]:
    """The table (one row per model x nodes x configuration) and the goals. A ratio is the median
    over pairs of (prediction / the run right after it): each prediction is judged against the run
    measured under the same load; step times are medians over pairs."""
    table, goals = [], []
    median = statistics.median
    for nodes, cluster in report["clusters"].items():
        groups: dict = {}
        for row in cluster["rows"]:
            groups.setdefault((row["model"], row["config"]), []).append(row)
        for (model, key), rows in groups.items():
            measured = median(r["run"]["step_s"] for r in rows)
            predicted = {v: median(r["predictions"][v]["step_s"] for r in rows) for v in VARIANTS}
            ratio = {v: median(r["ratio"][v] for r in rows) for v in VARIANTS}
            within = abs(ratio["lockstep"] - 1) <= TOLERANCE
            traces = [r["run"]["trace"] for r in rows if r["run"]["trace"]]
            part = lambda name: median(r["predictions"]["lockstep"][name] for r in rows)  # noqa: E731
            table.append({"model": model, "nodes": int(nodes), "config": key, "batch_size": rows[0]["batch_size"],
                          "measured_s": measured, "measured_runs_s": [r["run"]["step_s"] for r in rows],
                          **{f"{v}_s": predicted[v] for v in VARIANTS}, **{f"{v}_ratio": ratio[v] for v in VARIANTS},
                          "ratios_per_pair": [r["ratio"]["lockstep"] for r in rows],
                          "predicted_compute_s": part("compute_s"), "predicted_skew_s": part("skew_s"),
                          "predicted_comm_s": part("comm_s"), "mpi_latency_s": part("latency_s"),
                          "measured_compute_s": median(t["compute"] for t in traces) if traces else None,
                          "load_1min": [r["run"]["load_average_before"][0] for r in rows], "within": within})
            if key == "dense" or key in ALGORITHMS:
                what = "" if key == "dense" else f" {key}"
                goals.append({"goal": f"{model}{what}, {nodes} nodes: predicted step time within +-{TOLERANCE:.0%} of "
                                      "the measured", "measured": f"predicted/measured {ratio['lockstep']:.2f} "
                                      f"({predicted['lockstep'] * 1e3:.1f} vs {measured * 1e3:.1f} ms)", "met": within})
    return table, goals


def print_table(report: dict) -> None:
    from tabulate import tabulate
    ms = lambda v: "-" if v is None else f"{v * 1e3:.1f}"  # noqa: E731
    print(f"\npredicted vs measured step time: {', '.join(report['algorithms'])} (ring), one rank per node on a "
          f"switch at {report['rate']} "
          f"(the nodes share {report['machine']['cpus']} cores); medians over {report['repeats']} profile + run "
          f"pair(s); load average {report['load_average']['before'][0]:.1f} before, "
          f"{report['load_average']['after'][0]:.1f} after")
    print(tabulate([[r["model"], r["nodes"], r["config"], r["batch_size"], ms(r["measured_s"]), ms(r["lockstep_s"]),
                     f"{r['lockstep_ratio']:.2f}", ", ".join(f"{x:.2f}" for x in r["ratios_per_pair"]),
                     f"{r['before_only_ratio']:.2f}", f"{r['ping_latency_ratio']:.2f}", f"{r['no_skew_ratio']:.2f}", f"{r['no_burst_ratio']:.2f}",
                     f"{r['no_socket_buffer_ratio']:.2f}",
                     ms(r["predicted_compute_s"]),
                     ms(r["predicted_skew_s"]), ms(r["measured_compute_s"]), ms(r["predicted_comm_s"]),
                     f"{r['mpi_latency_s'] * 1e3:.2f}", ", ".join(f"{x:.1f}" for x in r["load_1min"]),
                     "yes" if r["within"] else "NO"] for r in report["table"]],
                   headers=["model", "nodes", "config", "batch", "measured ms", "predicted ms", "ratio",
                            "ratio per pair", "ratio, before only", "ratio, ping latency", "ratio, no skew",
                            "ratio, no burst", "ratio, no socket buffer", "pred compute", "pred skew",
                            "meas compute", "pred comm", "MPI latency ms", "load (1 min)", f"+-{TOLERANCE:.0%}"]))
    print("ratio = median over pairs of predicted / measured (" + "; ".join(f"{v}: {VARIANT_LABELS[v]}" for v in VARIANTS) + ")")
    print()
    print(tabulate([[g["goal"], g["measured"], "met" if g["met"] else "NOT met"] for g in report["goals"]],
                   headers=["goal", "measured", ""]))


def main(argv=None) -> None:
    from workbench.bench.machine import Load, describe
    args = parse(argv)
    load, started = Load(), time.time()
    scratch = Path(tempfile.mkdtemp(prefix="wb-predict-vc-", dir="/var/tmp"))
    report = {"rate": args.vcluster, "topology": "switch", "ppn": 1, "algorithms": args.algorithms,
              "algorithm_settings": {a: ALGORITHMS[a] for a in args.algorithms}, "collective": "ring",
              "skip_steps": SKIP,
              "profile_pause": args.pause,
              "repeats": args.repeats, "tolerance": TOLERANCE, "dataset": "fashion-mnist (first rows: see each row)",
              "plans": {m: dict(zip(("batch_size", "steps", "profile_repeats"), plan(args, m))) for m in args.models},
              "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime(started)), "clusters": {}}
    partial = args.json.with_suffix(".partial.json")   # every pair so far, in case the run is cut short
    args.json.parent.mkdir(parents=True, exist_ok=True)
    try:
        for nodes in args.nodes:
            report["clusters"][str(nodes)] = {}
            on_cluster(args, nodes, scratch, report["clusters"][str(nodes)],
                       lambda: partial.write_text(json.dumps(report, indent=1, default=str)))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report["table"], report["goals"] = summarise(report)
    report.update(machine=describe(), load_average=load.done(), total_seconds=time.time() - started)
    print_table(report)
    args.json.write_text(json.dumps(report, indent=1, default=str))
    partial.unlink(missing_ok=True)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
