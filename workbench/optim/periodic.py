"""EASGD's descendants: periodic averaging with an outer step, lock-step on every rank.

- ``local-sgd`` (Stich 2019; Lin et al. 2020, "Don't use large mini-batches, use local SGD"): every
  worker takes ``sync_every`` (H) steps of its own momentum SGD, then the workers' weights are
  averaged by one all-reduce; the momentum buffers stay local. ``warmup_steps`` (W) of sync-SGD
  first (the gradients all-reduced every step) make it post-local SGD.
- ``diloco`` (Douillard et al. 2023): H inner steps (momentum SGD or AdamW, whose state is kept
  across rounds), then the outer gradient ``delta = theta_outer - x_i`` is all-reduced (its mean is
  ``theta_outer - mean_i x_i``) and an outer SGD with Nesterov momentum moves ``theta_outer``
  (:func:`~workbench.optim.rules.outer_sgd`); every worker restarts from ``theta_outer``.
- ``streaming-diloco`` (Douillard et al. 2025): the parameters in F fragments
  (:mod:`workbench.optim.fragments`) that sync on a staggered schedule, one every H/F steps; a
  fragment's outer gradient is taken when its exchange starts, travels (in ``outer_wire_dtype``)
  while ``sync_delay`` (tau) more inner steps run, and the outer step it yields is mixed into the
  local weights by ``fragment_alpha`` (:func:`~workbench.optim.rules.mix`).

The outer weights live in ``SyncAlgorithm.center`` (for ``local-sgd``: the last average) and are
what rank 0 evaluates and the run returns. At the last step every algorithm syncs once more (each
fragment), so the returned model holds every worker's last steps. Every exchange is a ``comm``
span (``average_weights``, ``outer_exchange``: the dashboard's timeline shows it on its own row when
it overlaps inner steps) through the rank's communicator (``ctx.communicator``:
:meth:`~workbench.comm.communicator.Communicator.mean`), every message counted at its wire
precision, and the state (inner optimizer, outer momentum, a fragment's exchange in flight) is
checkpointed, so a resumed run repeats the uninterrupted one bit for bit.
"""
from __future__ import annotations

import torch

from ..runtime.rank.context import Context, TrainingError
from ..telemetry import IN_FLIGHT_TID
from . import fragments as fragmenting
from . import rules
from .sync import SyncAlgorithm, Background


class InnerOptimizer:
    """The workers' optimizer between exchanges, on the flat weights in place: momentum SGD
    (:func:`~workbench.optim.rules.momentum_sgd_`, weight decay added to the gradient) or AdamW
    (:func:`~workbench.optim.rules.adamw_`, decoupled weight decay)."""

    def __init__(self, cfg, like: torch.Tensor) -> None:
        hyper = cfg.hyper
        self.kind, self.momentum, self.weight_decay = cfg.inner_optimizer, hyper.momentum, cfg.weight_decay
        self.v = torch.zeros_like(like)
        self.m = torch.zeros_like(like) if self.kind == "adamw" else None
        self.t = 0
        self.scratch = torch.empty_like(like)  # momentum SGD's lr * g; AdamW's first temporary
        self.scratch2 = torch.empty_like(like) if self.kind == "adamw" else None  # AdamW's second

    def step(self, x: torch.Tensor, grad: torch.Tensor, lr: float) -> None:
        """One step at learning rate ``lr`` (the run's schedule: :meth:`Context.lr`), in place
        (:func:`~workbench.optim.rules.momentum_sgd_`, one scratch tensor kept;
        :func:`~workbench.optim.rules.adamw_`, two)."""
        self.t += 1
        if self.kind == "adamw":
            rules.adamw_(x, self.m, self.v, grad, self.t, lr, self.weight_decay, self.scratch, self.scratch2)
            return
        if self.weight_decay:
            grad = torch.mul(x, self.weight_decay, out=self.scratch).add_(grad)  # grad + wd * x
        rules.momentum_sgd_(x, self.v, grad, lr, self.momentum, self.scratch)

    def state(self) -> dict:
        return {"inner_v": self.v.clone(), "inner_t": self.t,
                **({"inner_m": self.m.clone()} if self.m is not None else {})}

    def restore(self, state: dict) -> None:
        self.v.copy_(state["inner_v"])
        self.t = int(state["inner_t"])
        if self.m is not None:
            self.m.copy_(state["inner_m"])


class PeriodicAlgorithm(SyncAlgorithm):
    """The family's shared parts: the inner optimizer, the sync-SGD warm-up, when to sync, and the
    outer weights (``center``) that are evaluated and returned."""

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.inner = InnerOptimizer(ctx.cfg, ctx.flat.data)
        self.outer_buf = torch.zeros_like(ctx.flat.data)  # the outer SGD's momentum (DiLoCo family)

    def final_weights(self) -> torch.Tensor:
        return self.center

    def state(self, step: int) -> dict:
        return {**super().state(step), **self.inner.state(), "outer_buf": self.outer_buf.clone()}

    def restore(self, state: dict) -> None:
        super().restore(state)
        self.inner.restore(state)
        self.outer_buf.copy_(state["outer_buf"])

    def warmup_step(self, step: int) -> None:
        """A sync-SGD step: the mean gradient (all-reduced), then the inner optimizer; every rank
        ends with the same weights, which are the outer weights too."""
        ctx = self.ctx
        ctx.gradient(step)
        with ctx.span("reduce_gradients", "comm"):
            ctx.communicator.allreduce(ctx.flat.grad)
        with ctx.span("update", "compute"):
            self.inner.step(ctx.flat.data, ctx.flat.grad / ctx.size, ctx.lr(step))
            self.center.copy_(ctx.flat.data)

    def local_step(self, step: int) -> None:
        ctx = self.ctx
        ctx.gradient(step)
        with ctx.span("update", "compute"):
            self.inner.step(ctx.flat.data, ctx.flat.grad, ctx.lr(step))

    def sync_due(self, done: int) -> bool:
        """After the warm-up: every ``sync_every`` steps, and at the last step."""
        cfg = self.ctx.cfg
        warm = cfg.warmup_steps
        return done > warm and ((done - warm) % cfg.sync_every == 0 or done == self.ctx.steps)

    def stop_point(self, done: int) -> bool:
        """During the warm-up every :data:`STOP_EVERY` steps; after it, only where the workers sync
        (between syncs they run free: no collective there)."""
        return super().stop_point(done) if done <= self.ctx.cfg.warmup_steps else self.sync_due(done)

    def step(self, step: int) -> None:
        if step < self.ctx.cfg.warmup_steps:
            self.warmup_step(step)
            return
        self.local_step(step)
        self.after_local_step(step + 1)

    def after_local_step(self, done: int) -> None:
        raise NotImplementedError

    def outer_update(self, start: int, stop: int, mean_delta: torch.Tensor, alpha: float) -> None:
        """The outer SGD step on ``center[start:stop]`` from the mean outer gradient, then the
        local weights of that range mixed with the new outer ones (``alpha = 0``: replaced)."""
        cfg, x = self.ctx.cfg, self.ctx.flat.data
        theta, scratch = self.center[start:stop], self.inner.scratch[start:stop]   # free between inner steps
        with self.ctx.span("outer_step", "compute"):
            rules.outer_sgd_(theta, self.outer_buf[start:stop], mean_delta, cfg.outer_lr, cfg.outer_momentum,
                             cfg.nesterov, scratch)
            if alpha:
                rules.mix_(x[start:stop], theta, alpha, scratch)
            else:
                x[start:stop].copy_(theta)


class LocalSGD(PeriodicAlgorithm):
    def after_local_step(self, done: int) -> None:
        if not self.sync_due(done):
            return
        ctx, x = self.ctx, self.ctx.flat.data
        with ctx.span("average_weights", "comm", step=done):
            ctx.communicator.mean(x)
        self.center.copy_(x)


class DiLoCo(PeriodicAlgorithm):
    def after_local_step(self, done: int) -> None:
        if not self.sync_due(done):
            return
        ctx, cfg = self.ctx, self.ctx.cfg
        delta = self.center - ctx.flat.data  # this worker's outer gradient
        with ctx.span("outer_exchange", "comm", step=done):
            ctx.communicator.mean(delta, wire_dtype=cfg.outer_wire_dtype)
        self.outer_update(0, len(delta), delta, 0.0)


class StreamingDiLoCo(PeriodicAlgorithm):
    """One fragment's exchange at a time may be in flight (``sync_delay < sync_every // fragments``,
    checked by RunConfig): ``pending`` is ``(fragment, apply_at, delta, thread)``; the exchange runs
    in a thread on a duplicate of the communicator, so it overlaps the inner steps (blocking MPI
    calls release the GIL) and never meets the main thread's collectives."""

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        cfg = ctx.cfg
        self.parts = fragmenting.partition(ctx.flat.bounds, cfg.fragments)
        self.pending = None
        self.outer = ctx.communicator  # what the outer exchanges travel on
        if cfg.sync_delay > 0 and ctx.size > 1:
            from mpi4py import MPI
            if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
                raise TrainingError(f"rank {ctx.rank}: streaming-diloco with sync_delay > 0 overlaps exchanges in a "
                                    f"thread and needs MPI_THREAD_MULTIPLE; this MPI granted level "
                                    f"{MPI.Query_thread()} (use sync_delay=0)")
            self.outer = ctx.communicator.dup()  # the main thread's collectives never meet the thread's

    def _fragment_bounds(self, fragment: int) -> list[tuple[int, int]]:
        start, _, tensors = self.parts[fragment]
        return [(a - start, b - start) for a, b in (self.ctx.flat.bounds[i] for i in tensors)]

    def start(self, fragment: int, done: int, overlap: bool) -> None:
        """Take the fragment's outer gradient now and start its exchange (in a thread when ``overlap``)."""
        ctx, cfg = self.ctx, self.ctx.cfg
        start, stop, _ = self.parts[fragment]
        delta = self.center[start:stop] - ctx.flat.data[start:stop]
        bounds = self._fragment_bounds(fragment)

        def send(**row) -> None:
            with ctx.span("outer_exchange", "comm", fragment=fragment, step=done, **row):
                self.outer.mean(delta, bounds, cfg.outer_wire_dtype)
        # beside the inner steps, the exchange is drawn on the rank's in-flight row (as sync-sgd's buckets)
        thread = Background(lambda: send(tid=IN_FLIGHT_TID)) if overlap else send()
        self.pending = (fragment, done + cfg.sync_delay, delta, thread)

    def finish(self) -> None:
        """Wait for the fragment in flight (deadline: the run's communication timeout), then its
        outer step and the mix into the local weights."""
        ctx, cfg = self.ctx, self.ctx.cfg
        fragment, _, delta, thread = self.pending
        if thread is not None:
            with ctx.span("join_outer_exchange", "wait", fragment=fragment):
                thread.join(cfg.comm_timeout, f"rank {ctx.rank}: fragment {fragment}'s outer exchange")
        start, stop, _ = self.parts[fragment]
        self.outer_update(start, stop, delta, cfg.fragment_alpha)
        self.pending = None

    def after_local_step(self, done: int) -> None:
        cfg = self.ctx.cfg
        last = done == self.ctx.steps
        if self.pending is not None and (done >= self.pending[1] or last):
            self.finish()
        if last:  # every fragment once more, at once: the returned outer model holds the last steps
            for fragment in range(cfg.fragments):
                self.start(fragment, done, overlap=False)
                self.finish()
            return
        for fragment in fragmenting.due(done, cfg.fragments, cfg.sync_every, cfg.warmup_steps):
            self.start(fragment, done, overlap=cfg.sync_delay > 0 and self.ctx.size > 1)
            if cfg.sync_delay == 0:
                self.finish()

    def state(self, step: int) -> dict:
        state = super().state(step)
        if self.pending is not None:  # the exchange's result belongs to the state: resume applies it
            fragment, apply_at, delta, thread = self.pending
            if thread is not None:
                thread.join(self.ctx.cfg.comm_timeout, f"rank {self.ctx.rank}: fragment {fragment}'s outer exchange")
                self.pending = (fragment, apply_at, delta, None)
            state.update(pending_fragment=fragment, pending_apply_at=apply_at, pending_delta=delta.clone())
        return state

    def restore(self, state: dict) -> None:
        super().restore(state)
        if "pending_fragment" in state:
            self.pending = (int(state["pending_fragment"]), int(state["pending_apply_at"]),
                            state["pending_delta"].clone(), None)
