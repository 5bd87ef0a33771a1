"""GradientFlow's peers in the same run: workbench's gradient-communication strategies against
PyTorch DDP (gloo) and its communication hooks, on the same model, data shards, batches, lr,
momentum, epochs, evaluation points and ranks.

Rows (every one a whole training run per seed, one mpiexec job each; seeds outermost, so drift
on this shared machine hits every row alike; rows in a seeded shuffled order within a seed):

- workbench ``sync-sgd`` through :func:`workbench.runtime.launch.batch.train`: dense fp32 in one
  message per step; one message per tensor (``fusion_bytes=0``); fusion at 64K and 256K; fusion
  64K with overlap; fp16 on the wire; CSC at rho 0.1 and 0.01 (``sparse_chunk`` 64, 1-epoch dense
  warm-up, the ``csc`` preset); the CSC ablations without residual and without momentum correction;
- torch ``DistributedDataParallel`` (gloo, 127.0.0.1) plain, with ``fp16_compress_hook``,
  ``bf16_compress_hook`` and ``powerSGD_hook`` at rank 1 and 2 (``start_powerSGD_iter`` = the
  steps of the CSC warm-up, 1 epoch). DDP refuses ``bf16_compress_hook`` by name without CUDA
  and NCCL, so that row registers a wrapper that calls it (gloo sums bfloat16 on the CPU);
  PowerSGD runs with one bucket (``bucket_cap_mb=25``: with DDP's default 1 MiB first bucket
  the hook's all_reduces from two buckets, issued from gloo's callback threads, mismatched
  across ranks: crash or hang). The DDP trainer runs inside workbench's own rank context
  (:class:`~workbench.runtime.rank.context.Context`: model, initial weights, shards, batches,
  evaluation, metric records) and the sync-sgd loop (:class:`~workbench.optim.sync.SyncAlgorithm`:
  evaluation every ``eval_every`` steps on rank 0, the same stop-flag broadcast), with the same
  momentum-SGD update as ``sync-sgd`` on the averaged gradient; only the gradient all-reduce is
  DDP's, so the step times compare communication.

Columns: step time (training wall time from the ranks' common start / steps: evaluation points
included for every row alike; median over seeds), bytes on the wire per step per rank (mean over
the run, and after the warm-up), messages per step, final test accuracy (mean and min-max over
seeds), seconds until the first evaluation at or above ``--target`` (median over the seeds that
reached it; "-" when none did).

Bytes. workbench rows: measured by workbench's counters (``summary.json``'s
``wire_bytes_per_step``: every message's bytes on the wire; for ``native`` a ring's
2(n-1)/n share of the buffer). "after warm-up" for CSC is derived from the same counters:
(run total - warm-up steps x dense bytes per step) / remaining steps (a warm-up step sends
exactly the dense fp32 bytes). DDP rows: **computed from the formula, not measured** (gloo's
traffic is not inspected): a ring all-reduce sends 2(n-1)/n x bytes per rank, so plain DDP
sends 2(n-1)/n x 4 x parameters per step, the fp16/bf16 hooks half of that, and PowerSGD, from
``start_powerSGD_iter`` on, 2(n-1)/n x 4 x (the P and Q matrices: (rows + cols) x rank floats
for each gradient viewed as a rows x cols matrix that PowerSGD compresses, as decided by its own
``_should_compress`` with ``min_compression_rate`` 2, + the uncompressed tensors: biases). DDP's
messages per step are its buckets (x3 for PowerSGD after its warm-up: uncompressed, P, Q).

Prints the table and the goals, and writes every number as JSON (default
benchmarks/results/gradient_comm_<model>_<ranks>ranks.json) with the load average before and after.

    python benchmarks/gradient_comm.py [--model wide_mlp] [--seeds 0,1,2] [--epochs 8] [--target 0.9]
                                       [--quick] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

from ddp_peer import RESULTS  # benchmarks/ is sys.path[0] here and under mpiexec (python -m mpi4py)

from workbench.bench.machine import Load, describe

#: workbench sync-sgd rows: (key, RunConfig changes on top of dense fp32, one message per step, no
#: overlap). RunConfig's own default is overlap=True, so every row says overlap explicitly.
WORKBENCH = [
    ("dense", {}),
    ("per-tensor", {"fusion_bytes": 0}),
    ("fusion-64K", {"fusion_bytes": 64 << 10}),
    ("fusion-256K", {"fusion_bytes": 256 << 10}),
    ("fusion-64K-overlap", {"fusion_bytes": 64 << 10, "overlap": True}),
    ("fp16", {"wire_dtype": "fp16"}),
    ("csc-0.1", {"sparse_ratio": 0.1, "warmup_epochs": 1}),
    ("csc-0.01", {"sparse_ratio": 0.01, "warmup_epochs": 1}),
    ("csc-0.1-no-residual", {"sparse_ratio": 0.1, "warmup_epochs": 1, "residual": False}),
    ("csc-0.1-no-momentum-correction", {"sparse_ratio": 0.1, "warmup_epochs": 1, "momentum_correction": False}),
]
DENSE = {"fusion_bytes": None, "overlap": False}

#: DDP rows: (key, hook, PowerSGD rank)
DDP = [
    ("ddp", None, None),
    ("ddp-fp16", "fp16", None),
    ("ddp-bf16", "bf16", None),
    ("ddp-powersgd-1", "powersgd", 1),
    ("ddp-powersgd-2", "powersgd", 2),
]
#: CSC's and PowerSGD's warm-up, in epochs
WARMUP_EPOCHS = 1
#: a DDP job that fails is run again once (gloo once aborted a rank with "terminate called without
#: an active exception" here, not reproduced in 12 runs of the same job); the JSON keeps the failure
DDP_RETRIES = 1


# -- DDP: the rank side ------------------------------------------------------------------------
def ddp_traffic(shapes: list[tuple[int, ...]], ranks: int, hook: str | None, rank: int | None) -> dict:
    """Bytes per step per rank of DDP's all-reduces, from the ring formula (module docstring):
    ``dense`` (plain, and PowerSGD before its start), ``steady`` (with the hook, after it)."""
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _should_compress

    from workbench.netsim.costs import wire_bytes

    def ring(nbytes):
        return wire_bytes("ring", ranks, nbytes)
    params = sum(math.prod(s) for s in shapes)
    dense = ring(4 * params)
    if hook is None:
        return {"dense": dense, "steady": dense, "floats_steady": params}
    if hook in ("fp16", "bf16"):
        return {"dense": dense, "steady": ring(2 * params), "floats_steady": params}
    floats = 0  # PowerSGD: as powerSGD_hook splits a bucket (tensor.view(shape[0], -1))
    for shape in shapes:
        n = shape[0] if shape else 1
        m = math.prod(shape) // n
        r = min(n, m, rank)
        compress, uncompressed, compressed = _should_compress(n, m, r, 2)  # PowerSGDState's default
        floats += compressed if compress else uncompressed
    return {"dense": dense, "steady": ring(4 * floats), "floats_steady": floats}


def ddp_worker(run_dir: Path) -> None:
    """One DDP run on this rank: reads ``run_dir/config.json`` and ``run_dir/peer.json``; rank 0
    writes ``summary.json`` and ``metrics.jsonl`` as a workbench run does, and ``peer.json`` back
    with the formula's bytes."""
    import torch
    import torch.distributed as dist
    from mpi4py import MPI
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, powerSGD_hook

    from workbench.config import RunConfig
    from workbench.optim import rules
    from workbench.optim.sync import SyncAlgorithm
    from workbench.runtime.rank.context import Context
    from workbench.ports import torch_init_method
    from workbench.runtime.rank.worker import _finish

    def bf16_on_gloo(state, bucket):
        """``bf16_compress_hook`` itself: DDP refuses that name without CUDA and NCCL >= 2.10
        (``_check_comm_hook`` goes by the hook's ``__name__``); gloo sums bfloat16 on the CPU."""
        return default_hooks.bf16_compress_hook(state, bucket)

    class DDPSGD(SyncAlgorithm):
        """sync-sgd's loop and update with DDP's gradient all-reduce (averaged during backward)."""

        def __init__(self, ctx: Context, hook: str | None, rank: int | None, start_iter: int) -> None:
            super().__init__(ctx)
            # the parameters stay views of ctx.flat (gradient_as_bucket_view=False copies the
            # averaged buckets back into the existing .grad tensors in place)
            # PowerSGD: one bucket (bucket_cap_mb given, so DDP's 1 MiB first bucket is 25 MiB
            # too). With two buckets, the hook's P and Q all_reduces, issued from gloo's callback
            # threads, interleaved differently on different ranks: a collective mismatch (gloo
            # "Received data size doesn't match expected size", a segfault or a hang, here)
            self.ddp = torch.nn.parallel.DistributedDataParallel(
                ctx.model, **({"bucket_cap_mb": 25} if hook == "powersgd" else {}))
            if hook == "fp16":
                self.ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
            elif hook == "bf16":
                self.ddp.register_comm_hook(None, bf16_on_gloo)
            elif hook == "powersgd":
                self.ddp.register_comm_hook(PowerSGDState(process_group=None, matrix_approximation_rank=rank,
                                                          start_powerSGD_iter=start_iter), powerSGD_hook)
            ctx.model = self.ddp  # Context.gradient's forward and backward now go through DDP
            self.hook, self.start_iter = hook, start_iter
            self.bytes = ddp_traffic([tuple(p.shape) for p in ctx.flat.params], ctx.size, hook, rank)
            self.buckets = None

        def final_weights(self) -> torch.Tensor:
            return self.ctx.flat.data

        def step(self, step: int) -> None:
            ctx, cfg = self.ctx, self.ctx.cfg
            ctx.gradient(step)  # DDP all-reduces and averages the buckets during backward
            if step < 2:  # DDP rebuilds its buckets once, in the second step's forward
                self.ctx.flat.check_grads_are_views()
                self.buckets = len(self.ddp.reducer._get_zeros_like_grad_buckets())
            x, self.velocity = rules.momentum_sgd(ctx.flat.data, self.velocity, ctx.flat.grad, cfg.hyper.lr, cfg.hyper.momentum)
            ctx.flat.data.copy_(x)
            compressed = self.hook == "powersgd" and step >= self.start_iter
            if ctx.size > 1:  # DDP's messages, counted in the rank's one counter as workbench's are
                traffic = ctx.communicator.traffic
                traffic.wire_bytes += round(self.bytes["steady" if compressed or self.hook in ("fp16", "bf16")
                                                       else "dense"])
                traffic.dense_wire_bytes += round(self.bytes["dense"])
                traffic.messages += self.buckets * (3 if compressed else 1)

    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    cfg = RunConfig.from_dict(json.loads((run_dir / "config.json").read_text()))
    peer = json.loads((run_dir / "peer.json").read_text())
    start = time.perf_counter()
    ctx = Context(cfg, comm, run_dir)
    dist.init_process_group("gloo", init_method=torch_init_method(comm), rank=ctx.rank, world_size=ctx.size)
    algorithm = DDPSGD(ctx, peer["hook"], peer["rank"], peer["start_iter"])
    comm.Barrier()
    ctx.t0 = time.perf_counter()  # the common start, after DDP's set-up (as workbench's is after its own)
    final = algorithm.run()
    wall = ctx.now()
    _finish(ctx, final, wall, ctx.t0 - start, run_dir)
    if ctx.rank == 0:
        (run_dir / "peer.json").write_text(json.dumps({**peer, **algorithm.bytes, "buckets": algorithm.buckets}))
    comm.Barrier()  # every rank done with gloo before any tears it down
    dist.destroy_process_group()


# -- the launcher side -------------------------------------------------------------------------
def run_workbench(args, key: str, changes: dict, seed: int, run_dir: Path, progress: bool = False) -> dict:
    """One workbench run of ``key``; ``progress``: a progress bar on stderr while it runs."""
    from workbench.config import RunConfig
    from workbench.runtime.launch.batch import train
    from workbench.runtime.live import ProgressBar

    cfg = RunConfig(**base_config(args, seed), **{**DENSE, **changes})
    bar = ProgressBar(f"{key} seed {seed}") if progress else None
    try:
        s = train(cfg, run_dir, timeout=args.timeout, watch=[bar] if bar else [])
    finally:
        if bar is not None:
            bar.close()
    spe = s["steps_per_worker"] // args.epochs
    warm = cfg.warmup_epochs * spe if cfg.sparse_ratio is not None else 0
    dense_step = s["dense_wire_bytes"] / s["steps_per_worker"]
    # only a one-epoch warm-up is all dense: a longer one's ratio falls over its later epochs, whose
    # bytes the summary does not separate
    after = ((s["wire_bytes"] - warm * dense_step) / (s["steps_per_worker"] - warm)
             if s["steps_per_worker"] > warm and cfg.warmup_epochs <= 1 else None)
    return record(args, key, "workbench " + cfg.communication_options.describe(), seed, s, run_dir,
                  bytes_after_warmup=after, dense_bytes_per_step=dense_step, warmup_steps=warm,
                  options=cfg.communication_options.to_dict())


def launch_ddp(cfg, run_dir: Path, hook: str | None, rank: int | None, start_iter: int, timeout: float,
               vcluster=None) -> tuple[Path, list[dict]]:
    """One DDP run of ``cfg`` as an mpiexec job (run again once if it fails: :data:`DDP_RETRIES`), its
    ranks on the nodes of ``vcluster`` (one per node) when given; the run folder that finished and
    the failed attempts."""
    from workbench.runtime.launch.blame import MPILaunchError
    from workbench.runtime.launch.launcher import run_mpi

    failures = []
    for attempt in range(1 + DDP_RETRIES):
        attempt_dir = run_dir / f"attempt{attempt}"
        attempt_dir.mkdir(parents=True)
        (attempt_dir / "config.json").write_text(cfg.to_json())
        (attempt_dir / "peer.json").write_text(json.dumps({"hook": hook, "rank": rank, "start_iter": start_iter}))
        placed = {} if vcluster is None else vcluster.run_options(cfg.ranks, 1, job_dir=attempt_dir / "job")
        try:
            run_mpi(cfg.ranks, [str(Path(__file__).resolve()), "--ddp-worker", str(attempt_dir.resolve())],
                    timeout=timeout, **placed)
            return attempt_dir, failures
        except MPILaunchError as exc:
            if attempt == DDP_RETRIES:
                raise
            first = str(exc).splitlines()
            failures.append({"error": first[0], "detail": first[-1] if len(first) > 1 else "",
                             "training_finished": (attempt_dir / "summary.json").exists()})
            print(f"  {run_dir.name} failed ({first[0]}; {failures[-1]['detail']}); running it again", flush=True)
    raise AssertionError("unreachable")


def run_ddp(args, key: str, hook: str | None, rank: int | None, seed: int, run_dir: Path) -> dict:
    from workbench.config import RunConfig

    cfg = RunConfig(**base_config(args, seed), **DENSE)
    spe = cfg_steps_per_epoch(cfg)
    start_iter = max(2, WARMUP_EPOCHS * spe)  # DDP refuses < 2 with error feedback / warm start
    run_dir, failures = launch_ddp(cfg, run_dir, hook, rank, start_iter, args.timeout)
    s = json.loads((run_dir / "summary.json").read_text())
    peer = json.loads((run_dir / "peer.json").read_text())
    label = {None: "torch DDP (gloo)", "fp16": "torch DDP + fp16_compress_hook",
             "bf16": "torch DDP + bf16_compress_hook"}.get(hook, f"torch DDP + powerSGD_hook rank {rank}, "
                                                                 f"start at step {start_iter}")
    warm = start_iter if hook == "powersgd" else 0
    return record(args, key, label, seed, s, run_dir, failed_attempts=failures,
                  bytes_after_warmup=peer["steady"] if s["steps_per_worker"] > warm else None,
                  dense_bytes_per_step=peer["dense"], warmup_steps=warm, bytes_from_formula=True,
                  ddp_buckets=peer["buckets"], options={"hook": hook, "matrix_approximation_rank": rank,
                                                        "start_powerSGD_iter": start_iter if hook == "powersgd" else None})


def cfg_steps_per_epoch(cfg) -> int:
    from workbench import data
    from workbench.summary import planned_steps
    info = data.describe(cfg.dataset, **cfg.data_sizes)
    return max(planned_steps(info.train_samples, cfg.workers, cfg.batch_size, 1))


def base_config(args, seed: int) -> dict:
    # dataset: csc_accuracy.py's --dataset (this script's own runs: digits)
    return dict(algorithm="sync-sgd", ranks=args.ranks, model=args.model, dataset=getattr(args, "dataset", "digits"),
                subset=getattr(args, "subset", None), epochs=args.epochs, seed=seed,
                batch_size=args.batch_size, collective=args.collective, eval_every=args.eval_every,
                lr_schedule=getattr(args, "lr_schedule", "constant"), telemetry=False)


def record(args, key: str, label: str, seed: int, s: dict, run_dir: Path, **extra) -> dict:
    from workbench.runtime.launch.batch import time_to_accuracy
    return {"key": key, "label": label, "seed": seed,
            "step_s": s["wall_seconds"] / s["steps_per_worker"], "wall_seconds": s["wall_seconds"],
            "steps_per_worker": s["steps_per_worker"], "final_test_accuracy": s["final_test_accuracy"],
            "time_to_target": time_to_accuracy(run_dir, args.target),
            "wire_bytes_per_step": s["wire_bytes_per_step"], "messages_per_step": s["messages_per_step"],
            "skipped_steps": s.get("skipped_steps", 0), "parameters": s["parameters"],
            "bytes_from_formula": False, "failed_attempts": [], **extra}


def aggregate(runs: list[dict]) -> dict:
    acc = [r["final_test_accuracy"] for r in runs]
    tta = [r["time_to_target"] for r in runs]
    reached = [t for t in tta if t is not None]
    return {"key": runs[0]["key"], "label": runs[0]["label"], "seeds": [r["seed"] for r in runs],
            "step_ms_median": 1e3 * statistics.median(r["step_s"] for r in runs),
            "step_ms": [1e3 * r["step_s"] for r in runs],
            "wire_bytes_per_step": statistics.mean(r["wire_bytes_per_step"] for r in runs),
            "bytes_after_warmup": (statistics.mean(r["bytes_after_warmup"] for r in runs)
                                   if all(r["bytes_after_warmup"] is not None for r in runs) else None),
            "messages_per_step": statistics.mean(r["messages_per_step"] for r in runs),
            "bytes_from_formula": runs[0]["bytes_from_formula"],
            "accuracy_mean": statistics.mean(acc), "accuracy_min": min(acc), "accuracy_max": max(acc),
            "accuracy_std": statistics.stdev(acc) if len(acc) > 1 else 0.0,
            "time_to_target": tta, "time_to_target_median": statistics.median(reached) if reached else None,
            "reached": len(reached), "skipped_steps": [r["skipped_steps"] for r in runs],
            "failed_attempts": sum(len(r["failed_attempts"]) for r in runs)}


def goals(by_key: dict[str, dict]) -> list[dict]:
    """The benchmark's goals, each with what was measured and whether it was met."""
    out = []

    def add(goal: str, measured: str, met: bool | None) -> None:
        out.append({"goal": goal, "measured": measured, "met": met})

    ms = {k: v["step_ms_median"] for k, v in by_key.items()}
    fused = {k: ms[k] for k in ("fusion-64K", "fusion-256K", "dense") if k in ms}
    if fused and "per-tensor" in ms:
        best = min(fused, key=fused.get)
        ratio = fused[best] / ms["per-tensor"]
        add("fusion: best theta step time <= 0.8x one message per tensor",
            f"{ratio:.2f}x ({best}: {fused[best]:.2f} ms vs per-tensor {ms['per-tensor']:.2f} ms; "
            + ", ".join(f"{k} {v / ms['per-tensor']:.2f}x" for k, v in fused.items()) + ")", ratio <= 0.8)
    if "fp16" in by_key and "dense" in by_key:
        f16, d = by_key["fp16"], by_key["dense"]
        ratio = f16["wire_bytes_per_step"] / d["wire_bytes_per_step"]
        add("fp16: bytes exactly halved", f"{ratio:.7f} of fp32 ({f16['wire_bytes_per_step']:.0f} vs "
            f"{d['wire_bytes_per_step']:.0f} B/step)", ratio == 0.5)
        diff = 100 * (f16["accuracy_mean"] - d["accuracy_mean"])
        add("fp16: accuracy within 0.5 points of fp32 (mean over seeds)", f"{diff:+.2f} points", abs(diff) <= 0.5)
    if "csc-0.1" in by_key and "dense" in by_key:
        c, d = by_key["csc-0.1"], by_key["dense"]
        steady = d["wire_bytes_per_step"] / c["bytes_after_warmup"] if c["bytes_after_warmup"] else None
        whole = d["wire_bytes_per_step"] / c["wire_bytes_per_step"]
        add("CSC rho=0.1 with warm-up: >= 8x fewer bytes than dense fp32",
            (f"{steady:.2f}x after the warm-up, " if steady else "") + f"{whole:.2f}x over the whole run",
            steady is not None and steady >= 8)
        diff = 100 * (c["accuracy_mean"] - d["accuracy_mean"])
        add("CSC rho=0.1 with warm-up: accuracy within 1 point of dense", f"{diff:+.2f} points", abs(diff) <= 1)
    for key in ("csc-0.1-no-residual", "csc-0.1-no-momentum-correction"):
        if key in by_key and "csc-0.1" in by_key:
            a, c = by_key[key], by_key["csc-0.1"]
            diff = 100 * (a["accuracy_mean"] - c["accuracy_mean"])
            worse = a["accuracy_max"] < c["accuracy_min"]
            add(f"{key}: visibly worse than CSC rho=0.1 (or not)",
                f"{diff:+.2f} points (range {a['accuracy_min']:.3f}-{a['accuracy_max']:.3f} vs "
                f"{c['accuracy_min']:.3f}-{c['accuracy_max']:.3f}); reached target {a['reached']}/"
                f"{len(a['seeds'])} vs {c['reached']}/{len(c['seeds'])}", worse)
    if "dense" in ms and "ddp" in ms:
        ratio = ms["dense"] / ms["ddp"]
        add("workbench dense / DDP gloo step time <= 0.5", f"{ratio:.2f} ({ms['dense']:.2f} vs {ms['ddp']:.2f} ms)",
            ratio <= 0.5)
    if "csc-0.01" in by_key and "ddp" in by_key:
        c, d = by_key["csc-0.01"], by_key["ddp"]
        steady = c["bytes_after_warmup"] / d["wire_bytes_per_step"] if c["bytes_after_warmup"] else None
        whole = c["wire_bytes_per_step"] / d["wire_bytes_per_step"]
        add("CSC rho=0.01: bytes <= 1/40 of DDP's",
            (f"1/{1 / steady:.1f} after the warm-up, " if steady else "") + f"1/{1 / whole:.1f} over the whole run",
            steady is not None and steady <= 1 / 40)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--model", default="wide_mlp", choices=["mlp", "wide_mlp", "cnn"])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--collective", default="native", help="workbench's all-reduce (default native: MPI_Allreduce)")
    parser.add_argument("--eval-every", type=int, default=10, help="steps between evaluations")
    parser.add_argument("--target", type=float, default=0.9, help="test accuracy for the time-to-target column")
    parser.add_argument("--only", help="comma-separated row keys (default: every row)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds one run may take")
    parser.add_argument("--quick", action="store_true", help="one seed, 3 epochs")
    parser.add_argument("--json", help="where the JSON goes (default benchmarks/results/gradient_comm_<model>_<ranks>ranks.json)")
    parser.add_argument("--ddp-worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ddp_worker:
        ddp_worker(args.ddp_worker)
        return
    if args.quick:
        args.seeds, args.epochs = "0", 3
    seeds = [int(s) for s in args.seeds.split(",")]
    out = Path(args.json or RESULTS / f"gradient_comm_{args.model}_{args.ranks}ranks.json")
    only = set(args.only.split(",")) if args.only else None
    rows = [("workbench", key, changes) for key, changes in WORKBENCH] + [("ddp", key, (hook, rank))
                                                                           for key, hook, rank in DDP]
    rows = [r for r in rows if only is None or r[1] in only]
    if only is not None and len(rows) != len(only):
        parser.error(f"--only: unknown row(s); known: {', '.join(k for k, _ in WORKBENCH)}, "
                     f"{', '.join(k for k, _, _ in DDP)}")

    from tabulate import tabulate

    from workbench.sizes import format_bytes

    load = Load()
    started = time.time()
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="gradient-comm-") as tmp:
        for seed in seeds:  # seeds outermost: drift on this noisy machine hits every row alike
            order = list(rows)
            random.Random(seed).shuffle(order)  # and no row is always the first job after a pause
            for position, (kind, key, spec) in enumerate(order):
                run_dir = Path(tmp) / f"{key}-{seed}"
                r = (run_workbench(args, key, spec, seed, run_dir) if kind == "workbench"
                     else run_ddp(args, key, *spec, seed, run_dir))
                r["position"] = position
                runs.append(r)
                tta = "-" if r["time_to_target"] is None else f"{r['time_to_target']:.2f} s"
                print(f"seed {seed} {key}: {1e3 * r['step_s']:.2f} ms/step, {format_bytes(r['wire_bytes_per_step'])}"
                      f"/step, accuracy {r['final_test_accuracy']:.3f}, to {args.target:g}: {tta}", flush=True)
    load_average = load.done()
    summary = [aggregate([r for r in runs if r["key"] == key]) for _, key, _ in rows]
    by_key = {s["key"]: s for s in summary}
    ref = by_key.get("ddp")
    params = runs[0]["parameters"]

    def tta_cell(s: dict) -> str:
        reached = [t for t in s["time_to_target"] if t is not None]
        if not reached:
            return "-"
        text = f"{statistics.median(reached):.2f}"
        if len(reached) > 1:
            text += f" ({min(reached):.2f}-{max(reached):.2f})"
        return text + (f", {len(reached)}/{len(s['seeds'])}" if len(reached) < len(s["seeds"]) else "")

    table = []
    for s in summary:
        after = s["bytes_after_warmup"]
        table.append([
            s["label"], f"{s['step_ms_median']:.2f}",
            f"{s['step_ms_median'] / by_key['dense']['step_ms_median']:.2f}x" if "dense" in by_key else "-",
            format_bytes(s["wire_bytes_per_step"]) + ("*" if s["bytes_from_formula"] else ""),
            (format_bytes(after) + ("*" if s["bytes_from_formula"] else "")) if after is not None else "-",
            f"1/{ref['wire_bytes_per_step'] / after:.1f}" if ref and after else "-",
            f"{s['messages_per_step']:.2f}",
            f"{s['accuracy_mean']:.3f} ({s['accuracy_min']:.3f}-{s['accuracy_max']:.3f})",
            tta_cell(s)])
    print(f"\ngradient communication: {args.model} ({params:,} parameters), {args.ranks} ranks, batch "
          f"{args.batch_size} per rank, {args.epochs} epochs, seeds {args.seeds}, collective {args.collective}; "
          f"load average {load_average['before'][0]:.1f} before, {load_average['after'][0]:.1f} after "
          f"({os.cpu_count()} cores)")
    print(tabulate(table, headers=["", "ms/step (median)", "vs dense", "bytes/step/rank", "after warm-up",
                                   "vs DDP", "messages/step", "test acc mean (min-max)", f"s to {args.target:g}"]))
    failed = [f"{s['key']} ({s['failed_attempts']})" for s in summary if s["failed_attempts"]]
    if failed:
        print("jobs that failed once and were run again: " + ", ".join(failed))
    print("* computed from the ring formula 2(n-1)/n x bytes, not measured; \"vs DDP\": after-warm-up bytes "
          "over plain DDP's")
    goal_rows = goals(by_key)
    print()
    print(tabulate([[g["goal"], g["measured"], {True: "met", False: "NOT met", None: "-"}[g["met"]]]
                    for g in goal_rows], headers=["goal", "measured", ""]))
    import torch
    out.write_text(json.dumps({
        "model": args.model, "parameters": params, "ranks": args.ranks, "epochs": args.epochs, "seeds": seeds,
        "batch_size": args.batch_size, "collective": args.collective, "eval_every": args.eval_every,
        "target": args.target, "warmup_epochs": WARMUP_EPOCHS, "torch": torch.__version__,
        "cpus": os.cpu_count(), "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime(started)),
        "total_seconds": time.time() - started,
        "machine": describe(), "load_average": load_average,
        "ddp_bytes": "computed from the ring formula 2(n-1)/n, not measured",
        "summary": summary, "goals": goal_rows, "runs": runs}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
