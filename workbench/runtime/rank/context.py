"""What one rank needs to train: model, flat buffers, its shard, telemetry, metrics.

Algorithms (``workbench.optim.sync`` / ``master``) get a :class:`Context` and call
:meth:`Context.gradient` for a compute step, :meth:`Context.evaluate` at evaluation points,
and record what they communicate through :meth:`Context.span`.
"""
from __future__ import annotations

import math
import os
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F
from mpi4py import MPI

from ... import data as data_mod
from ... import models
from ...comm.hooks import Traffic
from ...config import RunConfig
from ...lr_schedules import scheduled_lr
from ...summary import planned_steps
from ...telemetry import Telemetry
from ..rundir import CANCEL_FILE


class TrainingError(RuntimeError):
    """Training cannot go on (non-finite loss, injected failure, ...)."""


class Context:
    """Per-rank training state. ``worker_index`` is this rank's shard (None on a master)."""

    #: seconds between two looks at the cancel flag (a stat call; cheap, but not free per step)
    STOP_CHECK_SECONDS = 0.1

    def __init__(self, cfg: RunConfig, comm: MPI.Comm, out_dir: Path | None, observers=()) -> None:
        self.cfg, self.comm = cfg, comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.out_dir = out_dir
        torch.manual_seed(cfg.seed)  # identical initial weights on every rank
        self.base_lr = cfg.hyper.lr  # the schedule's start (RunConfig.hyper computes it: once, not per step)
        master = cfg.spec.master_based
        self.worker_index = (self.rank - 1 if self.rank > 0 else None) if master else self.rank
        # each rank holds its own shard only, and the test set only where it evaluates (rank 0:
        # the master, or the first worker of a synchronous run)
        self.data = data_mod.load(cfg.dataset, **cfg.data_sizes, seed=cfg.seed,
                                  shard=(self.worker_index, cfg.workers), test=self.rank == 0)
        self.model = models.build(cfg.model, self.data.num_features, self.data.num_classes)
        self.flat = models.FlatParams(self.model)
        self._eval_model = models.build(cfg.model, self.data.num_features, self.data.num_classes)
        self._eval_flat = models.FlatParams(self._eval_model)
        self._eval_result = None  # (accuracy, loss) of the weights and buffers the evaluation model holds
        self.batches, self.steps, self.steps_per_epoch = None, 0, 0  # none on a master
        if self.worker_index is not None:
            self.batches = data_mod.Batches(self.data, self.worker_index, cfg.workers,
                                            cfg.batch_size, cfg.seed)
            # lock-step algorithms: as many steps per epoch as the smallest shard gives, on every rank
            planned = planned_steps(self.data.train_samples, cfg.workers, cfg.batch_size, 1, cfg.spec.synchronous)
            self.steps_per_epoch = planned[self.worker_index]
            self.steps = self.steps_per_epoch * cfg.epochs
        self.steps_completed = self.steps  # less when the run was cancelled
        self.cancelled = False
        self.metrics: list[dict] = []
        self.observers = list(observers)  # telemetry Observers: see spans and metric records
        self._cancel_flag = Path(out_dir) / CANCEL_FILE if out_dir is not None else None
        self._next_stop_check = 0.0
        comm.Barrier()  # line the ranks' clocks up: t = 0 is the same moment everywhere
        self.t0 = time.perf_counter()
        self.telemetry = Telemetry(self.rank, time.perf_counter_ns()) if cfg.telemetry else None
        if self.telemetry:
            self.telemetry.observers.extend(self.observers)
        #: this rank's one traffic counter (every algorithm, telemetry on or off; the gradient reducer
        #: counts into it too): bytes on the wire, what dense fp32 would have sent, messages, steps
        #: skipped (wire overflow)
        self.traffic = Traffic()

    def count_message(self, wire_bytes: int, dense_wire_bytes: int | None = None) -> None:
        """Count one message this rank sent (``dense_wire_bytes``: its dense fp32 equivalent,
        default the same bytes)."""
        self.traffic.messages += 1
        self.traffic.wire_bytes += wire_bytes
        self.traffic.dense_wire_bytes += wire_bytes if dense_wire_bytes is None else dense_wire_bytes

    def epoch_of(self, step: int) -> float:
        """The (fractional) epoch a training step falls in."""
        return step / self.steps_per_epoch if self.batches is not None else 0.0

    # -- metrics and cancellation ----------------------------------------------------------
    def add_metric(self, record: dict) -> None:
        """Keep a metric record and show it to the observers (the live stream)."""
        self.metrics.append(record)
        for obs in self.observers:
            obs.on_metric(record)

    def stop_requested(self) -> bool:
        """Whether someone asked this run to stop (``cancel()`` writes ``<run_dir>/CANCEL``).

        Local to this rank and looked at no more than every ``STOP_CHECK_SECONDS``;
        synchronous algorithms agree on it with :meth:`agree_to_stop`.
        """
        if self._cancel_flag is None:
            return False
        now = time.perf_counter()
        if now < self._next_stop_check:
            return False
        self._next_stop_check = now + self.STOP_CHECK_SECONDS
        return os.path.exists(self._cancel_flag)

    def agree_to_stop(self) -> bool:
        """Collective: rank 0's :meth:`stop_requested`, the same answer on every rank."""
        flag = bytearray([1 if self.rank == 0 and self.stop_requested() else 0])
        self.comm.Bcast(flag, root=0)
        return bool(flag[0])

    # -- telemetry -------------------------------------------------------------------------
    def span(self, name: str, cat: str, **args):
        """A telemetry span, or nothing when telemetry is off."""
        return self.telemetry.span(name, cat, **args) if self.telemetry else nullcontext(args)

    def now(self) -> float:
        """Seconds since the ranks started together."""
        return time.perf_counter() - self.t0

    # -- compute ---------------------------------------------------------------------------
    def lr(self, step: int) -> float:
        """The learning rate of this worker's ``step``: ``RunConfig.lr_schedule`` over its planned steps."""
        return scheduled_lr(self.base_lr, self.cfg.lr_schedule, step, self.steps)

    def gradient(self, step: int) -> float:
        """Forward and backward on this worker's batch for ``step``; gradient in ``flat.grad``.

        Returns the loss. Raises :class:`TrainingError` on a non-finite loss or at the
        injected failure point (``fail_rank``/``fail_step``).
        """
        cfg = self.cfg
        if cfg.fail_rank == self.rank and cfg.fail_step == step:
            raise TrainingError(f"injected failure on rank {self.rank} at step {step} "
                                f"(fail_rank={cfg.fail_rank}, fail_step={cfg.fail_step})")
        with self.span("batch", "io"):
            X, y = self.batches.batch(step)
        with self.span("forward_backward", "compute", step=step):
            self.flat.zero_grad()
            loss = F.cross_entropy(self.model(X), y, label_smoothing=cfg.label_smoothing)
            loss.backward()
        value = loss.item()
        if not math.isfinite(value):
            raise TrainingError(f"loss is {value} on rank {self.rank} at step {step}: training "
                                f"diverged; lower lr (now {cfg.hyper.lr:g}) or rho (now {cfg.hyper.rho:g})")
        self.add_metric({"kind": "train", "rank": self.rank, "step": step, "t": self.now(), "loss": value,
                         "lr": self.lr(step),
                         "wire_bytes": self.traffic.wire_bytes})  # so far: the live bytes per step
        return value

    #: test rows per forward pass of an evaluation (bounds its memory: resnet18's first block
    #: holds 200 KB of activations per 28x28 image)
    EVAL_ROWS = 500

    @torch.no_grad()
    def evaluate(self, weights: torch.Tensor, **where) -> dict:
        """Test accuracy and loss of ``weights`` (a flat vector); recorded as a metric.

        Layers with running statistics (BatchNorm) take this rank's own: they are buffers, not
        parameters, so no algorithm exchanges them. Weights and buffers equal to the last ones
        evaluated (a synchronous run evaluates its last step, then its final weights) take that
        result again: resnet18 on Fashion-MNIST's 10,000 test rows is about 2 minutes here, the
        comparison 20 ms. Compared by value, not by tensor version counters: MPI's receives into
        numpy views of a tensor do not bump them."""
        if self._eval_result is None or not self._holds(weights):
            self._eval_result = None  # until the test ends: the model holds these weights already
            self._eval_result = self._test(weights)
        acc, loss = self._eval_result
        record = {"kind": "eval", "rank": self.rank, "t": self.now(), "test_accuracy": acc,
                  "test_loss": loss, **where}
        self.add_metric(record)
        return record

    def _holds(self, weights: torch.Tensor) -> bool:
        """Whether the evaluation model holds ``weights`` and this rank's buffers now."""
        return torch.equal(self._eval_flat.data, weights) and all(
            torch.equal(mine, theirs) for mine, theirs in zip(self._eval_model.buffers(), self.model.buffers()))

    def _test(self, weights: torch.Tensor) -> tuple[float, float]:
        """Accuracy and mean loss on the test set of ``weights`` with this rank's buffers."""
        if len(self.data.y_test) == 0:  # a rank that was not meant to evaluate: read the test set now
            self.data.X_test, self.data.y_test = _test_set(self.cfg)
        with self.span("evaluate", "compute"):
            self._eval_flat.data.copy_(weights)
            for mine, theirs in zip(self._eval_model.buffers(), self.model.buffers()):
                mine.copy_(theirs)
            self._eval_model.eval()
            loss_sum, right, y = 0.0, 0, self.data.y_test
            for start in range(0, len(y), self.EVAL_ROWS):
                out = self._eval_model(self.data.X_test[start:start + self.EVAL_ROWS])
                part = y[start:start + self.EVAL_ROWS]
                loss_sum += F.cross_entropy(out, part, reduction="sum").item()
                right += int((out.argmax(1) == part).sum())
        return right / len(y), loss_sum / len(y)

    def is_eval_point(self, count: int, last: int) -> bool:
        """Whether the evaluating rank evaluates after step (master: arrival) ``count`` of ``last``."""
        return count % self.eval_interval(last) == 0 or count == last

    #: evaluations a run has at least by default (``eval_every`` 0), for its live curves
    EVALUATIONS = 10

    def eval_interval(self, last: int) -> int:
        """Steps (master: arrivals) between two evaluations in a run of ``last``: ``RunConfig.eval_every``,
        or for 0 (the default) the fewer of: as many as it takes every worker to train on as many rows
        as the test set holds, so that evaluating stays a fraction of a long run whatever the test set's
        size (digits' 360 rows at batch 16: 23 steps; Fashion-MNIST's 10,000: 625; a master counts every
        worker's arrivals); and a tenth of the run (:data:`EVALUATIONS`)."""
        cfg = self.cfg
        if cfg.eval_every:
            return cfg.eval_every
        if not len(self.data.y_test):  # a rank that does not evaluate
            return 1
        master = cfg.spec.master_based
        steps = -(-len(self.data.y_test) // (cfg.batch_size * (cfg.tau if master else 1)))
        return max(1, min(steps * cfg.workers if master else steps, -(-last // self.EVALUATIONS)))


def _test_set(cfg: RunConfig) -> tuple:
    """The test features and labels alone (no training rows)."""
    test = data_mod.load(cfg.dataset, **cfg.data_sizes, seed=cfg.seed, shard=(None, cfg.workers))
    return test.X_test, test.y_test
