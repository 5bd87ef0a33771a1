"""Synchronous algorithms: every rank trains, lock-step, bitwise deterministic for a seed.

``sync-sgd``: the gradients are reduced by a :class:`~workbench.comm.strategies.GradientReducer`
(GradientFlow's strategies: fusion buckets, overlap with backward, fp16/bf16 on the wire,
coarse-grained sparse communication; dense fp32 in one message by default), then a momentum
SGD step on every rank (with CSC's momentum correction, the sent sum is a momentum step already:
the optimizer only carries on the momentum that masking cleared at the senders,
``rules.carried_momentum_sgd``).
``sync-easgd``: the SC'17 lock-step scheme with the center replicated on every rank: (1)
workers compute gradients while (2-3) the sum of the workers' weights is all-reduced
(overlapped in a communication thread, ``overlap=True``; in fusion buckets), then (4) the
elastic worker step and (5) the synchronous center step, both from the same pre-step values.
Since every rank receives bit-identical sums, every rank's center is identical. Sync EASGD
all-reduces weights, not gradients: fusion applies (buckets of the weight vector), the
gradient hooks do not (the weights are known before backward starts, so the whole exchange
overlaps the gradient computation already), nor do wire precision and CSC (see
``workbench.config``). Both exchange through the rank's communicator (``ctx.communicator``,
:class:`~workbench.comm.communicator.Communicator`: its ``gradient_reducer`` and ``allreduce``),
which counts every message.
"""
from __future__ import annotations

import threading

import torch

from ..comm.hookspec import load_hook
from ..comm.options import warmup_ratio
from ..comm.strategies import GradientReducer
from ..runtime.rank.context import Context
from . import rules
from .trainer import Trainer


def gradient_step(x: torch.Tensor, velocity: torch.Tensor, reducer: GradientReducer, ranks: int, lr: float,
                  momentum: float) -> tuple[torch.Tensor, torch.Tensor]:
    """sync-sgd's update once ``reducer`` has summed the gradients: ``(x', velocity')``. Momentum
    SGD on the mean; with CSC's momentum correction the mean is a momentum step already, and the
    optimizer only carries on the momentum that masking cleared at the senders
    (:func:`~workbench.optim.rules.carried_momentum_sgd` with CSC's ``carry_weight``)."""
    grad = reducer.grad / ranks
    if reducer.momentum_in_communication:
        return rules.carried_momentum_sgd(x, velocity, grad, reducer.csc.carry_weight, lr, momentum)
    return rules.momentum_sgd(x, velocity, grad, lr, momentum)


def gradient_step_(x: torch.Tensor, velocity: torch.Tensor, reducer: GradientReducer, ranks: int, lr: float,
                   momentum: float, scratch: torch.Tensor) -> None:
    """:func:`gradient_step` in place, the same bits, with ``scratch`` (a tensor like ``x``):
    :func:`~workbench.optim.rules.momentum_sgd_` on the mean gradient; with CSC's momentum correction,
    :func:`~workbench.optim.rules.carried_momentum_sgd`'s operations in its order, the mean gradient
    computed twice into ``scratch`` (the summed gradient is left as it is)."""
    if reducer.momentum_in_communication:
        torch.div(reducer.grad, ranks, out=scratch).mul_(lr)      # lr * grad
        x.sub_(scratch)                                           # x - lr * grad
        velocity.mul_(momentum)                                   # momentum * v
        x.add_(velocity)                                          # x' = x - lr * grad + momentum * v
        torch.div(reducer.grad, ranks, out=scratch).mul_(reducer.csc.carry_weight).mul_(lr)  # lr * (carried * grad)
        velocity.sub_(scratch)                                    # v' = momentum * v - lr * (carried * grad)
        return
    torch.div(reducer.grad, ranks, out=scratch)                   # the mean gradient
    rules.momentum_sgd_(x, velocity, scratch, lr, momentum, scratch)


class Background:
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

    def join(self, timeout: float | None = None, what: str = "the communication thread") -> None:
        """Wait for the thread (``timeout`` seconds at most: then :class:`TimeoutError` naming ``what``)
        and re-raise its error."""
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise TimeoutError(f"{what} did not complete within {timeout} s")
        if self.error is not None:
            raise self.error


class SyncAlgorithm(Trainer):
    """The lock-step family's base: every rank keeps the weights, a velocity and a center, and the
    one loop (:class:`~workbench.optim.trainer.Trainer`) owns resume, evaluation, checkpoints and the
    agreed stop points."""

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.velocity = torch.zeros_like(ctx.flat.data)
        self.center = ctx.flat.data.clone()

    def state(self, step: int) -> dict:
        return {**super().state(step), "v": self.velocity.clone(), "center": self.center.clone()}

    def restore(self, state: dict) -> None:
        super().restore(state)
        self.velocity.copy_(state["v"])
        self.center.copy_(state["center"])


class SyncSGD(SyncAlgorithm):
    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        cfg = ctx.cfg
        self.options = cfg.communication_options
        hook = load_hook(cfg.comm_hook) if cfg.comm_hook else None  # a user's hook in place of dense/CSC
        self.reducer = ctx.communicator.gradient_reducer(ctx.flat.params, ctx.flat.grad, momentum=cfg.hyper.momentum,
                                                         hook=hook)
        self.csc = self.reducer.csc  # CSC's state (momentum, residual, ratio), or None
        self.scratch = torch.empty_like(ctx.flat.data)  # the update's gradient term (gradient_step_)

    def final_weights(self) -> torch.Tensor:
        return self.ctx.flat.data

    def state(self, step: int) -> dict:
        state = super().state(step)
        if self.csc is not None:  # CSC's momentum and residual belong to the run's state
            state.update(u=self.csc.u.clone(), r=self.csc.v.clone())
        return state

    def restore(self, state: dict) -> None:
        super().restore(state)
        if self.csc is not None and "u" in state:
            self.csc.u.copy_(state["u"])
            self.csc.v.copy_(state["r"])

    def step(self, step: int) -> None:
        ctx, cfg, reducer = self.ctx, self.ctx.cfg, self.reducer
        if self.csc is not None:
            self.csc.ratio = warmup_ratio(self.options.sparse_ratio, ctx.epoch_of(step), self.options.warmup_epochs)
        reducer.start()
        ctx.gradient(step)  # with overlap, the buckets are issued from the gradient hooks
        with ctx.span("reduce_gradients", "wait", buckets=len(reducer.buckets)):
            apply = reducer.finish()
        if not apply:  # a wire overflow on some rank: every rank skips this step
            return
        with ctx.span("update", "compute"):
            gradient_step_(ctx.flat.data, self.velocity, reducer, ctx.size, ctx.lr(step), cfg.hyper.momentum,
                           self.scratch)


class SyncEASGD(SyncAlgorithm):
    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        # the updates' model-sized temporaries and the weights' sum, kept (the in-place rules)
        self.s1, self.s2, self.x_sum = (torch.empty_like(ctx.flat.data) for _ in range(3))

    def final_weights(self) -> torch.Tensor:
        return self.center

    def step(self, step: int) -> None:
        ctx, cfg = self.ctx, self.ctx.cfg
        x, lr = ctx.flat.data, ctx.lr(step)
        s1, s2, x_sum = self.s1, self.s2, self.x_sum
        if step % cfg.tau:  # a local step between elastic exchanges
            ctx.gradient(step)
            with ctx.span("update", "compute"):
                rules.sgd_(x, ctx.flat.grad, lr, s1)
            return
        x_sum.copy_(x)  # pre-step weights, summed while the gradient is computed
        if cfg.overlap:
            comm_thread = Background(lambda: ctx.communicator.allreduce(x_sum))
            ctx.gradient(step)
            with ctx.span("join_allreduce", "wait"):
                comm_thread.join()
        else:
            ctx.communicator.allreduce(x_sum)
            ctx.gradient(step)
        with ctx.span("update", "compute"):
            p = ctx.size
            rules.elastic_worker_(x, ctx.flat.grad, self.center, lr, cfg.hyper.rho, s1, s2)  # from the old center
            rules.elastic_center_sync_(self.center, x_sum.div_(p), lr, cfg.hyper.rho, p, s1)
