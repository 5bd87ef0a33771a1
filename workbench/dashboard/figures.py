"""Pure figure building for the dashboard: history / trace in, plotly figures out.

Nothing here knows about widgets or live runs, so the same functions draw a live run, a replay
from the store and a static HTML report.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from ..sizes import format_bytes
from ..telemetry import CATEGORIES, IN_FLIGHT_TID
from ..telemetry import time_shares as rank_time_shares

COLOURS = {"compute": "#4C78A8", "comm": "#E45756", "wait": "#F2A541", "io": "#54A24B", "other": "#BAB0AC"}
MAX_POINTS_PER_LINE = 300
MAX_TIMELINE_BARS = 2000


def _downsample(frame: pd.DataFrame, column: str) -> pd.DataFrame:
    """At most MAX_POINTS_PER_LINE points: the mean of each block (a light plot at any length)."""
    if len(frame) <= MAX_POINTS_PER_LINE:
        return frame
    blocks = np.arange(len(frame)) * MAX_POINTS_PER_LINE // len(frame)
    return frame.groupby(blocks)[["t", column]].mean()


def accuracy_label(algorithm: str | None) -> str:
    """What the evaluated weights are: the center variable (EASGD family), the master's weights
    (master-based SGD), the outer model (DiLoCo), the last average (Local SGD) or the replicated
    model (sync-sgd)."""
    from ..optim.registry import known_definition
    spec = known_definition(algorithm)
    return "test accuracy" if spec is None else f"test accuracy ({spec.evaluated})"


def loss_traces(history: pd.DataFrame, algorithm: str | None = None) -> list[dict]:
    """Plotly trace dicts: train loss per worker (left axis), test accuracy (right axis) of the
    weights that ``algorithm`` evaluates (see :func:`accuracy_label`).

    Arrays are numpy: plotly validates those in one step, lists element by element (the
    difference is most of a live redraw's cost).
    """
    traces = []
    train = history[history["kind"] == "train"]
    # a restart's fault breaks each line there: no run went on between the checkpoint and the next incarnation
    breaks = history.loc[history["kind"] == "fault", "t"].astype(float).to_numpy()
    for rank in sorted(train["rank"].dropna().unique()):
        part = _downsample(train[train["rank"] == rank].sort_values("t")[["t", "loss"]].astype(float), "loss")
        part = _broken(part, "loss", breaks)
        traces.append(dict(type="scatter", x=part["t"].to_numpy(), y=part["loss"].to_numpy(), mode="lines",
                           name=f"loss rank {int(rank)}", line=dict(width=1.5), yaxis="y"))
    evals = _broken(history[(history["kind"] == "eval")].sort_values("t")[["t", "test_accuracy"]].astype(float),
                    "test_accuracy", breaks)
    traces.append(dict(type="scatter", x=evals["t"].to_numpy(), y=evals["test_accuracy"].to_numpy(),
                       mode="lines+markers", name=accuracy_label(algorithm), line=dict(color="black", dash="dot"),
                       yaxis="y2"))
    return traces + fault_traces(history)


def _broken(part: pd.DataFrame, column: str, at: np.ndarray) -> pd.DataFrame:
    """``part`` (sorted by ``t``) with a gap (NaN, where plotly lifts the pen) at each time in ``at`` inside it."""
    inside = [t for t in at if len(part) and part["t"].iloc[0] < t < part["t"].iloc[-1]]
    if not inside:
        return part
    gaps = pd.DataFrame({"t": inside, column: np.nan})
    return pd.concat([part, gaps]).sort_values("t", kind="stable").reset_index(drop=True)


#: the records that mark a fault on a run's clock: a restart's fault (``workbench train --max-restarts``) and
#: a worker a master served on without (``lost``)
FAULT_KINDS = {"fault": "fault: restarted", "lost": "worker lost: served on"}


def fault_traces(history: pd.DataFrame) -> list[dict]:
    """A marker at the top of the accuracy axis for each fault of the run (:data:`FAULT_KINDS`), its cause
    on hover; none for a run without one."""
    traces = []
    for kind, name in FAULT_KINDS.items():
        marks = history[history["kind"] == kind].sort_values("t")
        if marks.empty:
            continue
        text = [str(r.get("cause") or f"rank {int(r['rank'])} lost after {int(r.get('arrivals') or 0)} arrivals")
                for r in marks.to_dict("records")]
        traces.append(dict(type="scatter", x=marks["t"].astype(float).to_numpy(), y=np.ones(len(marks)),
                           mode="markers", name=name, yaxis="y2", hovertext=text, hoverinfo="text+x",
                           marker=dict(symbol="x" if kind == "fault" else "triangle-down", size=12,
                                       color=COLOURS["comm"])))
    return traces


def loss_layout(title: str = "Loss and test accuracy") -> dict:
    return dict(title=dict(text=title), template="plotly_white", height=340, margin=dict(l=50, r=50, t=50, b=40),
                legend=dict(orientation="h", y=-0.2), xaxis=dict(title=dict(text="seconds since start")),
                yaxis=dict(title=dict(text="train loss")),
                yaxis2=dict(title=dict(text="test accuracy"), range=[0, 1], overlaying="y", side="right"))


def loss_figure(history: pd.DataFrame, title: str = "Loss and test accuracy",
                algorithm: str | None = None) -> go.Figure:
    """Train loss per worker against time, and test accuracy at the evaluation points."""
    return go.Figure(data=loss_traces(history, algorithm), layout=loss_layout(title))


def time_shares(trace: list[dict], ranks: int, start: float = 0.0) -> pd.DataFrame:
    """Fraction of each rank's time since ``start`` (seconds since the common start) in compute /
    comm / wait / io / other: :func:`workbench.telemetry.time_shares` per rank, the definition
    behind ``summary.json``'s ``comm_fraction`` (its comm + wait). Rows sum to 1."""
    rows = [rank_time_shares([e for e in trace if e.get("pid") == rank], start=start) for rank in range(ranks)]
    return pd.DataFrame(rows, index=[f"rank {r}" for r in range(ranks)], columns=[*CATEGORIES, "other"])


def share_traces(shares: pd.DataFrame) -> list[dict]:
    return [dict(type="bar", y=np.array(shares.index), x=shares[c].to_numpy(), name=c, orientation="h",
                 marker=dict(color=COLOURS[c])) for c in shares.columns]


def share_layout(ranks: int, title: str = "Time share per rank") -> dict:
    return dict(barmode="stack", title=dict(text=title), template="plotly_white", height=60 + 40 * ranks,
                xaxis=dict(range=[0, 1], tickformat=".0%"), margin=dict(l=70, r=20, t=50, b=30),
                yaxis=dict(autorange="reversed"))


def share_figure(shares: pd.DataFrame, title: str = "Time share per rank") -> go.Figure:
    return go.Figure(data=share_traces(shares), layout=share_layout(len(shares), title))


def timeline_rows(ranks: int, in_flight: bool = False) -> list[str]:
    """The timeline's rows: one per rank and, with ``in_flight``, one below each for the
    nonblocking all-reduces in flight beside it (gradient buckets during backward)."""
    return [row for r in range(ranks) for row in ([f"rank {r}", f"rank {r} in flight"] if in_flight
                                                     else [f"rank {r}"])]


def _row(event: dict) -> str:
    return f"rank {event['pid']}" + (" in flight" if event.get("tid") == IN_FLIGHT_TID else "")


def timeline_traces(trace: list[dict], ranks: int, window_seconds: float = 2.0) -> tuple[list[dict], list[float]]:
    """Bars of the last ``window_seconds`` (one row per rank, coloured by category; all-reduces
    in flight on a row of their own) and the x range (ms)."""
    # spans arrive roughly in time order: the window is in the tail, no need to scan the whole run
    tail = [e for e in trace[-4 * MAX_TIMELINE_BARS:] if e.get("ph", "X") == "X" and e.get("cat") in CATEGORIES]
    end = max((e["ts"] + e["dur"] for e in tail), default=0.0)
    start = end - window_seconds * 1e6
    recent = [e for e in tail if e["ts"] + e["dur"] >= start][-MAX_TIMELINE_BARS:]
    labels = np.array(timeline_rows(ranks))
    traces = []
    for cat in CATEGORIES:
        part = [e for e in recent if e["cat"] == cat]
        traces.append(dict(
            type="bar", y=np.array([_row(e) for e in part], dtype=object) if part else np.array([], dtype=object),
            x=np.array([e["dur"] / 1e3 for e in part]), base=np.array([e["ts"] / 1e3 for e in part]),
            orientation="h", name=cat, marker=dict(color=COLOURS[cat]),
            hovertext=np.array([e["name"] for e in part], dtype=object),
            hovertemplate="%{hovertext}: %{x:.3f} ms<extra></extra>"))
    # every rank gets a row even when it has no span in the window
    left = max(0.0, start / 1e3)
    traces.append(dict(type="scatter", y=labels, x=np.full(ranks, left), mode="markers",
                       marker=dict(opacity=0), showlegend=False, hoverinfo="skip"))
    return traces, [left, end / 1e3 if end else window_seconds * 1e3]


def timeline_layout(ranks: int, x_range: list[float], title: str = "Per-rank timeline",
                    in_flight: bool = False) -> dict:
    """One row per rank; with ``in_flight`` (algorithms that issue nonblocking all-reduces:
    sync-sgd's gradient buckets) a row below each for what is in flight beside it."""
    return dict(title=dict(text=title), barmode="overlay", template="plotly_white", height=80 + 45 * ranks,
                margin=dict(l=110, r=20, t=50, b=40),
                xaxis=dict(title=dict(text="milliseconds since start"), range=x_range),
                yaxis=dict(categoryorder="array", categoryarray=timeline_rows(ranks, in_flight),
                           autorange="reversed", type="category"))


def timeline_figure(trace: list[dict], ranks: int, window_seconds: float = 2.0,
                    title: str = "Per-rank timeline") -> go.Figure:
    """A Gantt of the last ``window_seconds`` of the trace: one row per rank, coloured by
    category, and rows of all-reduces in flight when the trace has any."""
    traces, x_range = timeline_traces(trace, ranks, window_seconds)
    in_flight = any(e.get("tid") == IN_FLIGHT_TID for e in trace[-4 * MAX_TIMELINE_BARS:])
    return go.Figure(data=traces, layout=timeline_layout(ranks, x_range, title, in_flight))


def _workers(config: dict) -> int:
    """The ranks of a run's configuration that train (:func:`workbench.config.workers_of`); all of them for an
    algorithm not known here (a user's module this process cannot import)."""
    from ..config import workers_of
    from ..optim.registry import UnknownAlgorithm
    try:
        return max(1, workers_of(config))
    except (UnknownAlgorithm, ImportError, ValueError):
        return max(1, int(config.get("ranks", 1)))


def status_line(source) -> tuple[str, float]:
    """An HTML status line and the progress fraction for a run or a RunResult."""
    history, config = source.history, source.config
    train = history[history["kind"] == "train"]
    steps = len(train)
    total = source.total_steps or 0
    elapsed = float(train["t"].max()) if steps else 0.0
    rate = steps * config.get("batch_size", 1) / elapsed if elapsed > 0 else 0.0
    faults = history[history["kind"] == "fault"]
    per_worker, ranks = "", f"{config.get('ranks')} ranks"
    if len(faults):
        if "world_size" in faults and pd.notna(faults["world_size"].iloc[-1]):
            ranks += f", {int(faults['world_size'].iloc[-1])} after the restart"
        if steps and total:
            # a restart (at fewer ranks, or redoing steps) leaves records that no longer add up to the plan: the
            # furthest worker's steps against the steps each worker plans (the plan's steps over its workers)
            steps, total, per_worker = int(train["step"].max()) + 1, -(-total // _workers(config)), " a worker"
    fraction = min(1.0, steps / total) if total else (1.0 if source.done() else 0.0)
    eta = (elapsed / fraction - elapsed) if 0 < fraction < 1 else 0.0
    epoch = fraction * config.get("epochs", 0)
    evals = history[history["kind"] == "eval"]
    acc = f"{float(evals.sort_values('t')['test_accuracy'].iloc[-1]):.3f}" if len(evals) else "-"
    text = (f"<b>{config.get('algorithm')}</b> on {ranks} &middot; <b>{source.status}</b>"
            f" &middot; step {steps}/{total}{per_worker} &middot; epoch {epoch:.1f}/{config.get('epochs')}"
            f" &middot; {rate:,.0f} samples/s &middot; ETA {eta:.1f} s &middot; test accuracy {acc}")
    wire = wire_bytes_per_step(getattr(source, "summary", None), train)
    if wire is not None:
        text += f" &middot; on the wire {format_bytes(wire)}/step per rank"
    return text, fraction


def wire_bytes_per_step(summary: dict | None, train: pd.DataFrame) -> float | None:
    """Bytes one rank put on the wire per training step, from the run's one byte counter
    (:class:`workbench.comm.hooks.Traffic`, kept with telemetry on or off): a finished run's
    ``wire_bytes_per_step``; while it runs, the train records' ``wire_bytes`` (the rank's
    counter when the record was made, i.e. after ``step`` steps), mean over the ranks that
    train. None before any step, or when the records carry no counter."""
    if summary and summary.get("wire_bytes_per_step") is not None:
        return float(summary["wire_bytes_per_step"])
    if train.empty or "wire_bytes" not in train.columns:
        return None
    latest = train.dropna(subset=["wire_bytes"]).sort_values("step").groupby("rank").last()
    per_step = [row.wire_bytes / row.step for row in latest.itertuples() if row.step > 0]
    return sum(per_step) / len(per_step) if per_step else None
