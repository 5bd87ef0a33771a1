"""The ranks' side of D-PSGD (``dpsgd.py`` has its definition): a lock-step algorithm on the
workbench's public base for that family, :class:`workbench.optim.sync.SyncAlgorithm`, which owns
the loop (resume, evaluation points, checkpoints, cancel). The class writes ``step`` and
``final_weights``; it wraps its phases in ``ctx.span`` (the dashboard's timeline and communication
share) and sends through the rank's communicator, ``ctx.communicator``, which counts every message
(the run's bytes on the wire)."""
from __future__ import annotations

import torch
from mpi4py import MPI

from workbench.optim import rules
from workbench.optim.sync import SyncAlgorithm

LEFT_TAG, RIGHT_TAG = 11, 12


class DPSGDRank(SyncAlgorithm):
    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self.left, self.right = (ctx.rank - 1) % ctx.size, (ctx.rank + 1) % ctx.size
        self.from_left, self.from_right = torch.empty_like(ctx.flat.data), torch.empty_like(ctx.flat.data)
        self.sent = torch.empty_like(ctx.flat.data)  # what the neighbours read while this rank's x moves on

    def final_weights(self) -> torch.Tensor:
        return self.ctx.flat.data  # this rank's model: rank 0's is evaluated and checksummed

    def step(self, step: int) -> None:
        ctx, x = self.ctx, self.ctx.flat.data
        if ctx.size == 1:  # no neighbours: plain SGD
            ctx.gradient(step)
            with ctx.span("update", "compute"):
                rules.momentum_sgd_(x, self.velocity, ctx.flat.grad, ctx.lr(step), ctx.cfg.hyper.momentum,
                                    self.from_left)
            return
        self.sent.copy_(x)
        net = ctx.communicator  # sends and receives flat tensors; counts what it sends
        # to the right neighbour with RIGHT_TAG, from the left one with it (and the mirror): with two
        # ranks both neighbours are the same rank, and the tags keep the two messages apart
        requests = (net.isend(self.sent, self.right, RIGHT_TAG) + net.isend(self.sent, self.left, LEFT_TAG)
                    + net.irecv(self.from_left, self.left, RIGHT_TAG)
                    + net.irecv(self.from_right, self.right, LEFT_TAG))
        ctx.gradient(step)  # at x_i, while the weights travel
        with ctx.span("neighbour_exchange", "wait"):
            MPI.Request.Waitall(requests)
        with ctx.span("update", "compute"):
            x.add_(self.from_left).add_(self.from_right).div_(3)   # W x: the mean of the three models
            rules.momentum_sgd_(x, self.velocity, ctx.flat.grad, ctx.lr(step), ctx.cfg.hyper.momentum,
                                self.from_left)
