"""Per-rank telemetry: spans in the Chrome trace event format.

A span is ``{"name", "cat", "ph": "X", "ts", "dur", "pid": rank, "tid", "args"}`` with
``ts``/``dur`` in microseconds and ``cat`` one of ``compute``, ``comm``, ``wait``, ``io``.
A list of spans saved as ``{"traceEvents": [...]}`` opens in Perfetto and chrome://tracing.

Code that communicates asks :func:`current` for the active :class:`Telemetry` and records
only when there is one, so the hook costs one global lookup when telemetry is off.
Observers (dask-style plugins with do-nothing hooks) see every span as it is recorded.
"""
from __future__ import annotations

import json
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

CATEGORIES = ("compute", "comm", "wait", "io")
#: the trace row of nonblocking all-reduces in flight (thread ids are kept below 100000)
IN_FLIGHT_TID = 100000

_active: "Telemetry | None" = None


class Observer:
    """Base class for telemetry observers; override the hooks you need."""

    def on_span(self, event: dict) -> None:  # noqa: D401 - hook
        """Called for every recorded span, on the recording thread."""

    def on_metric(self, record: dict) -> None:  # noqa: D401 - hook
        """Called for every metric record (a worker's loss, an evaluation), on the training thread."""


class _Span:
    """A span being timed (a slotted object: cheaper than a generator context manager)."""

    __slots__ = ("telemetry", "name", "cat", "args", "start")

    def __init__(self, telemetry: "Telemetry", name: str, cat: str, args: dict) -> None:
        self.telemetry, self.name, self.cat, self.args = telemetry, name, cat, args

    def __enter__(self) -> dict:
        self.start = time.perf_counter_ns()
        return self.args

    def __exit__(self, *exc) -> bool:
        self.telemetry.record(self.name, self.cat, self.start, time.perf_counter_ns(), **self.args)
        return False


class Telemetry:
    """Collects one rank's spans.

    Spans are kept as flat tuples (which the garbage collector stops tracking, so a long run
    does not slow every collection down) and turned into Chrome trace events on demand.

    Args:
        rank: the trace's ``pid`` (one row group per rank in Perfetto).
        epoch_ns: ``time.perf_counter_ns()`` value taken as time zero; ranks launched
            together pass the same wall-clock-aligned epoch so their rows line up.
    """

    def __init__(self, rank: int = 0, epoch_ns: int | None = None) -> None:
        self.rank = rank
        self.epoch_ns = time.perf_counter_ns() if epoch_ns is None else epoch_ns
        self._raw: list[tuple] = []
        self._events: list[dict] = []  # _raw[:len(_events)] already converted
        self.observers: list[Observer] = []

    def record(self, name: str, cat: str, start_ns: int, end_ns: int, *, tid: int | None = None,
               **args: Any) -> None:
        """Record a finished span from two ``perf_counter_ns`` readings.

        ``tid``: the trace row; default the calling thread's. Work that is in flight beside the
        thread's own spans (a nonblocking all-reduce during backward) goes on a row of its own
        (:data:`IN_FLIGHT_TID`), so a row's spans always nest."""
        if cat not in CATEGORIES:
            raise ValueError(f"cat must be one of {CATEGORIES}, got {cat!r}")
        raw = (name, cat, start_ns, end_ns, threading.get_ident() % 100000 if tid is None else tid, args)
        self._raw.append(raw)
        if self.observers:
            event = self._event(raw)
            for obs in self.observers:
                obs.on_span(event)

    def _event(self, raw: tuple) -> dict:
        name, cat, start, end, tid, args = raw
        return {"name": name, "cat": cat, "ph": "X", "ts": (start - self.epoch_ns) / 1000.0,
                "dur": (end - start) / 1000.0, "pid": self.rank, "tid": tid, "args": args}

    @property
    def events(self) -> list[dict]:
        """All spans so far as Chrome trace events (``ts``/``dur`` in microseconds)."""
        if len(self._events) < len(self._raw):
            self._events.extend(self._event(r) for r in self._raw[len(self._events):])
        return self._events

    def span(self, name: str, cat: str, **args: Any) -> _Span:
        """Time the ``with`` body as one span; the yielded dict becomes the span's ``args``."""
        return _Span(self, name, cat, args)

    def time_in(self, cat: str) -> float:
        """Seconds during which a span of category ``cat`` was open (overlaps counted once)."""
        return busy_seconds(self.events, (cat,))

    def chrome_trace(self) -> dict:
        """The spans as a Chrome trace object (``{"traceEvents": [...]}``)."""
        return chrome_trace(self.events, [self.rank])

    def save(self, path: str | os.PathLike) -> Path:
        """Write :meth:`chrome_trace` as JSON to ``path`` and return it."""
        path = Path(path)
        path.write_text(json.dumps(self.chrome_trace()))
        return path


def union_intervals(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def chrome_trace(events: list[dict], ranks, master: int | None = None) -> dict:
    """``{"traceEvents": [...]}``: a named row group per rank (``master`` labelled so), then
    ``events``. Opens in Perfetto and chrome://tracing."""
    meta = [{"name": "process_name", "ph": "M", "pid": r,
             "args": {"name": f"rank {r}" + (" (master)" if r == master else "")}} for r in ranks]
    return {"traceEvents": meta + list(events), "displayTimeUnit": "ms"}


def busy_seconds(events: list[dict], cats: tuple[str, ...]) -> float:
    """Seconds during which at least one span of ``cats`` was open (overlaps counted once)."""
    spans = union_intervals([(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") in cats])
    return sum(b - a for a, b in spans) / 1e6


def exposed_comm_seconds(events: list[dict]) -> float:
    """Seconds spent communicating or waiting while *not* computing: communication that
    overlaps computation (another thread's all-reduce during backward) is hidden and not
    counted; concurrent waits (several server threads) count once."""
    comm = union_intervals([(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") in ("comm", "wait")])
    work = union_intervals([(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") in ("compute", "io")])
    return length_outside(comm, work) / 1e6


def length_outside(intervals: list[tuple[float, float]], covered: list[tuple[float, float]]) -> float:
    """Total length of ``intervals`` not inside ``covered`` (both disjoint and sorted, as from
    :func:`union_intervals`)."""
    total, j = 0.0, 0
    for a, b in intervals:
        inside = 0.0
        while j < len(covered) and covered[j][1] <= a:
            j += 1
        k = j
        while k < len(covered) and covered[k][0] < b:
            inside += min(b, covered[k][1]) - max(a, covered[k][0])
            k += 1
        total += (b - a) - inside
    return total


#: When spans of several categories are open at the same instant, the instant counts for the
#: first of them in this order (see :func:`time_shares`).
SHARE_ORDER = ("compute", "io", "comm", "wait")


def time_shares(events: list[dict], start: float = 0.0, end: float | None = None) -> dict[str, float]:
    """How one rank spent the interval ``[start, end]``: the share of it in each category of
    :data:`CATEGORIES`, plus ``other`` (no span open); the shares sum to 1.

    ``events``: one rank's spans (``ts``/``dur`` in microseconds since the ranks' common start,
    any thread). ``start``/``end``: seconds since the common start; ``end`` defaults to the end
    of the rank's last span. Spans are clipped to the interval. Every instant counts once, for
    the first category open at that instant in :data:`SHARE_ORDER` (compute, io, comm, wait):
    communication hidden behind computation (an all-reduce on another thread during backward)
    counts as compute, and waiting for a communication thread counts as comm while that
    communication runs. So ``comm + wait`` is the exposed communication of
    :func:`exposed_comm_seconds` over the interval: :func:`comm_fraction`.
    """
    spans = [e for e in events if e.get("ph", "X") == "X"]
    if end is None:
        end = max((e["ts"] + e["dur"] for e in spans), default=0.0) / 1e6
    shares = {cat: 0.0 for cat in CATEGORIES}
    if end <= start:
        return {**shares, "other": 1.0}
    lo, hi = start * 1e6, end * 1e6
    covered: list[tuple[float, float]] = []
    for cat in SHARE_ORDER:
        mine = union_intervals([(max(lo, e["ts"]), min(hi, e["ts"] + e["dur"])) for e in spans
                                if e.get("cat") == cat and e["ts"] < hi and e["ts"] + e["dur"] > lo])
        shares[cat] = length_outside(mine, covered) / (hi - lo)
        covered = union_intervals(covered + mine)
    shares["other"] = max(0.0, 1.0 - sum(shares.values()))
    return shares


def comm_fraction(events: list[dict], wall_seconds: float) -> float:
    """The communication share of one rank: **the** definition, used by ``summary.json``'s
    ``comm_fraction`` and by the dashboard's time shares.

    ``comm_fraction = exposed communication seconds / wall seconds``, where exposed
    communication is the time during which a ``comm`` or ``wait`` span is open on any of the
    rank's threads and no ``compute`` or ``io`` span is (overlaps counted once: communication
    hidden behind computation does not count), and the wall time runs from the ranks' common
    start (``ts = 0``) to ``wall_seconds`` (the end of the rank's training loop). It equals
    ``time_shares(events, 0, wall_seconds)["comm"] + ["wait"]``: the comm and wait bars of the
    dashboard. A run's ``comm_fraction`` is the mean of its ranks' (a master included;
    ``comm_fraction_workers`` is the mean over the ranks that train).
    """
    shares = time_shares(events, 0.0, wall_seconds)
    return shares["comm"] + shares["wait"]


def steady_step_seconds(events: list[dict], skip: int = 3, span: str = "forward_backward") -> float:
    """Mean seconds per step of a lock-step run in its steady state, from its trace events (every
    rank's spans; ``pid`` is the rank): per rank, from the start of its ``span`` number ``skip``
    (0-based: the first ``skip`` steps, with connection set-up and first allocations, left out) to
    the start of its last one, over the steps between; then the mean over ranks. The last step is
    left out because it ends with the run's final evaluation and summary. ValueError when a rank
    has fewer than ``skip + 2`` such spans."""
    if not isinstance(skip, int) or isinstance(skip, bool) or skip < 0:
        raise ValueError(f"skip must be an integer >= 0 (steps left out); got {skip!r}")
    starts: dict[int, list[float]] = {}
    for e in events:
        if e.get("ph", "X") == "X" and e.get("name") == span:
            starts.setdefault(e.get("pid", 0), []).append(e["ts"])
    if not starts:
        raise ValueError(f"events hold no {span!r} span: was telemetry on?")
    per_rank = []
    for rank, ts in sorted(starts.items()):
        if len(ts) < skip + 2:
            raise ValueError(f"rank {rank} has {len(ts)} {span!r} spans; skip={skip} needs at least {skip + 2}")
        ts.sort()
        per_rank.append((ts[-1] - ts[skip]) / (len(ts) - 1 - skip) / 1e6)
    return sum(per_rank) / len(per_rank)


def current() -> Telemetry | None:
    """The active telemetry of this process, or ``None`` when telemetry is off."""
    return _active


@contextmanager
def recording(telemetry: Telemetry) -> Iterator[Telemetry]:
    """Make ``telemetry`` the active one for the ``with`` body (restores the previous one)."""
    global _active
    previous, _active = _active, telemetry
    try:
        yield telemetry
    finally:
        _active = previous
