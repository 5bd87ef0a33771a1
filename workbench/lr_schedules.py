"""Learning-rate schedules over a run (``RunConfig.lr_schedule``): their names and the rate after a
number of steps. Pure (the standard library only): the configuration checks the names, every rank
computes the rate (:meth:`workbench.runtime.rank.context.Context.lr`, a master's arrivals in
:mod:`workbench.optim.master`).
"""
from __future__ import annotations

import math

#: learning-rate schedules over a run (``RunConfig.lr_schedule``; :func:`scheduled_lr`)
LR_SCHEDULES = ("constant", "cosine", "step")


def scheduled_lr(lr: float, schedule: str, done: int, total: int) -> float:
    """The learning rate after ``done`` of ``total`` steps (or a master's arrivals): ``constant``
    is ``lr`` itself; ``cosine`` is ``lr * (1 + cos(pi * done / total)) / 2`` (``lr`` at the first
    step, towards 0 at the last); ``step`` divides ``lr`` by 10 at half the run and again at three
    quarters (the schedule of He et al.'s ResNets, by share of the run rather than by epoch)."""
    if schedule == "constant" or total <= 0:
        return lr
    share = min(max(done / total, 0.0), 1.0)
    if schedule == "cosine":
        return lr * 0.5 * (1.0 + math.cos(math.pi * share))
    if schedule == "step":
        return lr * (0.01 if share >= 0.75 else 0.1 if share >= 0.5 else 1.0)
    raise ValueError(f"lr_schedule must be one of {', '.join(LR_SCHEDULES)}, got {schedule!r}")
