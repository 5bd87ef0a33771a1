"""The one training loop of a rank: resume, the steps, evaluation points, checkpoints, cancel and
stop points, for every family; an algorithm supplies its step and exchange (:meth:`Trainer.step`),
the weights it returns (:meth:`Trainer.final_weights`) and what it keeps (:meth:`Trainer.state`,
:meth:`Trainer.restore`). A master-based run's master is on the same loop but does not step: its
loop body is its serving (:meth:`Trainer.loop`; :class:`workbench.optim.master.Master`), and it counts
arrivals where the others count steps (:attr:`Trainer.unit`).

:meth:`Trainer.run` is every rank's one entry: it resumes (:meth:`Trainer.restore` of the newest
checkpoint), runs the loop body and returns the weights. One place decides when a checkpoint is due
and writes it (:meth:`Trainer.save_checkpoint`), and one when to evaluate
(:meth:`Trainer.evaluation_point`). How the ranks stay together is the one thing the families do
differently, and it is said once (:attr:`Trainer.lockstep`):

- **lock-step** (``lockstep = True``: :class:`~workbench.optim.sync.SyncAlgorithm` and the periodic
  family): every rank takes the same steps. After a step rank 0 evaluates at the evaluation points,
  every rank writes its part of the same checkpoint (a collective), and at the stop points
  (:meth:`stop_point`) the ranks agree whether the run was cancelled (rank 0 decides and broadcasts:
  they leave at the same step).
- **a master-based run** (``lockstep = False``): a worker exchanges with rank 0 only, so it looks at
  the stop request by itself before each step and writes its own checkpoint at the top of a step (no
  exchange is in flight there); at the end it tells the master it is done. The master serves until
  every worker is done; after an arrival it writes its own checkpoint and evaluates at the evaluation
  points, under its locks (:attr:`Trainer.checkpoint_lock`, :attr:`Trainer.eval_lock`: a hogwild
  master serves on several threads at once).
"""
from __future__ import annotations

from contextlib import nullcontext

import torch

from ..runtime.rank import checkpoint
from ..runtime.rank.context import Context

#: the tag of a worker's last message to its master: it has no more exchanges
TAG_DONE = 13


class Trainer:
    """The loop (:meth:`run`); subclasses write :meth:`step` and :meth:`final_weights`, and
    :meth:`state`/:meth:`restore` for what they keep beyond the weights (a master: :meth:`loop`)."""

    #: every rank steps together (see the module's text); False: a rank of a master-based run
    lockstep = True
    #: lock-step: steps between two stop points, where the ranks agree whether the run was cancelled
    STOP_EVERY = 10
    #: what the loop counts (a checkpoint's span and an evaluation's record name the count so): steps;
    #: a master counts arrivals
    unit = "step"

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.start_step = 0
        #: held around writing a checkpoint and around an evaluation (none here; a master's are locks)
        self.checkpoint_lock = self.eval_lock = nullcontext()

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

    def eval_fields(self, n: int) -> dict:
        """What an evaluation after step ``n`` is recorded with besides the step: its epoch."""
        return {"epoch": self.ctx.epoch_of(n)}

    # -- the loop ----------------------------------------------------------------------------------
    def run(self, resume_dir=None) -> torch.Tensor:
        """Every rank's one entry: resume from ``resume_dir``'s newest checkpoint (if given), the loop
        body (:meth:`loop`), and the weights the rank returns (:meth:`final_weights`)."""
        if resume_dir is not None:
            self._resume(resume_dir)
        self.loop()
        return self.final_weights()

    def loop(self) -> None:
        """The steps from :attr:`start_step` (a master serves instead: it overrides this)."""
        ctx = self.ctx
        for step in range(self.start_step, ctx.steps):
            if not self.lockstep and self._leave_before(step):
                break
            self.step(step)
            if self.lockstep and self._after(step + 1):
                break
        if not self.lockstep:
            ctx.communicator.send_empty(0, TAG_DONE)

    def _resume(self, resume_dir) -> None:
        """Take back this rank's part of ``resume_dir``'s newest checkpoint, and say where it goes on: a
        ``resume`` record with the count (:attr:`unit`) it continues after, 0 for a rank that had not reached
        its first checkpoint (it starts afresh). Whoever follows the run drops what this rank recorded after
        that point in the incarnation that failed (:class:`~workbench.runtime.client.batch_run.BatchRun`)."""
        ctx = self.ctx
        if self.lockstep:  # every rank's part of the same step
            state = checkpoint.load(resume_dir, ctx.rank, ctx.size, resize=ctx.cfg.min_ranks is not None)
        else:
            state = checkpoint.load_own(resume_dir, ctx.rank, ctx.size, resize=ctx.cfg.min_ranks is not None)
        if state is not None:
            self.restore(state)
        ctx.add_metric({"kind": "resume", "rank": ctx.rank, self.unit: state.get(self.unit, 0) if state is not None else 0,
                        "t": ctx.now()})

    def save_checkpoint(self, n: int) -> None:
        """After ``n`` (steps; a master: arrivals), when ``checkpoint_every`` divides it (``n > 0``, a run
        directory): :meth:`state` written in an ``io`` span under :attr:`checkpoint_lock`; lock-step, every
        rank's part of the same checkpoint (a collective), else this rank's own (``save_own``)."""
        ctx, every = self.ctx, self.ctx.cfg.checkpoint_every
        if not (every and n and n % every == 0 and ctx.out_dir is not None):
            return
        ctx.flush()  # the records up to the checkpoint are out before it: a restart from it loses none
        with self.checkpoint_lock, ctx.span("checkpoint", "io", **{self.unit: n}):
            if self.lockstep:
                checkpoint.save(ctx.out_dir, n, self.state(n), ctx.comm)
            else:
                checkpoint.save_own(ctx.out_dir, ctx.rank, ctx.size, self.state(n))

    def evaluation_point(self, n: int, total: int, **where) -> None:
        """After ``n`` of ``total`` (steps; a master: arrivals), at the evaluation points: the weights
        (:meth:`final_weights`) evaluated under :attr:`eval_lock`, recorded with the count,
        :meth:`eval_fields` and ``where``. The evaluating rank calls it (lock-step: rank 0; the master)."""
        ctx = self.ctx
        if ctx.is_eval_point(n, total):
            with self.eval_lock:
                ctx.evaluate(self.final_weights(), **{self.unit: n}, **self.eval_fields(n), **where)

    def _after(self, done: int) -> bool:
        """Lock-step, after step ``done``: evaluation, the collective checkpoint, the agreed stop."""
        ctx = self.ctx
        if ctx.rank == 0:
            self.evaluation_point(done, ctx.steps)
        self.save_checkpoint(done)
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
        self.save_checkpoint(step)
        return False
