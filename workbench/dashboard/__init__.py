"""``wb.Dashboard(run)``: live loss, time share per rank, per-rank timeline, status and progress.

The dashboard is an observer of the run (:class:`~workbench.results.RunObserver`): the run's
receiver thread only marks it dirty, and a timer thread redraws at most ``max_fps`` times per
second with ``batch_update`` (one message per figure). It reads ``run.history`` and
``run.trace`` (snapshots) and nothing else, so it never reaches into training. Given a finished
:class:`~workbench.results.RunResult` (from ``run.wait()`` or ``Store().load(id)``) it draws once.

Plotly's ``FigureWidget`` leaves no picture in a saved notebook: :meth:`Dashboard.show_static`
and :meth:`Dashboard.to_html` give static output.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path

import ipywidgets as w
import plotly.graph_objects as go
import plotly.io as pio

from ..results import RunObserver
from .figures import loss_figure, share_figure, status_line, time_shares, timeline_figure

__all__ = ["Dashboard", "loss_figure", "share_figure", "time_shares", "timeline_figure", "status_line"]


class Dashboard(RunObserver):
    """Live (or replayed) view of one run.

    Args:
        source: a live :class:`~workbench.runtime.run.Run` or a :class:`~workbench.results.RunResult`.
        window_seconds: how much of the recent trace the timeline shows.
        max_fps: redraws per second at most (the notebook's frontend is the bottleneck).
    """

    def __init__(self, source, window_seconds: float = 2.0, max_fps: float = 2.0) -> None:
        self.source, self.window_seconds, self.period = source, window_seconds, 1.0 / max_fps
        self.ranks = int(source.config["ranks"])
        self.redraws = 0
        self.errors: list[BaseException] = []
        self._dirty = threading.Event()
        self._finished = threading.Event()
        self._closed = threading.Event()
        self.loss = go.FigureWidget(loss_figure(source.history))
        self.shares = go.FigureWidget(share_figure(time_shares(source.trace, self.ranks)))
        self.timeline = go.FigureWidget(timeline_figure(source.trace, self.ranks, window_seconds))
        self.status = w.HTML()
        self.progress = w.FloatProgress(value=0.0, min=0.0, max=1.0, description="progress",
                                        layout=w.Layout(width="60%"))
        self.widget = w.VBox([self.status, self.progress, self.loss, w.HBox([self.shares]), self.timeline])
        self.refresh()
        self._thread = None
        if hasattr(source, "add_observer") and not source.done():
            self._thread = threading.Thread(target=self._loop, daemon=True, name="dashboard")
            self._thread.start()
            source.add_observer(self)

    # -- observer hooks (called on the run's receiver thread: keep them cheap) --------------
    def on_data(self, run) -> None:
        self._dirty.set()

    def on_finish(self, run) -> None:
        self._finished.set()
        self._dirty.set()

    def _loop(self) -> None:
        while not self._closed.is_set():
            self._dirty.wait(0.5)
            if self._closed.is_set():
                break
            if self._dirty.is_set():
                self._dirty.clear()
                finished = self._finished.is_set()
                try:
                    self.refresh()
                except Exception as exc:  # noqa: BLE001 - a drawing error must not kill the loop
                    self.errors.append(exc)
                if finished:
                    break
                time.sleep(self.period)  # at most max_fps redraws

    # -- drawing ---------------------------------------------------------------------------
    def figures(self) -> dict[str, go.Figure]:
        """The current figures as plain ``go.Figure`` objects (name -> figure)."""
        history, trace = self.source.history, self.source.trace
        return {"loss": loss_figure(history), "shares": share_figure(time_shares(trace, self.ranks)),
                "timeline": timeline_figure(trace, self.ranks, self.window_seconds)}

    def refresh(self) -> None:
        """Redraw everything now from the source's current data."""
        figures = self.figures()
        for widget, figure in ((self.loss, figures["loss"]), (self.shares, figures["shares"]),
                               (self.timeline, figures["timeline"])):
            with widget.batch_update():
                if len(widget.data) == len(figure.data):
                    for old, new in zip(widget.data, figure.data):
                        old.update(new.to_plotly_json(), overwrite=True)
                else:
                    widget.data = ()
                    widget.add_traces(list(figure.data))
                widget.layout.update(figure.layout.to_plotly_json(), overwrite=True)
        text, fraction = status_line(self.source)
        self.status.value, self.progress.value = text, fraction
        self.redraws += 1

    # -- static output ---------------------------------------------------------------------
    def to_html(self, path: str | Path) -> Path:
        """One standalone HTML file with the status and all figures (plotly.js embedded once)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self._html(full=True))
        return path

    def _html(self, full: bool) -> str:
        text, _ = status_line(self.source)
        parts = [pio.to_html(fig, full_html=False, include_plotlyjs=(i == 0) if full else (i == 0 and "require"),
                             default_width="100%") for i, fig in enumerate(self.figures().values())]
        body = f"<div style='font-family:sans-serif'>{text}</div>" + "".join(parts)
        if not full:
            return body
        return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>workbench run "
                f"{getattr(self.source, 'run_id', '')}</title></head><body>{body}</body></html>")

    def show_static(self) -> None:
        """Display the figures as static HTML (survives saving the notebook)."""
        from IPython.display import HTML, display
        display(HTML(self._html(full=True)))

    def close(self) -> None:
        self._closed.set()
        self._dirty.set()

    def _ipython_display_(self) -> None:
        from IPython.display import display
        display(self.widget)
