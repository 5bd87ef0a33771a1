"""Pure figure building for the dashboard: history / trace in, plotly figures out.

Nothing here knows about widgets or live runs, so the same functions draw a live run, a replay
from the store and a static HTML report.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..runtime.telemetry import length_outside, union_intervals as _union

CATEGORIES = ("compute", "comm", "wait", "io")
COLOURS = {"compute": "#4C78A8", "comm": "#E45756", "wait": "#F2A541", "io": "#54A24B", "other": "#BAB0AC"}
MAX_POINTS_PER_LINE = 300
MAX_TIMELINE_BARS = 4000


def _downsample(frame: pd.DataFrame, column: str) -> pd.DataFrame:
    """At most MAX_POINTS_PER_LINE points: the mean of each block (a light plot at any length)."""
    if len(frame) <= MAX_POINTS_PER_LINE:
        return frame
    blocks = np.arange(len(frame)) * MAX_POINTS_PER_LINE // len(frame)
    return frame.groupby(blocks)[["t", column]].mean()


def loss_figure(history: pd.DataFrame, title: str = "Loss and test accuracy") -> go.Figure:
    """Train loss per worker against time, and test accuracy at the evaluation points."""
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    train = history[history["kind"] == "train"]
    for rank in sorted(train["rank"].dropna().unique()):
        part = _downsample(train[train["rank"] == rank].sort_values("t")[["t", "loss"]].astype(float), "loss")
        fig.add_trace(go.Scatter(x=part["t"], y=part["loss"], mode="lines", name=f"loss rank {int(rank)}",
                                 line=dict(width=1.5)), secondary_y=False)
    evals = history[(history["kind"] == "eval")].sort_values("t")
    fig.add_trace(go.Scatter(x=evals["t"].astype(float), y=evals["test_accuracy"].astype(float),
                             mode="lines+markers", name="test accuracy (center)",
                             line=dict(color="black", dash="dot")), secondary_y=True)
    fig.update_layout(title=title, template="plotly_white", height=340, margin=dict(l=50, r=50, t=50, b=40),
                      legend=dict(orientation="h", y=-0.2))
    fig.update_xaxes(title_text="seconds since start")
    fig.update_yaxes(title_text="train loss", secondary_y=False)
    fig.update_yaxes(title_text="test accuracy", range=[0, 1], secondary_y=True)
    return fig


def time_shares(trace: list[dict], ranks: int) -> pd.DataFrame:
    """Fraction of each rank's observed time in compute / comm / wait / io / other.

    Every instant counts once, for the first category open at that instant in the order
    compute, io, comm, wait: communication hidden behind computation (an all-reduce on another
    thread during backward) counts as compute, and waiting for a communication thread counts
    as comm while that communication runs. The span of a rank's whole trace is its wall time;
    what no span covers is ``other``. Rows sum to 1.
    """
    order = ("compute", "io", "comm", "wait")
    rows = []
    for rank in range(ranks):
        events = [e for e in trace if e.get("pid") == rank and e.get("ph", "X") == "X"]
        if not events:
            rows.append({**{c: 0.0 for c in CATEGORIES}, "other": 1.0})
            continue
        wall = max(e["ts"] + e["dur"] for e in events) - min(e["ts"] for e in events)
        shares, covered = {}, []
        for cat in order:
            mine = _union([(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == cat])
            shares[cat] = length_outside(mine, covered) / wall if wall > 0 else 0.0
            covered = _union(covered + mine)
        shares = {c: shares[c] for c in CATEGORIES}
        shares["other"] = max(0.0, 1.0 - sum(shares.values()))
        rows.append(shares)
    return pd.DataFrame(rows, index=[f"rank {r}" for r in range(ranks)])


def share_figure(shares: pd.DataFrame, title: str = "Time share per rank") -> go.Figure:
    fig = go.Figure([go.Bar(y=shares.index, x=shares[c], name=c, orientation="h", marker_color=COLOURS[c])
                     for c in shares.columns])
    fig.update_layout(barmode="stack", title=title, template="plotly_white", height=60 + 40 * len(shares),
                      xaxis=dict(range=[0, 1], tickformat=".0%"), margin=dict(l=70, r=20, t=50, b=30))
    fig.update_yaxes(autorange="reversed")
    return fig


def timeline_figure(trace: list[dict], ranks: int, window_seconds: float = 2.0,
                    title: str = "Per-rank timeline") -> go.Figure:
    """A Gantt of the last ``window_seconds`` of the trace: one row per rank, coloured by category."""
    labels = [f"rank {r}" for r in range(ranks)]
    spans = [e for e in trace if e.get("ph", "X") == "X" and e.get("cat") in CATEGORIES]
    end = max((e["ts"] + e["dur"] for e in spans), default=0.0)
    start = end - window_seconds * 1e6
    recent = [e for e in spans if e["ts"] + e["dur"] >= start][-MAX_TIMELINE_BARS:]
    fig = go.Figure()
    for cat in CATEGORIES:
        part = [e for e in recent if e["cat"] == cat]
        fig.add_trace(go.Bar(
            y=[f"rank {e['pid']}" for e in part], x=[e["dur"] / 1e3 for e in part],
            base=[e["ts"] / 1e3 for e in part], orientation="h", name=cat, marker_color=COLOURS[cat],
            hovertext=[e["name"] for e in part], hovertemplate="%{hovertext}: %{x:.3f} ms<extra></extra>"))
    fig.update_layout(title=title, barmode="overlay", template="plotly_white", height=80 + 45 * ranks,
                      margin=dict(l=70, r=20, t=50, b=40), xaxis_title="milliseconds since start")
    fig.update_yaxes(categoryorder="array", categoryarray=labels, autorange="reversed", type="category")
    fig.update_xaxes(range=[max(0.0, start / 1e3), end / 1e3 if end else window_seconds * 1e3])
    # every rank gets a row even when it has no span in the window
    fig.add_trace(go.Scatter(y=labels, x=[max(0.0, start / 1e3)] * ranks, mode="markers",
                             marker=dict(opacity=0), showlegend=False, hoverinfo="skip"))
    return fig


def status_line(source) -> tuple[str, float]:
    """An HTML status line and the progress fraction for a run or a RunResult."""
    history, config = source.history, source.config
    train = history[history["kind"] == "train"]
    steps = len(train)
    total = source.total_steps or 0
    elapsed = float(train["t"].max()) if steps else 0.0
    rate = steps * config.get("batch_size", 1) / elapsed if elapsed > 0 else 0.0
    fraction = min(1.0, steps / total) if total else (1.0 if source.done() else 0.0)
    eta = (elapsed / fraction - elapsed) if 0 < fraction < 1 else 0.0
    epoch = fraction * config.get("epochs", 0)
    evals = history[history["kind"] == "eval"]
    acc = f"{float(evals.sort_values('t')['test_accuracy'].iloc[-1]):.3f}" if len(evals) else "-"
    text = (f"<b>{config.get('algorithm')}</b> on {config.get('ranks')} ranks &middot; <b>{source.status}</b>"
            f" &middot; step {steps}/{total} &middot; epoch {epoch:.1f}/{config.get('epochs')}"
            f" &middot; {rate:,.0f} samples/s &middot; ETA {eta:.1f} s &middot; test accuracy {acc}")
    return text, fraction
