"""DeepPool's GPU multiplexing (Park et al., MLSys'22; docs/papers.md, "4. DeepPool") as a discrete-event simulation.

A foreground burst-parallel :class:`~workbench.burst.plan.BurstPlan` leaves GPUs idle between its
bursts; a background data-parallel job, cut into small pieces, fills those idle windows, and the
foreground may be slowed by at most ``slowdown``::

    from workbench.burst.multiplex import simulate
    from workbench.burst.pictures import fill_figure
    r = simulate(plan, background_piece_ms=16.9, piece_ms=0.5, slowdown=1.1, baseline=dp_plan)
    r.ratio, r.foreground_throughput, r.background_throughput; fill_figure(r).show()

**Model.** Every GPU of the cluster (``range(max(plan.gpus, plan.gpus_used))``) repeats the plan's
busy intervals (one span per layer; overlapping layers merged) every ``iteration_ms``; between two
spans (and across the iteration boundary) lies an idle *window*, possibly of length 0 (a layer
boundary, where the GPU may still idle if the foreground is delayed). ``iterations`` iterations are
simulated, then the foreground's next iteration starts at ``iterations * iteration_ms`` (planned):
that start closes every GPU's last window. Events (a heap of foreground window opens / closes in
*planned* time, and a heap of background piece ends in wall time) are handled in time order.

- **Foreground delay is global.** All foreground events happen at ``planned + D`` wall time; ``D``,
  the accumulated delay, grows when a GPU is not ready at its next foreground interval. One
  delayed interval delays all later ones on all GPUs (layers are a chain joined by activation
  transfers and all-reduces: conservative for plans whose branches run side by side). A GPU
  stalled inside a span (waiting for another GPU) runs no background work; a GPU at a layer
  boundary (zero-length window) may.
- **Non-preemptive pieces.** A background step of ``background_piece_ms`` (one per-GPU step of a
  data-parallel job) is cut into ``n = ceil(step / piece_ms)`` equal pieces of ``step / n`` ms. A
  piece starts only while its GPU is in an idle window (window open, foreground not yet restarted)
  and, once started, runs to its end like a CUDA kernel; a foreground interval whose GPU is still
  running a piece starts when the piece (and the switch back) ends, delaying the foreground.
- **Switching** costs ``switch_ms`` when a GPU goes from foreground to background work (before the
  first piece of a window) and back (after its last piece). Default 0: the paper runs both jobs in
  one process, foreground kernels on high-priority CUDA streams and background work in small pieces
  on low-priority ones (docs/papers.md, "4. DeepPool"), so there is no context switch to pay; what it does pay is
  non-preemption, bounded by the piece size *(inferred: the digest names no switch cost)*.

**Admission rule** (exact). A piece of ``q`` ms may start on GPU ``g`` at wall time ``t`` (``t`` is now,
plus ``switch_ms`` if it is the window's first piece) iff ``g`` is in an idle window whose closing
foreground interval starts at planned time ``c``, no piece runs on ``g``, ``t < c + D`` (the GPU is
idle: a piece starts inside the window, never when the foreground is due), and either
``t + q + switch_ms <= c + D`` (it fits), or its overrun ``o = t + q + switch_ms - (c + D)`` satisfies
``realised[k] + sum(pending) + o <= A``, where ``k`` is the iteration that the interval at ``c``
belongs to (one starting exactly at an iteration boundary closes the previous iteration),
``realised[k]`` the delay already charged to it, ``pending`` the predicted overruns
``last_piece_end + switch_ms - (c_h + D)`` of the other GPUs ``h`` whose window closes in iteration
``k``, and ``A <= (slowdown - 1) * iteration_ms`` the overrun allowance. A realised delay is at most
the pending overrun it comes from, so every iteration takes at most ``slowdown * iteration_ms``.
When ``D`` grows, idle GPUs retry (their windows grew).

**The allowance.** Greedy admission with ``A = (slowdown - 1) * iteration_ms`` is not monotone:
spending the allowance on one overrun stalls the GPUs inside foreground spans and may block a
better one later, so a looser bound could lower background throughput. The allowance is therefore
chosen: every distinct schedule for ``A`` on the grid ``j * ALLOWANCE_GRID * iteration_ms <=
(slowdown - 1) * iteration_ms`` is simulated (grid points between two decision thresholds give the
same schedule, so only one per threshold runs; ``schedules`` counts them, at most ``MAX_RUNS``) and
the one with the most background samples/s (``objective="background"``) or cluster samples/s
(``"total"``) is kept, the smallest ``A`` on ties. A looser bound only adds candidates, so the
chosen objective never falls as ``slowdown`` grows; ``allowance_ms`` reports ``A``.

**Background job and throughput.** Each GPU's background work is an independent stream of steps
of ``background_batch`` samples (default: the foreground's per-GPU batch, ``batch / gpus``); the
background job's gradient sync is *not* charged (assumed hidden in its own idle time or done
asynchronously: an optimistic bound). Background throughput = samples of the pieces run
(``background_batch / n`` per piece, partial steps pro rata; ``background_steps`` counts whole
ones) / wall time. Total = foreground + background samples/s (the two jobs' samples summed as
they are). ``ratio`` = total / ``baseline`` throughput: a :class:`BurstPlan` (plain data parallelism of
the foreground job: ``batch / iteration_ms``), samples/s, or None (the foreground plan unmultiplexed).

Pure Python: no torch, no MPI (plotly only in :func:`~workbench.burst.pictures.fill_figure`).
"""
from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass

from ..checks import integer
from .graph import BurstError
from .plan import BurstPlan

OPEN, CLOSE = 0, 1
#: the overrun allowances tried are multiples of this fraction of the planned iteration
ALLOWANCE_GRID = 0.005
#: most schedules one call simulates while choosing the allowance
MAX_RUNS = 2000
#: what the allowance is chosen to maximise
OBJECTIVES = ("background", "total")


@dataclass(frozen=True)
class Piece:
    """One background piece on ``gpu`` from ``start_ms`` to ``end_ms`` (wall); ``window`` is its
    idle window in planned time; ``overrun_ms`` the foreground delay predicted when it was admitted
    (0: it fits), charged to foreground iteration ``iteration``."""

    gpu: int
    start_ms: float
    end_ms: float
    iteration: int
    overrun_ms: float
    window: tuple[float, float]


@dataclass(frozen=True)
class Span:
    """The foreground on ``gpu`` from ``start_ms`` to ``end_ms`` (wall) running ``layers`` (longer
    than planned when a delay elsewhere stalled it)."""

    gpu: int
    start_ms: float
    end_ms: float
    layers: tuple[int, ...]


@dataclass
class MultiplexResult:
    """What :func:`simulate` returns (times ms, throughputs samples/s)."""

    gpus: int
    iterations: int
    planned_iteration_ms: float
    iteration_ms: float  # mean achieved foreground iteration
    iteration_times_ms: list[float]
    slowdown: float  # achieved: the slowest iteration / planned
    slowdown_bound: float
    allowance_ms: float  # the per-iteration overrun allowance chosen (<= (slowdown_bound - 1) * planned)
    schedules: int  # allowances simulated to choose it
    wall_ms: float
    foreground_throughput: float
    background_throughput: float
    total_throughput: float
    baseline_throughput: float
    ratio: float
    background_step_ms: float
    piece_size_ms: float
    pieces_per_step: int
    background_batch: float
    background_rate: float  # one GPU running only the background job
    switch_ms: float
    utilisation_before: dict[int, float]
    utilisation_after: dict[int, float]
    background_steps: dict[int, int]
    pieces: list[Piece]
    foreground: list[Span]

    def summary(self) -> str:
        mean = lambda d: sum(d.values()) / max(1, len(d))  # noqa: E731
        return (f"foreground {self.iteration_ms:.3f} ms/iter (planned {self.planned_iteration_ms:.3f}, "
                f"slowdown {self.slowdown:.3f} <= {self.slowdown_bound:g}), {self.foreground_throughput:.1f} "
                f"samples/s; background {self.background_throughput:.1f} samples/s ({len(self.pieces)} pieces "
                f"of {self.piece_size_ms:.3f} ms); total {self.total_throughput:.1f} vs baseline "
                f"{self.baseline_throughput:.1f} = {self.ratio:.3f}x; GPU utilisation "
                f"{mean(self.utilisation_before):.1%} -> {mean(self.utilisation_after):.1%}")


def _number(name: str, value, low: float = 0.0, strict: bool = True) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise BurstError(f"{name} must be a number; got {value!r}") from None
    if math.isnan(v) or math.isinf(v) or (v <= low if strict else v < low):
        raise BurstError(f"{name} must be {'>' if strict else '>='} {low:g}; got {value!r}")
    return v


def busy_spans(plan: BurstPlan) -> dict[int, list[tuple[float, float, tuple[int, ...]]]]:
    """GPU -> its foreground spans ``(start, end, layers)`` in one iteration: one per layer
    (transfer to sync), overlapping ones merged, sorted; checks the plan's times."""
    T = _number("foreground.iteration_ms", plan.iteration_ms)
    for l in plan.layers:
        for name in ("start_ms", "transfer_ms", "compute_ms", "sync_ms"):
            _number(f"foreground layer {l.id} {name}", getattr(l, name), strict=False)
    per: dict[int, dict[int, tuple[float, float]]] = {g: {} for g in range(max(plan.gpus, plan.gpus_used))}
    for b in plan.timeline():
        if b.end_ms > T * (1 + 1e-9):
            raise BurstError(f"foreground layer {b.layer} ends at {b.end_ms:g} ms, after iteration_ms {T:g}")
        s, e = per.setdefault(b.gpu, {}).get(b.layer, (b.start_ms, b.end_ms))
        per[b.gpu][b.layer] = (min(s, b.start_ms), max(e, b.end_ms))
    out = {}
    for g, layers in sorted(per.items()):
        spans: list[tuple[float, float, tuple[int, ...]]] = []
        for lid, (s, e) in sorted(layers.items(), key=lambda kv: kv[1]):
            if spans and s < spans[-1][1]:
                ps, pe, pl = spans[-1]
                spans[-1] = (ps, max(pe, e), pl + (lid,))
            else:
                spans.append((s, e, (lid,)))
        out[g] = spans
    return out


class _GPU:
    __slots__ = ("mode", "win", "running", "ran", "last_end", "done", "fg_since", "fg_layers")

    def __init__(self) -> None:
        self.mode, self.win, self.running, self.ran, self.last_end, self.done = "fg", -1, False, False, 0.0, 0
        self.fg_since: float | None = None
        self.fg_layers: tuple[int, ...] = ()


class _Sim:
    def __init__(self, spans, T, K, q, s, budget) -> None:
        #: the planned iteration, iterations, a piece's length, a switch's cost, the overrun allowance (ms)
        self.period, self.iterations, self.piece, self.switch, self.budget = T, K, q, s, budget
        self.tol = 1e-9 * max(1.0, T)
        self.delay, self.realised, self.next_break = 0.0, [0.0] * K, math.inf  # delay: the foreground's so far
        self.pieces: list[Piece] = []
        self.foreground: list[Span] = []
        self.seq = itertools.count()
        self.fg: list = []  # (planned, OPEN|CLOSE, gpu, window)
        self.bg: list = []  # (wall end, seq, gpu)
        self.wins: dict[int, list[tuple[float, float, tuple[int, ...] | None, int]]] = {}
        self.gpus = {g: _GPU() for g in spans}
        for g, sp in spans.items():
            ws: list = []
            t = None  # end of the previous span
            for k in range(K):
                for a, b, lids in sp:
                    a, b = a + k * T, b + k * T
                    if t is None and a <= self.tol:
                        self.gpus[g].fg_since, self.gpus[g].fg_layers = 0.0, lids
                    else:
                        ws.append((0.0 if t is None else t, a, lids))
                    t = b
            ws.append((0.0 if t is None else t, K * T, None))  # closed by the next iteration's start
            # (open, close, span after it, iteration its close belongs to); rounding: none closes before it opens
            ws = [(po, max(po, pc), after, self.iteration_of(max(po, pc))) for po, pc, after in ws]
            self.wins[g] = ws
            for i, (po, pc, _, _) in enumerate(ws):
                self.fg += [(po, OPEN, g, i), (pc, CLOSE, g, i)]
        heapq.heapify(self.fg)

    def iteration_of(self, planned: float) -> int:
        return min(self.iterations - 1, max(0, math.ceil(planned / self.period - 1e-9) - 1))

    def pending(self, g: int) -> float:
        st = self.gpus[g]
        if st.mode != "window" or not st.ran:
            return 0.0
        return max(0.0, st.last_end + self.switch - (self.wins[g][st.win][1] + self.delay))

    def try_start(self, g: int, now: float) -> None:
        st = self.gpus[g]
        if st.mode != "window" or st.running:
            return
        po, pc, _, k = self.wins[g][st.win]
        start = now if st.ran else now + self.switch
        if start >= pc + self.delay - self.tol:  # the foreground is due: no idle time left to start in
            return
        end = start + self.piece
        over = end + self.switch - (pc + self.delay)
        if over > self.tol:
            others = sum(self.pending(h) for h, o in self.gpus.items()
                         if h != g and o.ran and o.mode == "window" and self.wins[h][o.win][3] == k)
            if self.realised[k] + others + over > self.budget + self.tol:
                self.next_break = min(self.next_break, self.realised[k] + others + over)
                return
        st.running, st.ran, st.last_end = True, True, end
        self.pieces.append(Piece(g, start, end, k, max(0.0, over), (po, pc)))
        heapq.heappush(self.bg, (end, next(self.seq), g))

    def run(self) -> None:
        while self.fg:
            if self.bg and self.bg[0][0] <= self.fg[0][0] + self.delay + self.tol:  # piece ends first on ties
                end, _, g = heapq.heappop(self.bg)
                st = self.gpus[g]
                st.running, st.done = False, st.done + 1
                self.try_start(g, end)
                continue
            p, kind, g, i = self.fg[0]
            now = p + self.delay
            if kind == OPEN:
                heapq.heappop(self.fg)
                st = self.gpus[g]
                if st.fg_since is not None:
                    self.foreground.append(Span(g, st.fg_since, now, st.fg_layers))
                st.mode, st.win, st.ran, st.fg_since = "window", i, False, None
                self.try_start(g, now)
                continue
            batch = []
            while self.fg and self.fg[0][1] == CLOSE and self.fg[0][0] <= p + self.tol:
                batch.append(heapq.heappop(self.fg))
            ready = max((self.gpus[h].last_end + self.switch for _, _, h, _ in batch if self.gpus[h].ran), default=now)
            if ready - now > self.tol:  # a GPU still runs (or switches back from) background work
                self.delay += ready - now
                self.realised[self.iteration_of(p)] += ready - now
                for item in batch:
                    heapq.heappush(self.fg, item)
                for h in self.gpus:  # every idle window just grew
                    self.try_start(h, now)
                continue
            for _, _, h, j in batch:
                st = self.gpus[h]
                after = self.wins[h][j][2]
                st.mode = "done" if after is None else "fg"
                st.fg_since, st.fg_layers = (None, ()) if after is None else (now, after)
        assert not self.bg


def background_step_ms(model, table, batch: int) -> float:
    """One GPU's data-parallel-free training step of ``model`` at ``batch`` samples, ms: the
    table's layer times summed (layers without rows cost nothing, as in ``CostModel.paper()``)."""
    return sum(row.avg_us for layer in model.layers if (row := table.get(layer, batch)) is not None) / 1000


def _best_schedule(spans, T: float, K: int, q: float, s: float, budget: float, samples: tuple, objective: str):
    """Simulate the distinct schedules of the allowances ``j * grid <= budget`` (``grid``: the
    :data:`ALLOWANCE_GRID` share of ``T``); the best for ``objective``, its allowance and the number
    of schedules run. ``samples``: (background samples a step, pieces a step, foreground batch)."""
    bgb, n, batch = samples
    grid, j, best, runs = ALLOWANCE_GRID * T, 0, None, 0
    while True:
        run = _Sim(spans, T, K, q, s, j * grid)
        run.run()
        runs += 1
        work = sum(st.done for st in run.gpus.values()) * bgb / n
        score = work / (K * T + run.delay) + (K * batch / (K * T + run.delay) if objective == "total" else 0.0)
        if best is None or score > best[0] * (1 + 1e-12):
            best = (score, run, j * grid)
        if run.next_break > budget + run.tol or runs >= MAX_RUNS:
            break
        j = max(j + 1, math.ceil(run.next_break / grid - 1e-9))  # the same schedule up to next_break
        if j * grid > budget + run.tol:
            break
    return best[1], best[2], runs


def simulate(foreground: BurstPlan, background_piece_ms: float, piece_ms: float = 0.5, slowdown: float = 1.1,
             iterations: int = 10, switch_ms: float = 0.0, *, background_batch: float | None = None,
             baseline: BurstPlan | float | None = None, objective: str = "background") -> MultiplexResult:
    """Multiplex a background job (one per-GPU step of ``background_piece_ms``, cut into pieces of
    at most ``piece_ms``) into the idle windows of ``foreground`` for ``iterations`` iterations,
    each at most ``slowdown`` times its planned time (see the module's text)."""
    if not isinstance(foreground, BurstPlan):
        raise BurstError(f"foreground must be a BurstPlan; got {type(foreground).__name__}")
    step = _number("background_piece_ms", background_piece_ms)
    most = _number("piece_ms", piece_ms)
    bound = _number("slowdown", slowdown, low=1.0, strict=False)
    s = _number("switch_ms", switch_ms, strict=False)
    integer("iterations", iterations, 1, BurstError)
    if objective not in OBJECTIVES:
        raise BurstError(f"objective must be one of {', '.join(OBJECTIVES)}; got {objective!r}")
    spans = busy_spans(foreground)
    T, K = float(foreground.iteration_ms), iterations
    if background_batch is None:
        background_batch = foreground.batch / max(1, foreground.gpus)
    bgb = _number("background_batch", background_batch)
    if isinstance(baseline, BurstPlan):
        base = _number("baseline.batch", baseline.batch) * 1e3 / _number(
            "baseline.iteration_ms", baseline.iteration_ms)
    elif baseline is None:
        base = foreground.batch * 1e3 / T
    else:
        base = _number("baseline", baseline)
    n = max(1, math.ceil(step / most - 1e-9))
    q = step / n
    sim, chosen, runs = _best_schedule(spans, T, K, q, s, (bound - 1.0) * T, (bgb, n, foreground.batch), objective)
    wall = K * T + sim.delay
    times = [T + d for d in sim.realised]
    foreground_rate = foreground.batch * 1e3 * K / wall
    done = {g: st.done for g, st in sim.gpus.items()}
    background_rate = bgb / n * sum(done.values()) * 1e3 / wall
    busy = {g: sum(b - a for a, b, _ in sp) for g, sp in spans.items()}
    bg_ms = {g: 0.0 for g in spans}
    for pc in sim.pieces:
        bg_ms[pc.gpu] += pc.end_ms - pc.start_ms
    total = foreground_rate + background_rate
    return MultiplexResult(
        gpus=len(spans), iterations=K, planned_iteration_ms=T, iteration_ms=wall / K, iteration_times_ms=times,
        slowdown=max(times) / T, slowdown_bound=bound, allowance_ms=chosen, schedules=runs, wall_ms=wall,
        foreground_throughput=foreground_rate, background_throughput=background_rate, total_throughput=total,
        baseline_throughput=base,
        ratio=total / base, background_step_ms=step, piece_size_ms=q, pieces_per_step=n, background_batch=bgb,
        background_rate=bgb * 1e3 / step, switch_ms=s, utilisation_before={g: busy[g] / T for g in spans},
        utilisation_after={g: (K * busy[g] + bg_ms[g]) / wall for g in spans},
        background_steps={g: d // n for g, d in done.items()}, pieces=sim.pieces, foreground=sim.foreground)
