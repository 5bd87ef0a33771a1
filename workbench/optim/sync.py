"""Synchronous algorithms: every rank trains, lock-step, bitwise deterministic for a seed.

``sync-sgd``: all-reduce of gradients each step (one flat message, or one per layer), then a
momentum SGD step on every rank. ``sync-easgd``: the SC'17 lock-step scheme with the center
replicated on every rank: (1) workers compute gradients while (2-3) the sum of the workers'
weights is all-reduced (overlapped in a communication thread, ``overlap=True``), then
(4) the elastic worker step and (5) the synchronous center step, both from the same pre-step
values. Since every rank receives bit-identical sums, every rank's center is identical.
"""
from __future__ import annotations

import threading

import torch

from ..comm import allreduce
from ..runtime.rank import checkpoint
from ..runtime.rank.context import Context
from . import rules


def reduce_flat(ctx: Context, buf: torch.Tensor) -> None:
    """All-reduce a flat tensor: one message, or one per layer (``single_buffer=False``)."""
    parts = [buf] if ctx.cfg.single_buffer else ctx.flat.segments(buf)
    for part in parts:
        allreduce(part, ctx.comm, ctx.cfg.collective)


class _Background:
    """Run a function in a thread (for overlap) and re-raise its error on join."""

    def __init__(self, fn) -> None:
        self.error = None

        def target():
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - re-raised in join()
                self.error = exc
        self.thread = threading.Thread(target=target, daemon=True)
        self.thread.start()

    def join(self) -> None:
        self.thread.join()
        if self.error is not None:
            raise self.error


class SyncAlgorithm:
    """Shared loop: resume, steps, evaluation on rank 0, checkpoints, final weights."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.velocity = torch.zeros_like(ctx.flat.data)
        self.center = ctx.flat.data.clone()
        self.start_step = 0

    def state(self, step: int) -> dict:
        return {"step": step, "x": self.ctx.flat.data.clone(), "v": self.velocity.clone(),
                "center": self.center.clone()}

    def restore(self, state: dict) -> None:
        self.ctx.flat.data.copy_(state["x"])
        self.velocity.copy_(state["v"])
        self.center.copy_(state["center"])
        self.start_step = state["step"]

    def final_weights(self) -> torch.Tensor:
        raise NotImplementedError

    def step(self, step: int) -> None:
        raise NotImplementedError

    def run(self, resume_dir=None) -> torch.Tensor:
        ctx, cfg = self.ctx, self.ctx.cfg
        if resume_dir is not None:
            self.restore(checkpoint.load(resume_dir, ctx.rank, ctx.size))
        for step in range(self.start_step, ctx.steps):
            self.step(step)
            done = step + 1
            if ctx.rank == 0 and ctx.is_eval_point(done, ctx.steps):
                ctx.evaluate(self.final_weights(), step=done, epoch=done / ctx.batches.steps_per_epoch)
            if cfg.checkpoint_every and done % cfg.checkpoint_every == 0 and ctx.out_dir is not None:
                with ctx.span("checkpoint", "io", step=done):
                    checkpoint.save(ctx.out_dir, done, self.state(done), ctx.comm)
            # cancellation: every rank must leave at the same step, so rank 0 decides and
            # broadcasts (a 1-byte Bcast every eval_every steps)
            if done % cfg.eval_every == 0 and done < ctx.steps and ctx.agree_to_stop():
                ctx.cancelled, ctx.steps_completed = True, done  # rank 0 evaluated at this step
                break
        return self.final_weights()


class SyncSGD(SyncAlgorithm):
    def final_weights(self) -> torch.Tensor:
        return self.ctx.flat.data

    def step(self, step: int) -> None:
        ctx, cfg = self.ctx, self.ctx.cfg
        ctx.gradient(step)
        reduce_flat(ctx, ctx.flat.grad)
        with ctx.span("update", "compute"):
            grad = ctx.flat.grad / ctx.size
            x, self.velocity = rules.momentum_sgd(ctx.flat.data, self.velocity, grad, cfg.lr, cfg.momentum)
            ctx.flat.data.copy_(x)


class SyncEASGD(SyncAlgorithm):
    def final_weights(self) -> torch.Tensor:
        return self.center

    def step(self, step: int) -> None:
        ctx, cfg = self.ctx, self.ctx.cfg
        x = ctx.flat.data
        if step % cfg.tau:  # a local step between elastic exchanges
            ctx.gradient(step)
            with ctx.span("update", "compute"):
                x.copy_(rules.sgd(x, ctx.flat.grad, cfg.lr))
            return
        x_sum = x.clone()  # pre-step weights, summed while the gradient is computed
        if cfg.overlap:
            comm_thread = _Background(lambda: reduce_flat(ctx, x_sum))
            ctx.gradient(step)
            with ctx.span("join_allreduce", "wait"):
                comm_thread.join()
        else:
            reduce_flat(ctx, x_sum)
            ctx.gradient(step)
        with ctx.span("update", "compute"):
            p = ctx.size
            new_x = rules.elastic_worker(x, ctx.flat.grad, self.center, cfg.lr, cfg.rho)
            self.center = rules.elastic_center_sync(self.center, x_sum / p, cfg.lr, cfg.rho, p)
            x.copy_(new_x)
