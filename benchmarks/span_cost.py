"""What recording one telemetry span costs, in one process (no mpiexec, no other ranks).

Two measurements:

- per span: ``with telemetry.span(...)`` around an empty body in a tight loop, against the same
  loop with telemetry off (``Context.span`` then returns a ``nullcontext``), with no observer, with a
  do-nothing observer, and with the live stream's ``StreamChannel`` (``LiveSink`` until issue 43) pushing batches every 50 ms to a
  ZeroMQ socket in this process (what a rank in a notebook run pays);
- per step: a ``sync-sgd`` training step of the digits MLP on ``MPI.COMM_SELF`` (forward/backward,
  the all-reduce, the update; 1 metric record) with telemetry on and off, switched on the same
  model between short blocks so that drift hits both alike.

Costs are CPU time of the timing thread (``time.thread_time``), which a loaded machine inflates far
less than wall time (also recorded, with the load average). Medians over the repetitions; prints
the tables and writes them as JSON (default benchmarks/results/span_cost.json).

    python benchmarks/span_cost.py [--spans 200000] [--repeats 5] [--steps 100] [--blocks 40] [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from contextlib import nullcontext
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

from tabulate import tabulate  # noqa: E402

from workbench.bench.machine import Load, describe  # noqa: E402
from workbench.telemetry import Observer, Telemetry  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def _loop_ns(make_span, n: int) -> tuple[float, float]:
    """(CPU, wall) nanoseconds per iteration of ``with make_span(): pass``."""
    cpu, wall = time.thread_time_ns(), time.perf_counter_ns()
    for i in range(n):
        with make_span(i):
            pass
    return (time.thread_time_ns() - cpu) / n, (time.perf_counter_ns() - wall) / n


def _live_sink():
    """A StreamChannel (the notebook's live channel) pushing to a PULL socket in this process, drained by a thread; returns (sink, stop)."""
    import zmq

    from workbench.runtime.rank.sink import StreamChannel
    from workbench.runtime.stream import new_secret

    context = zmq.Context.instance()
    pull = context.socket(zmq.PULL)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    done = threading.Event()

    def drain():
        while not done.is_set():
            if pull.poll(20):
                while True:
                    try:
                        pull.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
        pull.close(linger=0)

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    sink = StreamChannel(f"tcp://127.0.0.1:{port}", 0, "bench", new_secret())

    def stop():
        sink.close()
        done.set()
        thread.join()

    return sink, stop


def per_span(n: int, repeats: int) -> dict:
    variants = {}
    off = nullcontext({})
    variants["telemetry off (nullcontext)"] = lambda i: off
    plain = Telemetry(0)
    variants["span, no observer"] = lambda i: plain.span("allreduce", "comm", step=i)
    observed = Telemetry(0)
    observed.observers.append(Observer())
    variants["span, do-nothing observer"] = lambda i: observed.span("allreduce", "comm", step=i)
    live = Telemetry(0)
    sink, stop_sink = _live_sink()
    live.observers.append(sink)
    variants["span, LiveSink (live stream)"] = lambda i: live.span("allreduce", "comm", step=i)
    times: dict[str, list[float]] = {name: [] for name in variants}
    walls: dict[str, list[float]] = {name: [] for name in variants}
    try:
        for _ in range(repeats):  # interleaved: drift hits every variant alike
            for name, make in variants.items():
                for tel in (plain, observed, live):
                    tel._raw.clear()  # keep memory flat between repetitions
                    tel._events.clear()
                cpu, wall = _loop_ns(make, n)
                times[name].append(cpu)
                walls[name].append(wall)
    finally:
        stop_sink()
    medians = {name: statistics.median(t) for name, t in times.items()}
    base = medians["telemetry off (nullcontext)"]
    wall_base = statistics.median(walls["telemetry off (nullcontext)"])
    return {name: {"cpu_ns_per_iteration": medians[name], "cpu_ns_per_span": medians[name] - base,
                   "wall_ns_per_span": statistics.median(walls[name]) - wall_base,
                   "runs_cpu_ns": times[name], "runs_wall_ns": walls[name]}
            for name in variants}


def per_step(steps: int, blocks: int) -> dict:
    """One SyncSGD on COMM_SELF, telemetry switched on and off between short blocks of steps
    (same model, data and memory for both); the difference is the median of the blocks' paired
    differences, which drift on a shared machine affects least."""
    import torch
    from mpi4py import MPI

    from workbench.config import RunConfig
    from workbench.optim.sync import SyncSGD
    from workbench.runtime.rank.context import Context
    from workbench.telemetry import recording

    torch.set_num_threads(1)
    algo = SyncSGD(Context(RunConfig(algorithm="sync-sgd", ranks=1, epochs=1000, telemetry=True),
                           MPI.COMM_SELF, None))
    ctx, tel = algo.ctx, algo.ctx.telemetry

    def block(on: bool) -> tuple[float, float]:
        ctx.telemetry = tel if on else None  # what RunConfig(telemetry=False) gives the Context
        with recording(tel) if on else nullcontext():  # the all-reduce's span, as on a rank
            cpu, wall = time.thread_time(), time.perf_counter()
            for step in range(steps):
                algo.step(step)
            return (time.thread_time() - cpu) / steps, (time.perf_counter() - wall) / steps

    block(True), block(False)  # warm-up
    tel._raw.clear()
    times: dict[bool, list[float]] = {True: [], False: []}
    walls: dict[bool, list[float]] = {True: [], False: []}
    recorded = 0
    for i in range(blocks):
        for on in ((True, False) if i % 2 == 0 else (False, True)):
            cpu, wall = block(on)
            times[on].append(cpu)
            walls[on].append(wall)
        recorded += len(tel._raw)
        tel._raw.clear()
        tel._events.clear()
        ctx.metrics.clear()
    spans = recorded / (blocks * steps)
    on, off = statistics.median(times[True]), statistics.median(times[False])
    paired = statistics.median(a - b for a, b in zip(times[True], times[False]))
    wall_paired = statistics.median(a - b for a, b in zip(walls[True], walls[False]))
    wall_on, wall_off = statistics.median(walls[True]), statistics.median(walls[False])
    return {"cpu_on_s": on, "cpu_off_s": off, "cpu_paired_difference_s": paired, "difference": paired / off,
            "spans_per_step": spans, "cpu_s_per_span": paired / spans if spans else None,
            "wall_on_s": wall_on, "wall_off_s": wall_off, "wall_paired_difference_s": wall_paired,
            "wall_difference": wall_paired / wall_off,
            "runs_cpu_on_s": times[True], "runs_cpu_off_s": times[False],
            "runs_wall_on_s": walls[True], "runs_wall_off_s": walls[False]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spans", type=int, default=200_000, help="spans per timed loop")
    parser.add_argument("--repeats", type=int, default=5, help="timed loops per span variant")
    parser.add_argument("--steps", type=int, default=100, help="training steps per timed block")
    parser.add_argument("--blocks", type=int, default=40, help="pairs of blocks, telemetry on and off")
    parser.add_argument("--quick", action="store_true", help="a tenth of the spans, 3 repeats, 10 pairs of blocks")
    parser.add_argument("--json", help="where the JSON goes (default benchmarks/results/span_cost.json)")
    args = parser.parse_args()
    if args.quick:
        args.spans, args.repeats, args.blocks = args.spans // 10, 3, 10
    args.json = args.json or RESULTS / "span_cost.json"

    load = Load()
    spans = per_span(args.spans, args.repeats)
    print(f"one span, {args.spans:,} per loop, median of {args.repeats} loops (telemetry off = the loop's own cost)\n")
    print(tabulate([[name, f"{v['cpu_ns_per_iteration'] / 1e3:.2f}", f"{v['cpu_ns_per_span'] / 1e3:.2f}",
                     f"{v['wall_ns_per_span'] / 1e3:.2f}"] for name, v in spans.items()],
                   headers=["", "CPU us per iteration", "CPU us per span (minus off)", "wall us per span"]))
    step = per_step(args.steps, args.blocks)
    print(f"\nsync-sgd step, digits MLP, MPI.COMM_SELF: {args.blocks} pairs of {args.steps}-step blocks, medians\n")
    print(tabulate([["telemetry on", f"{step['cpu_on_s'] * 1e6:.1f}", f"{step['wall_on_s'] * 1e6:.1f}"],
                    ["telemetry off", f"{step['cpu_off_s'] * 1e6:.1f}", f"{step['wall_off_s'] * 1e6:.1f}"],
                    ["paired difference", f"{step['cpu_paired_difference_s'] * 1e6:+.1f} ({100 * step['difference']:+.1f}%)",
                     f"{step['wall_paired_difference_s'] * 1e6:+.1f} ({100 * step['wall_difference']:+.1f}%)"]],
                   headers=["", "CPU us/step", "wall us/step"]))
    print(f"{step['spans_per_step']:g} spans per step: {step['cpu_s_per_span'] * 1e6:.2f} CPU us per span "
          f"(difference / spans); load average {load.before[0]:.1f} before, {os.getloadavg()[0]:.1f} after")
    Path(args.json).write_text(json.dumps({"spans_per_loop": args.spans, "repeats": args.repeats,
                                           "steps_per_block": args.steps, "block_pairs": args.blocks,
                                           "cpus": os.cpu_count(),
                                           "machine": describe(), "load_average": load.done(),
                                           "per_span": spans, "per_step": step}, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
