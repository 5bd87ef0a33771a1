"""``wb.Dashboard(run)``: live loss, time share per rank, per-rank timeline, status and progress.

The dashboard is an observer of the run (:class:`~workbench.results.RunObserver`): the run's
receiver thread only marks it dirty, and a timer thread redraws at most ``max_fps`` times per
second with ``batch_update`` (one message per figure). It reads ``run.history`` and
``run.trace`` (snapshots) and nothing else, so it never reaches into training. Given a finished
:class:`~workbench.results.RunResult` (from ``run.wait()`` or ``Store().load(id)``) it draws once.

Plotly's ``FigureWidget`` leaves no picture in a saved notebook: :meth:`Dashboard.show_static`
and :meth:`Dashboard.to_html` give static output.

A redraw that raises does not stop the live view: the error is logged (logger
``workbench.dashboard``, with its traceback), kept in ``Dashboard.errors`` and shown in red in the
status line from then on (how many redraws failed, and the last error).
"""
from __future__ import annotations

import html
import logging
import os
import threading
import time
from pathlib import Path

import ipywidgets as w
import plotly.graph_objects as go
import plotly.io as pio

from ..results import RunObserver
from ..optim.registry import known_definition
from .figures import (loss_figure, loss_layout, loss_traces, share_figure, share_layout, share_traces,
                      status_line, time_shares, timeline_figure, timeline_layout, timeline_traces)

SHARE_WINDOW_SECONDS = 5.0
DRAW_NICENESS = 10

log = logging.getLogger(__name__)

__all__ = ["Dashboard", "loss_figure", "share_figure", "time_shares", "timeline_figure", "status_line"]


class Dashboard(RunObserver):
    """Live (or replayed) view of one run.

    Args:
        source (Run | RunResult): a live :class:`~workbench.runtime.client.run.Run` (the dashboard observes it
            until it ends) or a :class:`~workbench.results.RunResult` (drawn once).
        window_seconds: seconds of the recent trace the timeline shows.
        max_fps: redraws per second at most (the notebook's frontend is the bottleneck).

    Attributes:
        widget (ipywidgets.VBox): what the notebook shows: the status line, the progress bar and the
            three figures.
        loss (plotly.graph_objects.FigureWidget): the loss (and test accuracy) figure; ``shares``: the time share per
            rank; ``timeline``: the per-rank timeline.
        status (ipywidgets.HTML): the status line; ``progress``: the progress bar (0 to 1).
        ranks (int): the run's ranks; ``algorithm``: its algorithm.
        redraws (int): how many redraws have completed.
        errors (list[BaseException]): the exceptions of the live loop's redraws that failed, oldest first.
    """

    def __init__(self, source, window_seconds: float = 2.0, max_fps: float = 2.0) -> None:
        self.source, self.window_seconds, self.period = source, window_seconds, 1.0 / max_fps
        self.ranks = int(source.config["ranks"])
        self.algorithm = source.config.get("algorithm")
        self.redraws = 0
        self.errors: list[BaseException] = []  # drawing errors of the live loop, oldest first
        self._status_text = ""
        self._dirty = threading.Event()
        self._finished = threading.Event()
        self._closed = threading.Event()
        # one redraw at a time: the live loop's and a caller's (the notebook's refresh() after
        # run.wait() meets the loop's last redraw); plotly's trace replacement is not thread-safe
        self._drawing = threading.Lock()
        self.loss = go.FigureWidget(layout=loss_layout())
        self.shares = go.FigureWidget(layout=share_layout(self.ranks))
        # the algorithms that reduce gradients in nonblocking buckets, and Streaming DiLoCo's fragments
        # exchanged beside the inner steps, get rows for what is in flight
        spec = known_definition(self.algorithm)
        buckets = spec is not None and (spec.reduces_gradients or spec.streaming)
        self.timeline = go.FigureWidget(layout=timeline_layout(self.ranks, [0, window_seconds * 1e3],
                                                               in_flight=buckets))
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
        """New data arrived: mark the dashboard for a redraw (called on the run's receiver thread).

        Args:
            run (Run): the run observed (the dashboard reads its source, the same run).
        """
        self._dirty.set()

    def on_finish(self, run) -> None:
        """The run ended: one last redraw, then the live loop stops.

        Args:
            run (Run): the run observed.
        """
        self._finished.set()
        self._dirty.set()

    def _loop(self) -> None:
        # Drawing is for a human at 2 Hz; the ranks may share this machine's cores (MPI ranks
        # spin while they wait), so the drawing thread yields to them (Linux: per-thread nice).
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), DRAW_NICENESS)
        except (AttributeError, OSError):
            pass
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
                    self._drawing_failed(exc)
                if finished:
                    break
                time.sleep(self.period)  # at most max_fps redraws

    # -- drawing ---------------------------------------------------------------------------
    def figures(self) -> dict[str, go.Figure]:
        """The current figures as plain ``go.Figure`` objects: ``"loss"``, ``"shares"`` and ``"timeline"``
        -> figure."""
        history, trace = self.source.history, self.source.trace
        return {"loss": loss_figure(history, algorithm=self.algorithm), "shares": share_figure(time_shares(trace, self.ranks)),
                "timeline": timeline_figure(trace, self.ranks, self.window_seconds)}

    def refresh(self) -> None:
        """Redraw everything now from the source's current data.

        Trace dicts go straight into the widgets (validated once); the first time, or when the
        number of traces changes (a rank's first loss), the widget's traces are replaced. Safe to
        call from any thread: redraws take turns.
        """
        with self._drawing:
            self._redraw()

    def _redraw(self) -> None:
        history, trace = self.source.history, self.source.trace
        timeline, x_range = timeline_traces(trace, self.ranks, self.window_seconds)
        for widget, traces in ((self.loss, loss_traces(history, self.algorithm)),
                               (self.shares, share_traces(self._shares(trace))), (self.timeline, timeline)):
            with widget.batch_update():
                if len(widget.data) == len(traces):
                    for old, new in zip(widget.data, traces):
                        old.update({k: v for k, v in new.items() if k != "type"})
                else:
                    widget.data = ()
                    widget.add_traces(traces)
                if widget is self.timeline:
                    widget.layout.xaxis.range = x_range
        text, fraction = status_line(self.source)
        self._show_status(text)
        self.progress.value = fraction
        self.redraws += 1

    def _drawing_failed(self, exc: Exception) -> None:
        """A redraw raised: log it, keep it, and say so in the status line."""
        self.errors.append(exc)
        log.error("dashboard of run %s: redraw failed (%d so far)", getattr(self.source, "run_id", "?"),
                  len(self.errors), exc_info=exc)
        try:
            text, _ = status_line(self.source)
        except Exception:  # noqa: BLE001 - the status line itself may be what fails
            text = self._status_text
        self._show_status(text)

    def _show_status(self, text: str) -> None:
        """The status line: ``text`` and, once a redraw has failed, the count and the last error."""
        self._status_text = text
        if self.errors:
            last = self.errors[-1]
            first_line = (str(last).strip().splitlines() or [""])[0]
            count = len(self.errors)
            text += (f"<br><span style='color:#b00'>drawing failed {count} time{'s' if count > 1 else ''}; "
                     f"last: {html.escape(type(last).__name__)}: {html.escape(first_line[:200])} "
                     f"(traceback in the log, logger {__name__})</span>")
        self.status.value = text

    def _shares(self, trace: list[dict]):
        """Whole-run shares for a finished run; the last ``SHARE_WINDOW_SECONDS`` while live
        (what the ranks do now, and a bounded cost per redraw)."""
        if self.source.done():
            return time_shares(trace, self.ranks)
        end = max((e["ts"] + e["dur"] for e in trace[-1000:]), default=0.0)
        start = end - SHARE_WINDOW_SECONDS * 1e6
        return time_shares([e for e in trace[-20000:] if e["ts"] + e["dur"] >= start], self.ranks,
                           start=start / 1e6)

    # -- static output ---------------------------------------------------------------------
    def to_html(self, path: str | Path) -> Path:
        """Write one standalone HTML file with the status and all figures (plotly.js embedded once),
        creating its folder.

        Args:
            path: the file to write (replaced if it exists).

        Returns:
            The path written.
        """
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
        """Stop the live redraws (the figures stay as they are)."""
        self._closed.set()
        self._dirty.set()

    def _ipython_display_(self) -> None:
        from IPython.display import display
        display(self.widget)
