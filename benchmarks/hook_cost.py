"""What a gradient-communication hook costs on the CPU, apart from the wire: one process on
``MPI.COMM_SELF`` (a one-rank all-reduce moves nothing), a model's whole gradient pool, the
hook's own arithmetic per step.

On the virtual cluster a strategy's step is compute + exposed communication; what the hook adds
to the compute (fp16's casts and overflow checks, CSC's accumulators, chunk norms, selection,
packing and unpacking, and its settling after the step) is what this measures, per strategy:
``GradientReducer.reduce()`` on the pool of ``--models`` (torchvision's alexnet, 61.1M parameters,
as in ``gradient_comm_vcluster.py``; resnet18 on 28x28x1, 11.2M), a fresh random gradient each
step (copied in outside the timing), the median over ``--steps`` after one untimed step. The
plain all-reduce hook (one bucket) is the baseline: on one rank it is the bookkeeping alone.

Then the optimizer's update after it, both ways (``--update``): the functional form
(``workbench.optim.sync.gradient_step``, new model-sized tensors each step, copied back as the
training loop did before the update went in place) against ``gradient_step_`` in place, median wall
milliseconds and minor page faults a step (dense: momentum SGD; CSC: its carried momentum).

Costs are CPU time of the timing thread (``time.thread_time``: a loaded machine inflates it far
less than wall time, which is recorded too, beside the load average). Prints a table and writes
JSON (default benchmarks/results/hook_cost.json).

    python benchmarks/hook_cost.py [--models alexnet,resnet18] [--steps 5] [--update] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from mpi4py import MPI  # noqa: E402
from tabulate import tabulate  # noqa: E402

from workbench.bench.machine import Load, describe, wall_and_faults  # noqa: E402
from workbench.comm.options import Communication  # noqa: E402
from workbench.comm.communicator import Communicator  # noqa: E402
from workbench.comm.strategies import GradientReducer  # noqa: E402
from workbench.models import FlatParams, build  # noqa: E402
from workbench.optim.sync import gradient_step, gradient_step_  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"

#: (num_features, num_classes) as the virtual-cluster benchmark builds them
SHAPES = {"alexnet": (3 * 224 * 224, 1000), "resnet18": (28 * 28, 10)}

#: strategy -> (Communication, momentum): the rows of gradient_comm_vcluster.py
STRATEGIES = {
    "dense fp32": (Communication(fusion_bytes=None), 0.0),
    "fp16": (Communication(fusion_bytes=None, wire_dtype="fp16"), 0.0),
    "bf16": (Communication(fusion_bytes=None, wire_dtype="bf16"), 0.0),
    "csc-0.1": (Communication(fusion_bytes=None, sparse_ratio=0.1), 0.9),
    "csc-0.01": (Communication(fusion_bytes=None, sparse_ratio=0.01), 0.9),
}


def measure(model: str, strategy: str, steps: int, update: bool = False) -> dict:
    """Median CPU and wall milliseconds of one ``reduce()`` of ``model``'s pool under ``strategy``."""
    torch.manual_seed(0)
    flat = FlatParams(build(model, *SHAPES[model]))
    options, momentum = STRATEGIES[strategy]
    net = Communicator(MPI.COMM_SELF, "ring", options, 600, flat.bounds)  # as a rank's (Context.communicator)
    reducer = net.gradient_reducer(flat.params, flat.grad, momentum=momentum)
    if reducer.csc is not None:  # the training loop sets the step's ratio (after a warm-up)
        reducer.csc.ratio = options.sparse_ratio
    gradients = [torch.randn(flat.grad.numel()) * 1e-3 for _ in range(2)]
    cpu, wall = [], []
    for step in range(steps + 1):
        flat.grad.copy_(gradients[step % 2])
        c, w = time.thread_time(), time.perf_counter()
        applied = reducer.reduce()
        c, w = time.thread_time() - c, time.perf_counter() - w
        assert applied, f"{strategy}: the step was skipped"
        if step:  # the first step allocates what the state keeps
            cpu.append(c)
            wall.append(w)
    row = {"model": model, "strategy": strategy, "parameters": flat.grad.numel(),
           "cpu_ms": statistics.median(cpu) * 1e3, "wall_ms": statistics.median(wall) * 1e3,
           "cpu_ms_each": [x * 1e3 for x in cpu], "options": options.describe()}
    if update:
        row.update(update_cost(flat, reducer, 0.9, steps))  # the runs' momentum (RunConfig's default)
    reducer.close()
    return row


def update_cost(flat: FlatParams, reducer: GradientReducer, momentum: float, steps: int) -> dict:
    """The update after ``reducer``'s last sum, functional (copied back) and in place: median wall
    milliseconds and minor page faults a step, over ``steps`` steps after one."""
    x, velocity, scratch = flat.data, torch.zeros_like(flat.data), torch.empty_like(flat.data)

    def functional():
        new_x, new_velocity = gradient_step(x, velocity, reducer, 4, 1e-3, momentum)
        x.copy_(new_x)
        velocity.copy_(new_velocity)

    out = {}
    for name, step in (("functional", functional),
                       ("in_place", lambda: gradient_step_(x, velocity, reducer, 4, 1e-3, momentum, scratch))):
        out[f"update_{name}_ms"], out[f"update_{name}_faults"] = wall_and_faults(step, steps)
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="alexnet,resnet18")
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--update", action="store_true",
                        help="also time the optimizer's update, functional and in place")
    parser.add_argument("--json", type=Path, default=RESULTS / "hook_cost.json")
    args = parser.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    strategies = [s for s in args.strategies.split(",") if s]
    for m in models:
        if m not in SHAPES:
            parser.error(f"--models: {m!r} is not one of {', '.join(SHAPES)}")
    for s in strategies:
        if s not in STRATEGIES:
            parser.error(f"--strategies: {s!r} is not one of {', '.join(STRATEGIES)}")
    if args.steps < 1:
        parser.error(f"--steps must be >= 1; got {args.steps}")
    torch.set_num_threads(1)
    load, started = Load(), time.time()
    rows = [measure(m, s, args.steps, args.update) for m in models for s in strategies]
    for row in rows:
        base = next((r for r in rows if r["model"] == row["model"] and r["strategy"] == "dense fp32"), None)
        row["over_dense_ms"] = row["cpu_ms"] - base["cpu_ms"] if base else None
    report = {"date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "total_seconds": time.time() - started,
              "machine": describe(), "load_average": load.done(), "torch": torch.__version__,
              "command": "python benchmarks/hook_cost.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "steps": args.steps, "rows": rows}
    print(tabulate([[r["model"], r["strategy"], f"{r['parameters']:,}", f"{r['cpu_ms']:.0f}", f"{r['wall_ms']:.0f}",
                     "" if r["over_dense_ms"] is None else f"{r['over_dense_ms']:+.0f}"] for r in rows],
                   headers=["model", "strategy", "parameters", "CPU ms/step", "wall ms/step", "vs dense"]))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1))
    if args.update:
        print(tabulate([[r["model"], r["strategy"], f"{r['update_functional_ms']:.0f}",
                         f"{r['update_functional_faults']:,.0f}", f"{r['update_in_place_ms']:.0f}",
                         f"{r['update_in_place_faults']:,.0f}"] for r in rows],
                       headers=["model", "strategy", "update ms, functional", "page faults", "update ms, in place",
                                "page faults"]))
    print(f"wrote {args.json}")
    return report


if __name__ == "__main__":
    main()
