"""Pictures of burst-parallel plans (plotly; no torch).

    from workbench.burst.pictures import plan_figure, widths_figure
    plan_figure(plan)                        # one iteration per GPU: transfer, compute, sync, idle
    widths_figure({"A=1.5": p1, "A=2": p2, "data parallel": dp})   # GPUs per layer, side by side
    fill_figure(simulate(plan, 5.0))         # multiplex.simulate: foreground, background pieces, idle
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .plan import BurstPlan

if TYPE_CHECKING:
    from .multiplex import MultiplexResult

#: colours of the three kinds of busy time and of idle time
COLOURS = {"transfer": "#ff7f0e", "compute": "#1f77b4", "sync": "#2ca02c", "idle": "#e6e6e6"}


def _limit(plan: BurstPlan) -> str:
    if plan.data_parallel:
        return "data parallel"
    a = plan.amplification
    return "no amplification limit" if a is None or math.isinf(a) else f"amplification <= {a:g}"


def plan_figure(plan: BurstPlan, title: str | None = None, min_idle_ms: float = 0.0):
    """A per-GPU Gantt chart of one iteration: a row per GPU of the job (GPU 0 on top), a bar per
    layer's transfer in, compute and gradient sync on each of its GPUs, idle windows in grey
    (those shorter than ``min_idle_ms`` left out). Hover a bar for the layer, its width and times."""
    import plotly.graph_objects as go

    types = {l.id: (l.type, l.gpus) for l in plan.layers}
    rows = max(plan.gpus, plan.gpus_used)
    label = [f"GPU {g}" for g in range(rows)]
    fig = go.Figure()
    busy = plan.timeline()
    for what in ("transfer", "compute", "sync"):
        bars = [b for b in busy if b.what == what]
        if not bars:
            continue
        fig.add_trace(go.Bar(
            name=what, orientation="h", y=[label[b.gpu] for b in bars], base=[b.start_ms for b in bars],
            x=[b.end_ms - b.start_ms for b in bars], marker_color=COLOURS[what], marker_line_width=0,
            customdata=[[b.layer, types[b.layer][0], types[b.layer][1], b.start_ms, b.end_ms] for b in bars],
            hovertemplate=(f"{what}<br>layer %{{customdata[0]}} (%{{customdata[1]}}) on %{{customdata[2]}} GPUs"
                           "<br>%{customdata[3]:.3f} to %{customdata[4]:.3f} ms<extra>%{y}</extra>")))
    idle = [(g, s, e) for g, windows in plan.idle_windows(min_idle_ms).items() for s, e in windows if g < rows]
    if idle:
        fig.add_trace(go.Bar(
            name="idle", orientation="h", y=[label[g] for g, _, _ in idle], base=[s for _, s, _ in idle],
            x=[e - s for _, s, e in idle], marker_color=COLOURS["idle"], marker_line_width=0,
            customdata=[[s, e] for _, s, e in idle],
            hovertemplate="idle %{customdata[0]:.3f} to %{customdata[1]:.3f} ms<extra>%{y}</extra>"))
    busy_ms = sum(b.end_ms - b.start_ms for b in busy)
    share = busy_ms / (rows * plan.iteration_ms) if plan.iteration_ms > 0 else 0.0
    fig.update_layout(
        title=title or (f"{plan.model}, batch {plan.batch}, {_limit(plan)} ({plan.cost_model} cost model): "
                        f"{plan.iteration_ms:.2f} ms per iteration, {plan.gpus_used} of {plan.gpus} GPUs, "
                        f"{share:.0%} busy"),
        barmode="overlay", bargap=0.15, height=max(260, 26 * rows + 140), xaxis_title="ms in one iteration",
        legend=dict(orientation="h", y=-0.18 if rows > 4 else -0.35), hovermode="closest")
    fig.update_yaxes(categoryorder="array", categoryarray=label[::-1])
    fig.update_xaxes(range=[0, plan.iteration_ms * 1.01 if plan.iteration_ms > 0 else 1])
    return fig


def widths_figure(plans: dict, title: str | None = None):
    """GPUs per layer for several plans of one model (e.g. amplification limits 1.5, 2, 2.5, none
    and data parallelism): grouped bars, the layer on the x axis, GPUs on a log2 y axis; the legend
    gives each plan's iteration and GPU time."""
    import plotly.graph_objects as go

    if not plans:
        raise ValueError("widths_figure: no plans given")
    fig = go.Figure()
    top = 1
    for label, plan in plans.items():
        layers = sorted(plan.layers, key=lambda l: l.id)
        top = max(top, max(l.gpus for l in layers))
        fig.add_trace(go.Bar(
            name=f"{label}: {plan.iteration_ms:.2f} ms, {plan.gpu_ms:.1f} GPU-ms",
            x=[f"{l.id} {l.type}" for l in layers], y=[l.gpus for l in layers],
            customdata=[[l.compute_ms, l.sync_ms, l.transfer_ms] for l in layers],
            hovertemplate=("%{x}: %{y} GPUs<br>compute %{customdata[0]:.3f} ms, sync %{customdata[1]:.3f} ms, "
                           f"transfer %{{customdata[2]:.3f}} ms<extra>{label}</extra>")))
    first = next(iter(plans.values()))
    ticks = [1 << k for k in range(top.bit_length())]
    fig.update_layout(title=title or f"{first.model}, batch {first.batch}, {first.gpus} GPUs: GPUs per layer",
                      barmode="group", bargap=0.2, xaxis_title="layer", yaxis_title="GPUs",
                      legend=dict(orientation="h", y=-0.35), height=460)
    fig.update_yaxes(type="log", tickvals=ticks, ticktext=[str(t) for t in ticks], range=[-0.1, math.log10(top) + 0.1])
    return fig


def fill_figure(result: MultiplexResult, title: str | None = None):
    """Per-GPU timeline (plotly): foreground spans, background pieces and idle time."""
    import plotly.graph_objects as go

    rows = {g: f"GPU {g}" for g in sorted(result.utilisation_before)}
    fig = go.Figure()

    def bars(items, name, color, text):
        items = list(items)
        fig.add_trace(go.Bar(orientation="h", name=name, marker_color=color, y=[rows[i[0]] for i in items],
                             base=[i[1] for i in items], x=[i[2] - i[1] for i in items],
                             hovertext=[text(i) for i in items], hoverinfo="text"))

    fg = [(s.gpu, s.start_ms, s.end_ms, s.layers) for s in result.foreground]
    bg = [(p.gpu, p.start_ms, p.end_ms, p.overrun_ms) for p in result.pieces]
    idle = []
    for g in rows:
        t = 0.0
        for _, a, b, _ in sorted((i for i in fg + bg if i[0] == g), key=lambda i: (i[1], i[2])):
            if a > t + 1e-9:
                idle.append((g, t, a, None))
            t = max(t, b)
        if result.wall_ms > t + 1e-9:
            idle.append((g, t, result.wall_ms, None))
    bars(fg, "foreground", "#1f77b4", lambda i: f"layers {', '.join(map(str, i[3]))}: {i[1]:.3f}-{i[2]:.3f} ms")
    bars(bg, "background", "#ff7f0e", lambda i: f"piece {i[1]:.3f}-{i[2]:.3f} ms, overrun {i[3]:.3f} ms")
    bars(idle, "idle", "#dddddd", lambda i: f"idle {i[1]:.3f}-{i[2]:.3f} ms")
    fig.update_layout(barmode="overlay", title=title or f"multiplexing: {result.ratio:.2f}x the baseline",
                      xaxis_title="ms", yaxis=dict(autorange="reversed", categoryorder="array",
                                                   categoryarray=list(rows.values())), bargap=0.3)
    return fig
