"""The one training loop of a rank: resume, the steps, evaluation points, checkpoints, cancel and
stop points, for every family; an algorithm supplies its step and exchange (:meth:`Trainer.step`),
the weights it returns (:meth:`Trainer.final_weights`) and what it keeps (:meth:`Trainer.state`,
:meth:`Trainer.restore`). A master-based run's master does not train: it serves
(:class:`workbench.optim.master.Master`).

How the ranks stay together is the one thing the families do differently, and it is said once
(:attr:`Trainer.lockstep`):

- **lock-step** (``lockstep = True``: :class:`~workbench.optim.sync.SyncAlgorithm` and the periodic
  family): every rank takes the same steps. After a step rank 0 evaluates at the evaluation points,
  every rank writes its part of the same checkpoint (a collective), and at the stop points
  (:meth:`stop_point`) the ranks agree whether the run was cancelled (rank 0 decides and broadcasts:
  they leave at the same step).
- **a master's worker** (``lockstep = False``): it exchanges with rank 0 only, so it looks at the stop
  request by itself before each step and writes its own checkpoint at the top of a step (no
  exchange is in flight there); the master evaluates; at the end the worker tells the master it is done.
"""
from __future__ import annotations

import torch

from ..runtime.rank import checkpoint
from ..runtime.rank.context import Context

#: the tag of a worker's last message to its master: it has no more exchanges
TAG_DONE = 13


class Trainer:
    """The loop (:meth:`run`); subclasses write :meth:`step` and :meth:`final_weights`, and
    :meth:`state`/:meth:`restore` for what they keep beyond the weights."""

    #: every rank steps together (see the module's text); False: a worker of a master
    lockstep = True
    #: lock-step: steps between two stop points, where the ranks agree whether the run was cancelled
    STOP_EVERY = 10

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.start_step = 0

    # -- what an algorithm writes ----------------------------------------------------------------
    def step(self, step: int) -> None:
        raise NotImplementedError

    def final_weights(self) -> torch.Tensor:
        raise NotImplementedError

    def state(self, step: int) -> dict:
        """What a checkpoint keeps after ``step`` steps (tensors cloned); ``"step"`` among it."""
        return {"step": step, "x": self.ctx.flat.data.clone()}

    def restore(self, state: dict) -> None:
        """Take back :meth:`state`; the loop goes on at ``state["step"]``."""
        self.ctx.flat.data.copy_(state["x"])
        self.start_step = state["step"]

    def stop_point(self, done: int) -> bool:
        """Lock-step: whether the ranks agree after step ``done`` whether to stop (a collective: the
        same answer on every rank): every :data:`STOP_EVERY` steps, whatever ``eval_every`` is."""
        return done % self.STOP_EVERY == 0

    # -- the loop ----------------------------------------------------------------------------------
    def run(self, resume_dir=None) -> torch.Tensor:
        ctx = self.ctx
        if resume_dir is not None:
            self._resume(resume_dir)
        for step in range(self.start_step, ctx.steps):
            if not self.lockstep and self._leave_before(step):
                break
            self.step(step)
            if self.lockstep and self._after(step + 1):
                break
        if not self.lockstep:
            ctx.communicator.send_empty(0, TAG_DONE)
        return self.final_weights()

    def _resume(self, resume_dir) -> None:
        ctx = self.ctx
        if self.lockstep:  # every rank's part of the same step
            self.restore(checkpoint.load(resume_dir, ctx.rank, ctx.size))
            return
        state = checkpoint.load_own(resume_dir, ctx.rank, ctx.size)
        if state is not None:  # a worker that had not reached its first checkpoint starts afresh
            self.restore(state)

    def _after(self, done: int) -> bool:
        """Lock-step, after step ``done``: evaluation, the collective checkpoint, the agreed stop."""
        ctx, cfg = self.ctx, self.ctx.cfg
        if ctx.rank == 0 and ctx.is_eval_point(done, ctx.steps):
            ctx.evaluate(self.final_weights(), step=done, epoch=ctx.epoch_of(done))
        if cfg.checkpoint_every and done % cfg.checkpoint_every == 0 and ctx.out_dir is not None:
            with ctx.span("checkpoint", "io", step=done):
                checkpoint.save(ctx.out_dir, done, self.state(done), ctx.comm)
        # every rank must leave at the same step, so rank 0 decides and broadcasts (a 1-byte Bcast)
        if self.stop_point(done) and done < ctx.steps and ctx.agree_to_stop():
            ctx.cancelled, ctx.steps_completed = True, done
            return True
        return False

    def _leave_before(self, step: int) -> bool:
        """A master's worker, before ``step``: the stop request looked at alone, then its own checkpoint."""
        ctx = self.ctx
        if ctx.stop_requested():  # between exchanges: no message is in flight here
            ctx.cancelled, ctx.steps_completed = True, step
            return True
        every = ctx.cfg.checkpoint_every
        if every and step and step % every == 0 and ctx.out_dir is not None:
            with ctx.span("checkpoint", "io", step=step):
                checkpoint.save_own(ctx.out_dir, ctx.rank, ctx.size, self.state(step))
        return False

