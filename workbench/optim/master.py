"""Master-based algorithms: rank 0 holds the center (EASGD family) or the weights (SGD family)
and serves; ranks 1..N-1 train on their own shards. Every rank, the master too, is on the one loop
(:class:`~workbench.optim.trainer.Trainer`, ``lockstep = False``): it owns resume, checkpoints,
evaluation points, and the workers' cancel and last message. The workers step; the master's loop body
is its serving (:meth:`Master.loop`), counted in arrivals: its checkpoint after arrival n
(``checkpoint/async/rank0.pt``: the count, the weights, the velocity), its evaluation points and its
learning-rate schedule follow the arrivals.

How the master serves (the registry, :mod:`workbench.optim.registry`, names the class each
algorithm runs):
- :class:`Master` (``async-*``): one loop, ``Probe(ANY_SOURCE)``: each arrival is applied whole,
  in arrival order.
- :class:`RoundRobinMaster` (``easgd``, the original): the same, but strictly in rank order 1, 2,
  ..., N-1, 1, ...: worker i+1 waits for worker i.
- :class:`HogwildMaster` (``hogwild-*``): one thread per worker, all updating the same tensor with
  no lock; concurrent arrivals read-modify-write it at once and can lose each other's updates
  (the races are real).

Messages are buffer-based (numpy views of flat float32 tensors), sent and counted by the rank's
communicator (``ctx.communicator``, :class:`~workbench.comm.communicator.Communicator`): one per
exchange, or one per tensor with ``fusion_bytes=0``. EASGD workers overlap the exchange with the
gradient computation (``overlap=True``), as in the paper, except in the original round-robin scheme
(:class:`RoundRobinElasticWorker`).
"""
from __future__ import annotations

import itertools
import threading

import torch
from mpi4py import MPI

from ..runtime.rank.context import Context
from ..summary import planned_steps
from ..lr_schedules import scheduled_lr
from . import rules
from .trainer import TAG_DONE, Trainer

TAG_PUSH, TAG_REPLY = 11, 12
#: the error classes of an MPI call that involved a process that failed (ULFM; where the library has it)
#: (a library without it maps them to MPI_ERR_UNKNOWN, which says nothing of a failed process)
PROC_FAILED = {getattr(MPI, name) for name in ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING")
               if getattr(MPI, name, MPI.ERR_UNKNOWN) != MPI.ERR_UNKNOWN}


# -- workers --------------------------------------------------------------------------------

class ElasticWorker(Trainer):
    """EASGD-family worker: local steps, and every tau steps an elastic exchange with the master.

    The momentum variant (MEASGD: the definition's ``momentum``) takes the momentum steps."""

    lockstep = False
    #: whether the exchange may overlap the gradient computation (when ``cfg.overlap``)
    overlaps_exchange = True

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.center = torch.empty_like(ctx.flat.data)
        self.velocity = torch.zeros_like(ctx.flat.data)
        self.momentum = ctx.cfg.spec.momentum
        self.overlap = ctx.cfg.overlap and self.overlaps_exchange
        # the updates' model-sized temporaries, kept (the in-place rules: no fresh tensors a step)
        self.s1, self.s2 = torch.empty_like(ctx.flat.data), torch.empty_like(ctx.flat.data)

    def final_weights(self) -> torch.Tensor:
        return self.ctx.flat.data

    def state(self, step: int) -> dict:
        return {**super().state(step), "velocity": self.velocity.clone(), "center": self.center.clone()}

    def restore(self, state: dict) -> None:
        super().restore(state)
        self.velocity.copy_(state["velocity"])
        self.center.copy_(state["center"])

    def step(self, step: int) -> None:
        ctx, cfg = self.ctx, self.ctx.cfg
        x, g = ctx.flat.data, ctx.flat.grad
        if step % cfg.tau == 0:
            if self.overlap:  # send x, receive the center, while the gradient is computed
                with ctx.span("exchange_post", "comm", bytes=x.numel() * x.element_size()):
                    net = ctx.communicator
                    reqs = net.isend(x, 0, TAG_PUSH) + net.irecv(self.center, 0, TAG_REPLY)
                ctx.gradient(step)
                with ctx.span("exchange_wait", "comm"):
                    MPI.Request.Waitall(reqs)
            else:
                with ctx.span("exchange", "comm", bytes=x.numel() * x.element_size()):
                    ctx.communicator.send(x, 0, TAG_PUSH)
                    ctx.communicator.recv(self.center, 0, TAG_REPLY)
                ctx.gradient(step)
            with ctx.span("update", "compute"):
                if self.momentum:
                    rules.momentum_elastic_worker_(x, self.velocity, g, self.center, ctx.lr(step), cfg.hyper.rho,
                                                   cfg.hyper.momentum, self.s1, self.s2)
                else:
                    rules.elastic_worker_(x, g, self.center, ctx.lr(step), cfg.hyper.rho, self.s1, self.s2)
        else:
            ctx.gradient(step)
            with ctx.span("update", "compute"):
                if self.momentum:
                    rules.momentum_sgd_(x, self.velocity, g, ctx.lr(step), cfg.hyper.momentum, self.s1)
                else:
                    rules.sgd_(x, g, ctx.lr(step), self.s1)


class RoundRobinElasticWorker(ElasticWorker):
    """The original EASGD's worker: it waits for its turn at the master, computing nothing
    meanwhile (as in the paper: no overlap of the exchange with the gradient)."""

    overlaps_exchange = False


class GradientWorker(Trainer):
    """SGD-family worker (Downpour): push the gradient accumulated over tau steps, pull weights.
    A cancel drops the gradient accumulated since the last push."""

    lockstep = False

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.pushed, self.scratch = torch.zeros_like(ctx.flat.data), torch.empty_like(ctx.flat.data)

    def final_weights(self) -> torch.Tensor:
        return self.ctx.flat.data

    def state(self, step: int) -> dict:
        return {**super().state(step), "pushed": self.pushed.clone()}

    def restore(self, state: dict) -> None:
        super().restore(state)
        self.pushed.copy_(state["pushed"])

    def step(self, step: int) -> None:
        ctx, cfg = self.ctx, self.ctx.cfg
        x, g = ctx.flat.data, ctx.flat.grad
        ctx.gradient(step)
        self.pushed += g
        if (step + 1) % cfg.tau == 0 or step == ctx.steps - 1:
            with ctx.span("exchange", "comm", bytes=x.numel() * x.element_size()):
                ctx.communicator.send(self.pushed, 0, TAG_PUSH)
                ctx.communicator.recv(x, 0, TAG_REPLY)
            self.pushed.zero_()
        else:
            with ctx.span("update", "compute"):
                rules.sgd_(x, g, ctx.lr(step), self.scratch)  # local progress between pushes


# -- the master -----------------------------------------------------------------------------

class Master(Trainer):
    """Rank 0: holds ``weights`` (the center, or the weights) and applies arrivals, one at a time in
    arrival order. It is on the one loop (:class:`~workbench.optim.trainer.Trainer`: resume,
    checkpoints, evaluation points), counting arrivals (:attr:`unit`); its loop body serves
    (:meth:`loop`). Subclasses change only the order of serving (:attr:`round_robin`, :meth:`serve`)."""

    lockstep = False
    unit = "arrivals"
    #: serve the workers strictly in rank order (the original EASGD) instead of arrival order
    round_robin = False

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.weights = ctx.flat.data.clone()
        self.velocity = torch.zeros_like(self.weights)
        self.elastic = ctx.cfg.spec.elastic
        self.arrivals = itertools.count(1)  # next() is atomic under the GIL
        self.total_arrivals = self._expected_arrivals()
        self.eval_lock = threading.Lock()  # evaluation only; updates never take a lock
        self.checkpoint_lock = threading.Lock()  # one file writer at a time (hogwild threads)
        #: the workers whose process failed while it served (``min_ranks``: it serves on without them)
        self.lost: set[int] = set()
        self.last_arrival = 0  # the newest arrival's number (a lost worker's record says it)
        self._lost_lock = threading.Lock()

    def _expected_arrivals(self) -> int:
        cfg = self.ctx.cfg
        # after an elastic restart on fewer ranks, over the workers the run was planned on (its schedule as planned)
        workers = cfg.workers if cfg.planned_ranks is None else cfg.workers + cfg.planned_ranks - cfg.ranks
        steps = planned_steps(self.ctx.data.train_samples, workers, cfg.batch_size, cfg.epochs)
        return sum(-(-s // cfg.tau) for s in steps)  # exchanges per worker: ceil(steps / tau)

    def final_weights(self) -> torch.Tensor:
        return self.weights

    def state(self, n: int) -> dict:
        """What a checkpoint keeps after arrival ``n``: the count, the weights (under ``"state"``, as in
        every master's checkpoint so far) and the velocity."""
        return {"arrivals": n, "state": self.weights.clone(), "velocity": self.velocity.clone()}

    def restore(self, state: dict) -> None:
        """Take back :meth:`state`; the arrivals go on from its count."""
        self.weights.copy_(state["state"])
        self.velocity.copy_(state["velocity"])
        self.arrivals = itertools.count(state["arrivals"] + 1)

    def eval_fields(self, n: int) -> dict:
        return {}  # an arrival has no epoch; serve_one adds the arrival's learning rate

    def apply(self, payload: torch.Tensor, reply: torch.Tensor, lr: float) -> None:
        """Apply one arrival to ``weights`` in place at learning rate ``lr``, and fill ``reply`` for the
        worker. ``payload`` (this serving thread's receive buffer) is the update's scratch after."""
        cfg = self.ctx.cfg
        if self.elastic:  # the worker gets the center as it was before its own contribution
            reply.copy_(self.weights)
            rules.elastic_center_(self.weights, payload, lr, cfg.hyper.rho, payload)
        else:
            if cfg.hyper.momentum:
                rules.momentum_sgd_(self.weights, self.velocity, payload, lr, cfg.hyper.momentum, payload)
            else:
                rules.sgd_(self.weights, payload, lr, payload)
            reply.copy_(self.weights)

    def serve_one(self, source: int, payload: torch.Tensor, reply: torch.Tensor) -> None:
        ctx, cfg = self.ctx, self.ctx.cfg
        with ctx.span("receive", "comm", source=source):
            ctx.communicator.recv(payload, source, TAG_PUSH)
        n = self.last_arrival = next(self.arrivals)  # this arrival's number: the schedule follows the master's arrivals
        lr = scheduled_lr(ctx.base_lr, cfg.lr_schedule, n - 1, self.total_arrivals)
        with ctx.span("apply", "compute", source=source):
            self.apply(payload, reply, lr)
        with ctx.span("reply", "comm", dest=source):
            ctx.communicator.send(reply, source, TAG_REPLY)
        self.save_checkpoint(n)  # the loop's checkpoint and evaluation points, by arrivals
        self.evaluation_point(n, self.total_arrivals, lr=lr)

    def loop(self) -> None:
        """The master's loop body: it serves (:meth:`serve`) until every worker is done."""
        self.serve()

    def workers_lost(self, exc: MPI.Exception) -> set[int]:
        """After ``exc``, an MPI error while serving: the workers whose process failed, each recorded once (a
        ``lost`` record with the arrivals so far), when the run serves on without them (``min_ranks`` set, the
        library told of the failure: ULFM's ``MPI_ERR_PROC_FAILED``, and at least ``min_ranks`` ranks left).
        Raises ``exc`` for any other error, and :class:`~workbench.runtime.rank.context.TrainingError` when
        too few ranks are left."""
        ctx = self.ctx
        # a wait on several requests says MPI_ERR_IN_STATUS: whether a process failed, the failed group says
        if ctx.cfg.min_ranks is None or not PROC_FAILED or exc.Get_error_class() not in {*PROC_FAILED, MPI.ERR_IN_STATUS}:
            raise exc
        with self._lost_lock:
            ctx.comm.Ack_failed()
            group = ctx.comm.Get_failed()
            failed = set(MPI.Group.Translate_ranks(group, list(range(group.Get_size())), ctx.comm.Get_group()))
            if not failed:
                raise exc
            for rank in sorted(failed - self.lost):
                ctx.add_metric({"kind": "lost", "rank": rank, "t": ctx.now(), "arrivals": self.last_arrival})
            self.lost |= failed
        left = ctx.size - len(self.lost)
        if left < ctx.cfg.min_ranks:
            from ..runtime.rank.context import TrainingError
            raise TrainingError(f"workers {', '.join(map(str, sorted(self.lost)))} failed: {left} ranks are left, "
                                f"fewer than min_ranks {ctx.cfg.min_ranks}") from exc
        return failed


    def serve(self) -> None:
        """Serve every worker until each has said it is done: one loop, one arrival at a time."""
        ctx, round_robin = self.ctx, self.round_robin
        payload, reply = torch.empty_like(self.weights), torch.empty_like(self.weights)
        active = list(range(1, ctx.size))  # workers that have not said they are done
        status = MPI.Status()
        turn = 0  # round robin: index into active of the worker whose turn it is
        while active:
            turn %= len(active)
            source = active[turn] if round_robin else MPI.ANY_SOURCE
            try:
                with ctx.span("wait_for_worker", "wait"):
                    ctx.communicator.probe(source, status)
                source = status.Get_source()
                if status.Get_tag() == TAG_DONE:
                    ctx.communicator.recv_empty(source, TAG_DONE)
                    active.remove(source)  # the next worker slides into index `turn`
                    continue
                self.serve_one(source, payload, reply)
            except MPI.Exception as exc:  # a worker's process failed: serve on without it (or raise)
                active = [w for w in active if w not in self.workers_lost(exc)]
                continue
            turn += 1


class RoundRobinMaster(Master):
    """The original EASGD's master: serves the workers strictly in rank order 1, 2, ..., N-1, 1, ..."""

    round_robin = True


class HogwildMaster(Master):
    """One thread per worker, all updating ``weights`` with no lock (the races are real)."""

    def serve(self) -> None:
        ctx = self.ctx
        errors = []

        def serve_worker(worker: int) -> None:
            payload, reply = torch.empty_like(self.weights), torch.empty_like(self.weights)
            status = MPI.Status()
            try:
                while worker not in self.lost:
                    try:
                        with ctx.span("wait_for_worker", "wait", worker=worker):
                            ctx.communicator.probe(worker, status)
                        if status.Get_tag() == TAG_DONE:
                            ctx.communicator.recv_empty(worker, TAG_DONE)
                            return
                        self.serve_one(worker, payload, reply)  # no lock around the update
                    except MPI.Exception as exc:  # its process failed: this thread ends (or the error goes on)
                        self.workers_lost(exc)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
                errors.append(exc)

        threads = [threading.Thread(target=serve_worker, args=(w,), daemon=True, name=f"serve-{w}")
                   for w in range(1, ctx.size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
