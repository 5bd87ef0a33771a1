"""Plotly pictures of networks, MultiTree's trees, per-step link use and speed-up curves.

    pictures.topology_figure(topology.torus(4, 4))
    pictures.trees_figure(topology.torus(4, 4), k=2, roots=[0, 5])
    pictures.link_use_figure(schedules.multitree(topology.torus(4, 4)), topology.torus(4, 4))
    pictures.speedup_figure(study.compare(topology.torus(8, 8)), title="torus 8x8")

Figures are ordinary ``plotly.graph_objects.Figure`` objects: they render in a notebook and
are saved with it (no widget state needed).
"""
from __future__ import annotations

import math
from typing import Sequence

import plotly.graph_objects as go
from plotly.colors import sample_colorscale
from plotly.subplots import make_subplots

from ..schedules.topology_aware import multitree_trees
from ..schedules.schedule import Schedule
from ..netsim.simulator import link_use
from ..sizes import format_size
from ..network.topology import Topology


def positions(topo: Topology) -> dict[int, tuple[float, float]]:
    """Drawing coordinates: grids by coordinate (column right, row down), switched networks
    with ranks along the bottom and switch layers above, other networks on a circle."""
    if len(topo.dims) == 2:
        return {v: (topo.coord(v)[1], -topo.coord(v)[0]) for v in range(topo.nodes)}
    if topo.direct or topo.kind == "bus":
        n = topo.nodes
        where = {v: (math.cos(2 * math.pi * v / n), math.sin(2 * math.pi * v / n)) for v in range(n)}
        if topo.kind == "bus":
            where.update({n: (-0.2, 0.0), n + 1: (0.2, 0.0)})
        return where
    where = {v: (float(v), 0.0) for v in range(topo.nodes)}
    edge_switches = sorted(set(topo.attach.values()))
    for s in edge_switches:  # a switch above the middle of its ranks
        mine = [v for v, a in topo.attach.items() if a == s]
        where[s] = (sum(mine) / len(mine), 1.0)
    others = [s for s in range(topo.nodes, topo.nodes + topo.switches) if s not in edge_switches]
    for i, s in enumerate(others):  # spines in a row above
        where[s] = ((i + 0.5) * topo.nodes / len(others) - 0.5, 2.0)
    if topo.kind == "bigraph":  # two layers: lower switches at height 1, upper at height 2
        half = topo.switches // 2
        for i, s in enumerate(edge_switches[half:]):
            where[s] = (where[s][0], 2.0)
    return where


def _segments(topo: Topology, pairs, where) -> tuple[list, list]:
    xs, ys = [], []
    for u, v in pairs:
        (x0, y0), (x1, y1) = where[u], where[v]
        xs += [x0, x1, None]
        ys += [y0, y1, None]
    return xs, ys


def _wraps(topo: Topology, u: int, v: int, where) -> bool:
    (x0, y0), (x1, y1) = where[u], where[v]
    return bool(topo.dims) and topo.wrap and abs(x0 - x1) + abs(y0 - y1) > 1.5


def topology_figure(topo: Topology, title: str | None = None) -> go.Figure:
    """The network: ranks (circles, numbered), switches (squares), cables (wrap-around links of
    a torus as short stubs at the edge)."""
    where = positions(topo)
    cables = {tuple(sorted(link)) for link in topo.links}
    straight = [c for c in cables if not _wraps(topo, *c, where)]
    xs, ys = _segments(topo, straight, where)
    fig = go.Figure(go.Scatter(x=xs, y=ys, mode="lines", line=dict(color="#bbb", width=2),
                               hoverinfo="skip", name="links"))
    for u, v in (c for c in cables if _wraps(topo, *c, where)):
        for a, b in ((u, v), (v, u)):
            (x0, y0), (x1, y1) = where[a], where[b]
            dx, dy = (-(x1 - x0) / abs(x1 - x0) if x1 != x0 else 0), (-(y1 - y0) / abs(y1 - y0) if y1 != y0 else 0)
            fig.add_trace(go.Scatter(x=[x0, x0 + 0.35 * dx], y=[y0, y0 + 0.35 * dy], mode="lines",
                                     line=dict(color="#bbb", width=2, dash="dot"), hoverinfo="skip",
                                     showlegend=False))
    _add_nodes(fig, topo, where)
    fig.update_layout(title=title or repr(topo), showlegend=False, height=420,
                      xaxis=dict(visible=False), yaxis=dict(visible=False, scaleanchor="x"),
                      plot_bgcolor="white", margin=dict(l=10, r=10, t=50, b=10))
    return fig


def _add_nodes(fig: go.Figure, topo: Topology, where, row: int | None = None, col: int | None = None) -> None:
    ranks = list(range(topo.nodes))
    kw = dict(row=row, col=col) if row else {}
    if row:  # the cables, faint, under a panel's arrows
        cables = {tuple(sorted(link)) for link in topo.links}
        xs, ys = _segments(topo, [c for c in cables if not _wraps(topo, *c, where)], where)
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line=dict(color="#eee", width=1),
                                 hoverinfo="skip", showlegend=False), **kw)
    fig.add_trace(go.Scatter(x=[where[v][0] for v in ranks], y=[where[v][1] for v in ranks], mode="markers+text",
                             text=[str(v) for v in ranks], textfont=dict(size=10, color="white"),
                             marker=dict(size=20, color="#345"), hovertext=[f"rank {v}" for v in ranks],
                             hoverinfo="text", showlegend=False), **kw)
    switches = [s for s in range(topo.nodes, topo.nodes + topo.switches) if s in where]
    if switches:
        fig.add_trace(go.Scatter(x=[where[s][0] for s in switches], y=[where[s][1] for s in switches],
                                 mode="markers", marker=dict(size=16, symbol="square", color="#a63"),
                                 hovertext=[f"switch {s}" for s in switches], hoverinfo="text",
                                 showlegend=False), **kw)


def _grid(count: int, cols: int) -> tuple[int, int]:
    cols = max(1, min(cols, count))
    return -(-count // cols), cols


def _ends(topo: Topology, src: int, dst: int, where) -> list[tuple[float, float, float, float, bool]]:
    """Segments ``(x0, y0, x1, y1, head)`` that draw src -> dst: one arrow, or for a torus's
    wrap-around link a stub leaving the grid at src and an arrow entering it at dst."""
    (x0, y0), (x1, y1) = where[src], where[dst]
    if not _wraps(topo, src, dst, where):
        return [(x0, y0, x1, y1, True)]
    dx = 0.0 if x1 == x0 else -math.copysign(0.45, x1 - x0)
    dy = 0.0 if y1 == y0 else -math.copysign(0.45, y1 - y0)
    return [(x0, y0, x0 + dx, y0 + dy, False), (x1 - dx, y1 - dy, x1, y1, True)]


def _arrows(topo: Topology, arrows, where, index: int) -> list[dict]:
    """``arrows``: (src, dst, colour) drawn in subplot ``index`` (1-based), as annotation dicts. The
    caller sets them on the figure once (:func:`_annotate`)."""
    suffix = "" if index == 1 else str(index)
    return [dict(x=x1, y=y1, ax=x0, ay=y0, xref=f"x{suffix}", yref=f"y{suffix}", axref=f"x{suffix}",
                 ayref=f"y{suffix}", showarrow=True, arrowhead=2 if head else 0, arrowsize=1.2, arrowwidth=2,
                 arrowcolor=colour, standoff=9 if head else 0, startstandoff=9 if (x0, y0) == where[src] else 0)
            for src, dst, colour in arrows for x0, y0, x1, y1, head in _ends(topo, src, dst, where)]


def _annotate(fig: go.Figure, annotations: list[dict]) -> None:
    """Add ``annotations`` to ``fig`` in one assignment: plotly re-validates every annotation on each
    ``add_annotation`` (quadratic: minutes for the 4x4 torus's link-use figure) and merges element by
    element in ``update_layout``."""
    fig.layout.annotations = (*fig.layout.annotations, *annotations)


def _finish(fig: go.Figure, panels: int, rows: int, cols: int, title: str) -> go.Figure:
    for i in range(1, panels + 1):
        suffix = "" if i == 1 else str(i)
        fig.layout[f"xaxis{suffix}"].update(visible=False)
        fig.layout[f"yaxis{suffix}"].update(visible=False, scaleanchor=f"x{suffix}")
    fig.update_layout(title=title, showlegend=False, plot_bgcolor="white", height=320 * rows + 80,
                      margin=dict(l=10, r=10, t=70, b=10))
    return fig


def trees_figure(topo: Topology, k: int = 2, roots: Sequence[int] | None = None, cols: int = 2) -> go.Figure:
    """MultiTree's trees for ``roots`` (default the first two ranks): one panel per tree, each
    edge an arrow parent -> child coloured by the step it is used in the all-gather (dark:
    early). The reduce-scatter uses the same edges reversed, latest first."""
    edges, steps = multitree_trees(topo, k)
    roots = list(roots) if roots is not None else list(range(min(2, topo.nodes)))
    bad = [r for r in roots if not 0 <= r < topo.nodes]
    if bad or not roots:
        raise ValueError(f"trees_figure: roots must be ranks 0..{topo.nodes - 1}, got {roots}")
    where = positions(topo)
    rows, cols = _grid(len(roots), cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[f"tree of root {r}" for r in roots],
                        horizontal_spacing=0.03, vertical_spacing=0.08)
    colours = sample_colorscale("Viridis", [t / max(steps - 1, 1) for t in range(steps)])
    arrows: list[dict] = []
    for i, root in enumerate(roots, start=1):
        row, col = (i - 1) // cols + 1, (i - 1) % cols + 1
        mine = [(c, p, t) for r, c, p, t in edges if r == root]
        _add_nodes(fig, topo, where, row, col)
        fig.add_trace(go.Scatter(x=[where[root][0]], y=[where[root][1]], mode="markers",
                                 marker=dict(size=26, color="rgba(0,0,0,0)", line=dict(color="crimson", width=3)),
                                 hoverinfo="skip", showlegend=False), row=row, col=col)
        arrows += _arrows(topo, [(p, c, colours[t]) for c, p, t in mine], where, i)
        for c, p, t in mine:   # the step number at the middle of each edge (of its arrow part)
            x0, y0, x1, y1, _ = _ends(topo, p, c, where)[-1]
            fig.add_trace(go.Scatter(x=[(x0 + x1) / 2], y=[(y0 + y1) / 2], mode="text", text=[str(t)],
                                     textfont=dict(size=11, color="#222"), hoverinfo="skip",
                                     showlegend=False), row=row, col=col)
    _annotate(fig, arrows)
    return _finish(fig, len(roots), rows, cols,
                   f"MultiTree on {topo.kind} {'x'.join(map(str, topo.dims)) or topo.nodes}, k={k}: "
                   f"{steps} all-gather steps (edge labels: the step; red ring: the root)")


def link_use_figure(schedule: Schedule, topo: Topology, steps: Sequence[int] | None = None,
                    cols: int = 4) -> go.Figure:
    """One panel per step (default: the second half, i.e. the all-gather of a MultiTree, or
    every step of a shorter schedule, at most 12): every transfer an arrow from sender to
    receiver coloured by its chunk. Each panel's title says how many transfers the step has and
    the most that share one link."""
    if schedule.nranks > topo.nodes:
        raise ValueError(f"link_use_figure: schedule has {schedule.nranks} ranks, the {topo.kind} "
                            f"{topo.nodes} nodes")
    if steps is None:
        first = schedule.num_steps // 2 if schedule.name == "multitree" else 0
        steps = list(range(first, min(schedule.num_steps, first + 12)))
    steps = list(steps)
    bad = [s for s in steps if not 0 <= s < schedule.num_steps]
    if bad or not steps:
        raise ValueError(f"link_use_figure: steps must be in 0..{schedule.num_steps - 1}, got {steps}")
    where = positions(topo)
    colours = sample_colorscale("Turbo", [c / max(schedule.nchunks - 1, 1) for c in range(schedule.nchunks)])
    titles = []
    use = link_use(schedule, topo)
    for s in steps:
        load = use[s]
        titles.append(f"step {s}: {len(schedule.steps[s])} transfers, max {max(load.values(), default=0)}/link")
    rows, cols = _grid(len(steps), cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles, horizontal_spacing=0.02,
                        vertical_spacing=0.06)
    for annotation in fig.layout.annotations:   # the subplot titles
        if annotation.text and annotation.text.startswith("step"):
            annotation.font = dict(size=11)
    arrows: list[dict] = []
    for i, s in enumerate(steps, start=1):
        row, col = (i - 1) // cols + 1, (i - 1) % cols + 1
        _add_nodes(fig, topo, where, row, col)
        arrows += _arrows(topo, [(t.src, t.dst, colours[t.chunk]) for t in schedule.steps[s]], where, i)
    _annotate(fig, arrows)
    return _finish(fig, len(steps), rows, cols,
                   f"{schedule.name} on {topo.kind}: transfers per step (colour: chunk)")


def speedup_figure(frame, title: str = "", baseline: str = "ring") -> go.Figure:
    """Speed-up over ``baseline`` (seconds of ``baseline`` / seconds of each algorithm at the same
    size) against message size, one line per algorithm, from
    :func:`~workbench.netsim.study.compare`'s rows."""
    base = frame[frame["algorithm"] == baseline].groupby("bytes")["seconds"].first()
    if base.empty:
        raise ValueError(f"speedup_figure: baseline {baseline!r} is not in the comparison; it has "
                            f"{', '.join(frame['algorithm'].unique())}")
    fig = go.Figure()
    for name, rows in frame.groupby("algorithm", sort=False):
        rows = rows.sort_values("bytes")
        speedup = base.reindex(rows["bytes"]).to_numpy() / rows["seconds"].to_numpy()
        fig.add_trace(go.Scatter(x=rows["bytes"], y=speedup, mode="lines+markers", name=name,
                                 hovertext=[f"{name} {format_size(b)}: {s:.2f}x" for b, s in
                                            zip(rows["bytes"], speedup)], hoverinfo="text"))
    sizes = sorted(frame["bytes"].unique())
    fig.update_layout(title=title, height=360, margin=dict(l=50, r=10, t=50, b=40),
                      xaxis=dict(type="log", title="all-reduce size", tickvals=sizes,
                                 ticktext=[format_size(s) for s in sizes]),
                      yaxis=dict(title=f"speed-up over {baseline}"))
    return fig
