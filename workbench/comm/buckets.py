"""Fusion buckets (GradientFlow's lazy all-reduce): how gradients are grouped into messages.

Pure (no torch, no MPI): the runtime's :class:`~workbench.comm.strategies.GradientReducer`, the
rank's :class:`~workbench.comm.communicator.Communicator` (its ``allreduce`` and ``mean``: Sync
EASGD's weights, the periodic family's averages) and the scale-out predictor
(:mod:`workbench.netsim.predict`) all cut their buckets with this one function, so the prediction
sends exactly the messages a run sends.
"""
from __future__ import annotations


def bucket_bounds(bounds: list[tuple[int, int]], fusion_bytes: int | None, itemsize: int = 4
                  ) -> list[tuple[int, int, tuple[int, ...]]]:
    """Cut parameters into buckets in backward order: ``(start, stop, params)`` per bucket.

    ``bounds`` are the parameters' ``(start, stop)`` element ranges in registration order.
    A bucket closes once it holds ``>= fusion_bytes`` bytes (``itemsize`` bytes per element):
    ``0`` gives one bucket per parameter, ``None`` one bucket for everything.
    """
    buckets, current, nbytes = [], [], 0
    for index in reversed(range(len(bounds))):
        current.append(index)
        nbytes += (bounds[index][1] - bounds[index][0]) * itemsize
        if fusion_bytes is not None and nbytes >= fusion_bytes:
            buckets.append(current)
            current, nbytes = [], 0
    if current:
        buckets.append(current)
    return [(min(bounds[i][0] for i in b), max(bounds[i][1] for i in b), tuple(b)) for b in buckets]
