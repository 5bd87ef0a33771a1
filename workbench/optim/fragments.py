"""Streaming DiLoCo's fragments and when each one syncs: pure arithmetic on the parameter layout
(no torch), shared by the ranks (:mod:`workbench.optim.periodic`) and the predictor.

A fragment is a run of whole parameter tensors, in the model's order (Douillard et al. 2025 split
a transformer into groups of consecutive layers); the cuts balance the elements. Fragment ``f`` of
``F`` starts its exchange when ``(done - warmup) % H == offset(f)``, ``offset(f) = ((f + 1) * H // F)
% H``: each fragment once every ``H`` steps, the last one where DiLoCo would sync (so one fragment
is DiLoCo's schedule exactly), the others spread evenly before it.
"""
from __future__ import annotations

from typing import Sequence


def partition(bounds: Sequence[tuple[int, int]], fragments: int) -> list[tuple[int, int, range]]:
    """Split tensors (``(start, stop)`` element bounds, contiguous, in order) into ``fragments``
    runs of whole tensors of about equal size: ``[(start, stop, tensor indices), ...]``.

    Greedy on the cumulative size: fragment ``f`` ends at the first tensor boundary at or past
    ``(f + 1) / F`` of the elements, leaving at least one tensor to each later fragment."""
    n = len(bounds)
    if not 1 <= fragments <= n:
        raise ValueError(f"fragments must be in 1..{n} (the model's parameter tensors); got {fragments}")
    total = bounds[-1][1] - bounds[0][0]
    out, first = [], 0
    for f in range(fragments):
        last = first
        if f == fragments - 1:
            last = n - 1
        else:
            target = bounds[0][0] + total * (f + 1) / fragments
            while last < n - (fragments - f) and bounds[last][1] < target:
                last += 1
        out.append((bounds[first][0], bounds[last][1], range(first, last + 1)))
        first = last + 1
    return out


def offset(fragment: int, fragments: int, sync_every: int) -> int:
    """The step (mod ``sync_every``, counted after the warm-up) at which ``fragment`` starts its exchange."""
    return ((fragment + 1) * sync_every // fragments) % sync_every


def due(done: int, fragments: int, sync_every: int, warmup: int = 0) -> list[int]:
    """The fragments whose exchange starts once ``done`` steps are complete (none in the warm-up)."""
    if done <= warmup:
        return []
    phase = (done - warmup) % sync_every
    return [f for f in range(fragments) if offset(f, fragments, sync_every) == phase]
