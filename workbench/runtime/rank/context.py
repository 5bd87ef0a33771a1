"""What one rank needs to train, as four parts a :class:`Context` composes, one per concept:

- ``ctx.shard`` (:class:`~workbench.runtime.rank.shard.Shard`): the data shard, its batches, the
  steps and the learning rate over them;
- ``ctx.replica`` (:class:`~workbench.runtime.rank.replica.Replica`): the model, its flat
  parameters, forward and backward, evaluation;
- ``ctx.monitor`` (:class:`~workbench.runtime.rank.monitor.Monitor`): telemetry spans, metric
  records and their observers, the common start's clock, the cancel flag;
- ``ctx.communicator`` (:class:`~workbench.comm.communicator.Communicator`): every exchange and the
  rank's one traffic counter.

Algorithms (``workbench.optim``) get a :class:`Context` and call :meth:`Context.gradient` for a
compute step, :meth:`Context.evaluate` at evaluation points, ``ctx.communicator`` to exchange, and
:meth:`Context.span` around what they do. The parts' attributes an algorithm reads are on the
Context too (:data:`HELD`: ``ctx.flat``, ``ctx.steps``, ``ctx.telemetry``, ``ctx.traffic``, ...),
each held by one part and read and written there.
"""
from __future__ import annotations

import math
from operator import attrgetter
from pathlib import Path

import torch
from mpi4py import MPI

from ...comm.communicator import Communicator
from ...config import RunConfig
from .monitor import Monitor
from .replica import Replica
from .shard import Shard


class TrainingError(RuntimeError):
    """Training cannot go on (non-finite loss, injected failure, ...)."""


def _held_by(part: str, name: str, settable: bool) -> property:
    """A Context attribute held by its part ``part`` (one place holds it: a write reaches the part)."""
    def write(ctx, value) -> None:
        setattr(getattr(ctx, part), name, value)
    # read through attrgetter (C): algorithms read these in every step (a Python getter: 2x the cost)
    return property(attrgetter(f"{part}.{name}"), write if settable else None, doc=f"``{part}.{name}``")


class Context:
    """Per-rank training state: the run's ``cfg``, ``comm`` (the mpi4py communicator), ``rank``,
    ``size`` and ``out_dir`` (the run directory or None), and the four parts of the module's text.
    Made collectively: it ends with a barrier, the ranks' common start (``t0``)."""

    def __init__(self, cfg: RunConfig, comm: MPI.Comm, out_dir: Path | None, observers=()) -> None:
        self.cfg, self.comm = cfg, comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.out_dir = out_dir
        torch.manual_seed(cfg.seed)  # identical initial weights on every rank
        self.shard = Shard(cfg, self.rank)
        self.replica = Replica(cfg, self.shard.data)
        #: every exchange of this rank, and its one traffic counter (every algorithm, telemetry on or
        #: off; the gradient reducer counts into it too)
        self.communicator = Communicator(comm, cfg.collective, cfg.communication_options, cfg.comm_timeout,
                                         self.replica.flat.bounds)
        self.communicator.barrier()  # line the ranks' clocks up: t = 0 is the same moment everywhere
        self.monitor = Monitor(self.rank, out_dir, observers, self.shard.steps, cfg.telemetry)

    def agree_to_stop(self) -> bool:
        """Collective: rank 0's :meth:`stop_requested`, the same answer on every rank."""
        return self.communicator.broadcast_flag(self.rank == 0 and self.monitor.stop_requested())

    # -- compute ---------------------------------------------------------------------------
    def gradient(self, step: int) -> float:
        """Forward and backward on this worker's batch for ``step``; gradient in ``flat.grad``.

        Returns the loss. Raises :class:`TrainingError` on a non-finite loss or at the
        injected failure point (``fail_rank``/``fail_step``).
        """
        cfg, monitor = self.cfg, self.monitor
        if cfg.fail_rank == self.rank and cfg.fail_step == step:
            raise TrainingError(f"injected failure on rank {self.rank} at step {step} "
                                f"(fail_rank={cfg.fail_rank}, fail_step={cfg.fail_step})")
        with monitor.span("batch", "io"):
            X, y = self.shard.batches.batch(step)
        with monitor.span("forward_backward", "compute", step=step):
            loss = self.replica.backward(X, y)
        value = loss.item()
        if not math.isfinite(value):
            raise TrainingError(f"loss is {value} on rank {self.rank} at step {step}: training "
                                f"diverged; lower lr (now {cfg.hyper.lr:g}) or rho (now {cfg.hyper.rho:g})")
        monitor.add_metric({"kind": "train", "rank": self.rank, "step": step, "t": monitor.now(), "loss": value,
                            "lr": self.shard.lr(step),
                            "wire_bytes": self.communicator.traffic.wire_bytes})  # so far: the live bytes per step
        return value

    def evaluate(self, weights: torch.Tensor, **where) -> dict:
        """Test accuracy and loss of ``weights`` (a flat vector) on this rank's test set, recorded as
        a metric with ``where`` (step, epoch, arrivals, ...) and the rank's bytes so far (``wire_bytes``: a
        master trains on no step, so its evaluations are what count its bytes when its incarnation fails); the
        same weights and buffers as the last evaluation take its result again
        (:meth:`~workbench.runtime.rank.replica.Replica.test`)."""
        acc, loss = self.replica.test(weights, self.monitor.span)
        record = {"kind": "eval", "rank": self.rank, "t": self.monitor.now(), "test_accuracy": acc,
                  "test_loss": loss, "wire_bytes": self.communicator.traffic.wire_bytes, **where}
        self.monitor.add_metric(record)
        return record


#: the parts' attributes and methods that stay on the Context (user algorithms read them there), by
#: part: each is read and written on its part (a method is read only)
HELD = {"shard": (Shard, ("data", "worker_index", "batches", "steps", "steps_per_epoch", "base_lr", "epoch_of", "lr")),
        "replica": (Replica, ("model", "flat", "is_eval_point", "eval_interval")),
        "monitor": (Monitor, ("t0", "telemetry", "metrics", "observers", "cancelled", "steps_completed", "span", "now",
                              "add_metric", "stop_requested", "flush")),
        "communicator": (Communicator, ("traffic", "count_message"))}
for _part, (_kind, _names) in HELD.items():
    for _name in _names:
        setattr(Context, _name, _held_by(_part, _name, settable=not callable(getattr(_kind, _name, None))))
