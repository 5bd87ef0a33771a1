"""The EASGD family's exchanges and their descendants', as :func:`workbench.netsim.predict.predict`
costs them: one exchange every ``tau`` (``sync_every``) steps, and what it leaves exposed.

- ``sync-easgd``: every ``tau`` steps one all-reduce of all weights (float32, in fusion buckets)
  overlapped with that step's forward + backward (``overlap``; else before them); the exchange step
  waits for the slowest rank's forward + backward (``skew_s``), the others do not wait.
- ``easgd`` (the original, round-robin master): rank 0 holds the center; each of the N-1 workers in
  turn sends its weights (``up``: ``latency + M / B``, M the model's bytes), the master applies them
  (``apply_s``) and sends the center back (``down``, a blocking send); the worker computes nothing
  meanwhile, so its exchange is ``up + apply_s + down``. While the master sends a reply, the next
  worker's weights come in on the link's other direction, as far as the connection carries bytes
  nobody has asked for yet (``AlphaBeta.socket_buffer``: TCP's socket buffers; 0, a transfer that
  waits for its receiver: the turn is the whole exchange), so a turn is ``down + apply_s +`` what of
  ``up`` is left, and at least ``up``. A round of N-1 turns takes ``P = max((N-1) turn, exchange + tau
  t)`` (``t``: a local step) and a worker spends ``P - tau t`` of it exchanging or waiting.
- ``local-sgd``: every H steps one all-reduce of the weights (float32, fusion buckets), blocking;
  ``diloco``: the same for the outer gradient in ``outer_wire_dtype``; ``streaming-diloco``: the
  parameters in ``fragments`` runs of whole tensors (:func:`workbench.optim.fragments.partition`),
  each exchanged once per H steps at its offset (:func:`workbench.optim.fragments.offset`) and
  overlapped with ``sync_delay`` local steps, so only what outlasts them is exposed. A step is
  ``local + exposed / H``; the final sync and the warm-up are outside the steady state.

**A shaped link's burst** (``AlphaBeta.burst``, the virtual cluster's token bucket): an exchange's
first bytes go at once, as many as the bucket holds when it starts: what it refilled at the link's
rate while the link was idle since the previous exchange (capped at its depth). Each model finds
the steady state in which the idle spell and the exchange it shortens agree (:func:`steady`). The
original EASGD's weights cross two buckets in turn, the worker's uplink and the master's downlink
port, and its reply the master's uplink and the worker's port: each transfer saves what the
emptier of its two holds, the master's (idle only between its turns).

Pure Python: no torch, no MPI.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from ..comm.buckets import bucket_bounds

#: the wire itemsize of the descendants' outer exchange
OUTER_ITEMSIZE = {"fp32": 4, "bf16": 2, "fp16": 2}
#: passes of :func:`steady` at most (each halves the distance to the fixed point where the
#: undamped map would oscillate; most exchanges settle in a few)
STEADY_PASSES = 60


@dataclass(frozen=True)
class Message:
    """One all-reduce (or point-to-point exchange) of a step: ``what`` (gradients, norms, chunks,
    decision, weights, exchange), its bucket, bytes in the message, bytes this rank sends, and
    its start and end (seconds from the step's start)."""

    what: str
    bucket: int
    nbytes: float
    sent: float
    start: float
    end: float


@dataclass(frozen=True)
class Exchange:
    """What one of the models below predicts: the mean ``step`` (seconds), the ``compute`` of a
    step, the messages of one exchange, the buckets, the workers and the steps per exchange."""

    step: float
    compute: float
    timeline: list[Message]
    buckets: int
    workers: int
    per: int


def back_to_back(messages: Sequence[tuple[str, int, float]], ranks: int, net, begin: float,
                 tokens: float) -> tuple[list[Message], float, float]:
    """All-reduces of ``messages`` (``(what, bucket, bytes)``) one after another from ``begin``, the
    first ``tokens`` bytes of the link's burst spent on them (``AlphaBeta.burst_saving``):
    ``(timeline, end, tokens left)``."""
    timeline = []
    for what, k, nbytes in messages:
        seconds, sent = net.allreduce(nbytes, ranks), net.wire_bytes(nbytes, ranks)
        if tokens > 0:
            saved, tokens = net.burst_saving(sent, tokens)
            seconds -= saved
        timeline.append(Message(what, k, nbytes, sent, begin, begin + seconds))
        begin += seconds
    return timeline, begin, tokens


def steady(exchange: Callable, idle: Callable, net, ranks: int):
    """The steady state of a periodic exchange on a link with a burst: ``exchange(tokens)`` (one
    bucket level per transfer it costs) gives a result whose ``[1]`` settles; ``idle(result)`` the
    seconds each transfer's link was idle before it. The steady levels are ``min(burst, idle x
    bandwidth)`` of the exchange they give: from full buckets (``None``), each pass moves the levels
    halfway to what the last exchange's idle spells refill (damped: a bucket that empties on a short
    period and fills on a long one would otherwise flip between the two), until the exchange settles.
    Without a burst (or one rank: no transfer), the one pass from full buckets is the answer."""
    burst = getattr(net, "burst", 0.0) if ranks > 1 else 0.0
    result, levels = exchange(None), None
    for _ in range(STEADY_PASSES if burst else 0):
        refill = [min(burst, max(spell, 0.0) * net.bandwidth) for spell in idle(result)]
        levels = refill if levels is None else [(a + b) / 2 for a, b in zip(levels, refill)]
        again = exchange(levels)
        if abs(_total(again[1]) - _total(result[1])) < 1e-12:
            return again
        result = again
    return result


def _total(value) -> float:
    return sum(value) if isinstance(value, (list, tuple)) else value


def bucket_level(tokens, i: int, net) -> float:
    """Transfer ``i``'s bucket: full on the first pass (``None``: the link's ``burst``, 0 without one),
    else ``tokens[i]``."""
    return getattr(net, "burst", 0.0) if tokens is None else tokens[i]


def sync_easgd(buckets, ranks: int, net, overlap: bool, tau: int, compute: float, update_s: float,
               skew_s: float) -> Exchange:
    """Sync EASGD: the weights' all-reduce (fusion buckets, fp32) every ``tau`` steps, hidden
    behind that step's forward + backward when ``overlap``."""
    messages = [("weights", k, (stop - start) * 4) for k, (start, stop, _) in enumerate(buckets)] if ranks > 1 else []

    def exchange_step(end: float) -> float:   # waits for the slowest rank's forward + backward
        return (max(compute + skew_s, end) if overlap else end + compute + skew_s) + update_s

    def exchange(tokens):
        timeline, end, _ = back_to_back(messages, ranks, net, 0.0, bucket_level(tokens, 0, net))
        return timeline, end

    def idle(result):   # from this exchange's end to the next one's start, tau steps later
        return [exchange_step(result[1]) + (tau - 1) * (compute + update_s) - result[1]]

    timeline, end = steady(exchange, idle, net, ranks)
    step = (exchange_step(end) + (tau - 1) * (compute + update_s)) / tau
    return Exchange(step, compute + update_s, timeline, len(buckets), ranks, tau)


def periodic(kind: str, bounds, ranks: int, net, fusion_bytes, every: int, compute: float, update_s: float,
             fragments: int, sync_delay: int, wire_dtype: str) -> Exchange:
    """Local SGD, DiLoCo, Streaming DiLoCo (``kind``: their definitions' exchange, average, outer or
    streaming): per ``every`` steps, each fragment's buckets all-reduced once at its offset, exposed
    beyond ``sync_delay`` local steps."""
    from ..optim.fragments import offset, partition
    item, local = OUTER_ITEMSIZE[wire_dtype], compute + update_s
    what = "weights" if kind == "average" else "outer gradient"
    parts, k = [], 0
    for start, _, tensors in partition(bounds, fragments) if ranks > 1 else []:
        cut = bucket_bounds([(bounds[i][0] - start, bounds[i][1] - start) for i in tensors], fusion_bytes, item)
        parts.append([(what, k + j, (b - a) * item) for j, (a, b, _) in enumerate(cut)])
        k += len(cut)
    # local steps from fragment f's start to fragment f + 1's (the last: to the first, H steps on)
    gaps = [(offset(f + 1, fragments, every) - offset(f, fragments, every)) % every or every
            for f in range(len(parts))]

    def exchange(tokens):
        timeline, busy, begin = [], [], 0.0
        for f, messages in enumerate(parts):
            sent, end, _ = back_to_back(messages, ranks, net, begin, bucket_level(tokens, f, net))
            timeline += sent
            busy.append(end - begin)
            begin = end
        return timeline, busy

    def idle(result):   # before fragment f: the gap after fragment f - 1, less its own exchange
        busy = result[1]
        spells = [gaps[f] * local + max(0.0, b - sync_delay * local) - b for f, b in enumerate(busy)]
        return spells[-1:] + spells[:-1]

    timeline, busy = steady(exchange, idle, net, ranks)
    exposed = sum(max(0.0, b - sync_delay * local) for b in busy)
    return Exchange(local + exposed / every, local, timeline, len(timeline), ranks, every)


def easgd(model_bytes: float, ranks: int, net, tau: int, local: float, apply_s: float) -> Exchange:
    """The original EASGD: a worker's view of the round-robin master (see the module's text)."""
    workers, buffered = ranks - 1, getattr(net, "socket_buffer", 0.0)

    def exchange(tokens):   # tokens: the weights' transfer's bucket, the reply's
        up = net.point_to_point(model_bytes) - net.burst_saving(model_bytes, bucket_level(tokens, 0, net))[0]
        down = net.point_to_point(model_bytes) - net.burst_saving(model_bytes, bucket_level(tokens, 1, net))[0]
        turn = max(down + apply_s + max(0.0, up - buffered / net.bandwidth), up)
        own = up + apply_s + down
        return (up, down, own), max(workers * turn, own + tau * local)

    def idle(result):   # the master's links, idle between its turns (a worker's idle longer)
        (up, down, _), period = result
        return [period / workers - up, period / workers - down]

    (_, _, own), period = steady(exchange, idle, net, ranks)
    timeline = [Message("exchange", 0, model_bytes, model_bytes, 0.0, own)]
    return Exchange(period / tau, local, timeline, 1, workers, tau)
