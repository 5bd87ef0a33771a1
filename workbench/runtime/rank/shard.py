"""This rank's data: its shard of the training set (and the test set where it evaluates), the batches
it draws, the steps they make, and the learning rate over those steps."""
from __future__ import annotations

from ... import data as data_mod
from ...config import RunConfig
from ...lr_schedules import scheduled_lr
from ...summary import planned_steps


class Shard:
    """One rank's part of the data and the steps it takes.

    Attributes:
        worker_index: this rank's shard (None on a master, which trains on none).
        data: the rows this rank holds: its shard, and the test set on rank 0 only (the master, or
            the first worker of a synchronous run).
        batches: the shard's mini-batches (None on a master).
        steps_per_epoch: steps in one epoch (lock-step: as many as the smallest shard gives, on
            every rank; 0 on a master); after an elastic restart on fewer ranks, as the run planned them.
        steps: steps this worker plans, ``steps_per_epoch * epochs`` (0 on a master).
        base_lr: the learning-rate schedule's start (``RunConfig.hyper.lr``, computed once).
    """

    def __init__(self, cfg: RunConfig, rank: int) -> None:
        self.lr_schedule = cfg.lr_schedule
        self.base_lr = cfg.hyper.lr
        master = cfg.spec.master_based
        self.worker_index = (rank - 1 if rank > 0 else None) if master else rank
        self.data = data_mod.load(cfg.dataset, **cfg.data_sizes, seed=cfg.seed,
                                  shard=(self.worker_index, cfg.workers), test=rank == 0)
        self.batches, self.steps, self.steps_per_epoch = None, 0, 0
        if self.worker_index is not None:
            self.batches = data_mod.Batches(self.data, self.worker_index, cfg.workers, cfg.batch_size, cfg.seed)
            # an elastic restart on fewer ranks (``planned_ranks``) keeps the run's steps and epochs as planned: a
            # larger shard each, the same batch per rank, the same steps (its epochs count planned steps)
            workers = cfg.workers if cfg.planned_ranks is None else cfg.workers + cfg.planned_ranks - cfg.ranks
            index = min(self.worker_index, workers - 1)
            planned = planned_steps(self.data.train_samples, workers, cfg.batch_size, 1, cfg.spec.synchronous)
            self.steps_per_epoch = planned[index]
            self.steps = self.steps_per_epoch * cfg.epochs

    def epoch_of(self, step: int) -> float:
        """The (fractional) epoch a training step falls in (0 on a master)."""
        return step / self.steps_per_epoch if self.batches is not None else 0.0

    def lr(self, step: int) -> float:
        """The learning rate of this worker's ``step``: ``RunConfig.lr_schedule`` over its planned steps."""
        return scheduled_lr(self.base_lr, self.lr_schedule, step, self.steps)
