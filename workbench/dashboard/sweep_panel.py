"""``wb.SweepPanel(cluster)``: choose a sweep with widgets, launch and stop it, watch it fill in.

The sweep runs in a background thread (the notebook stays usable); every finished point adds a
row to the results table and redraws the plot. Stop cancels the run in progress and ends the
sweep; launching the same choices again resumes it (finished points are skipped: the sweep's id
is a hash of its definition, see :mod:`workbench.sweep`). Errors (a sweep that stops, a redraw
that raises) are shown in the panel's status line and logged (logger ``workbench.dashboard.sweep_panel``);
a redraw that raises does not stop the sweep.
"""
from __future__ import annotations

import html
import logging
import threading

import ipywidgets as w
import plotly.graph_objects as go

from ..comm.options import WIRE_DTYPES
from ..config import ConfigError, RunConfig
from ..optim.registry import ALGORITHMS

log = logging.getLogger(__name__)


def _numbers(text: str, kind=float, name: str = "value") -> list:
    """``"0.05, 0.1"`` -> [0.05, 0.1]; a clear error naming the field otherwise."""
    try:
        values = [kind(part) for part in text.replace(";", ",").split(",") if part.strip()]
    except ValueError:
        raise ConfigError(f"{name}: comma-separated {kind.__name__} values, got {text!r}") from None
    if not values:
        raise ConfigError(f"{name}: give at least one value")
    return values


def _fusion(text: str) -> int | None:
    """A fusion threshold as the CLI takes it (``0``, ``64K``, ``inf``), or a ConfigError."""
    from ..sizes import parse_fusion_bytes
    try:
        return parse_fusion_bytes(text)
    except ValueError as exc:
        raise ConfigError(f"fusion bytes: {exc}") from None


class SweepPanel:
    """Widgets to define, launch and stop a sweep on ``cluster``, with live progress,
    a results table and a plot of time to target accuracy."""

    def __init__(self, cluster, *, store=None, name: str = "panel-sweep") -> None:
        self.cluster, self.store, self.name = cluster, store, name
        self.sweep = None
        self._thread: threading.Thread | None = None
        style = {"description_width": "110px"}
        self.algorithms = w.SelectMultiple(options=list(ALGORITHMS), value=("async-easgd", "async-sgd"),
                                           rows=len(ALGORITHMS), description="algorithms", style=style)
        self.lr = w.Text(value="", placeholder="defaults per algorithm", description="lr values", style=style)
        self.rho = w.Text(value="", placeholder="0.9/(workers*lr)", description="rho values", style=style)
        self.tau = w.Text(value="1, 4", description="tau values", style=style)
        # EASGD's descendants: their period (tau is the EASGD family's)
        self.sync_every = w.Text(value="", placeholder="10", description="sync every", style=style)
        self.ranks = w.IntRangeSlider(value=(cluster.n, cluster.n), min=2, max=cluster.n, description="ranks",
                                      style=style)
        self.seeds = w.Text(value="0, 1", description="seeds", style=style)
        self.epochs = w.BoundedIntText(value=3, min=1, max=1000, description="epochs", style=style)
        # gradient communication (sync-sgd; fusion also sync-easgd): each a list of values to sweep
        self.fusion = w.Text(value="", placeholder="inf (one message per step)", description="fusion bytes",
                             style=style)
        self.wire = w.SelectMultiple(options=list(WIRE_DTYPES), value=("fp32",), rows=3, description="wire dtype",
                                     style=style)
        self.sparse = w.Text(value="", placeholder="dense", description="sparse ratio", style=style)
        self.target = w.BoundedFloatText(value=0.9, min=0.1, max=1.0, step=0.01, description="target acc",
                                         style=style)
        self.launch = w.Button(description="Launch", button_style="success", icon="play")
        self.stop_button = w.Button(description="Stop", button_style="danger", icon="stop", disabled=True)
        self.progress = w.IntProgress(value=0, min=0, max=1, description="runs")
        self.status = w.HTML("choose, then Launch")
        self.table = w.HTML()
        self.figure = go.FigureWidget(layout=dict(height=320, template="plotly_white",
                                                  title="time to target accuracy"))
        self.launch.on_click(lambda _: self.start())
        self.stop_button.on_click(lambda _: self.stop())
        controls = w.VBox([self.algorithms, self.lr, self.rho, self.tau, self.sync_every, self.ranks, self.seeds, self.epochs,
                           self.fusion, self.wire, self.sparse, self.target,
                           w.HBox([self.launch, self.stop_button])])
        self.widget = w.VBox([w.HBox([controls, w.VBox([self.progress, self.status, self.table])]),
                              self.figure])

    def _ipython_display_(self):
        from IPython.display import display
        display(self.widget)

    def build(self):
        """The :class:`~workbench.sweep.Sweep` the widgets describe (validated)."""
        from ..sweep import Sweep
        if not self.algorithms.value:
            raise ConfigError("algorithms: choose at least one")
        grid: dict = {"algorithm": list(self.algorithms.value), "tau": _numbers(self.tau.value, int, "tau")}
        if self.lr.value.strip():
            grid["lr"] = _numbers(self.lr.value, float, "lr")
        if self.rho.value.strip():
            grid["rho"] = _numbers(self.rho.value, float, "rho")
        if self.sync_every.value.strip():
            grid["sync_every"] = _numbers(self.sync_every.value, int, "sync every")
        if self.fusion.value.strip():
            grid["fusion_bytes"] = [_fusion(part) for part in self.fusion.value.replace(";", ",").split(",")
                                    if part.strip()]
        if tuple(self.wire.value) != ("fp32",):
            if not self.wire.value:
                raise ConfigError("wire dtype: choose at least one")
            grid["wire_dtype"] = list(self.wire.value)
        if self.sparse.value.strip():
            grid["sparse_ratio"] = [None if part.strip().lower() in ("dense", "none") else _numbers(part, float,
                                                                                                  "sparse ratio")[0]
                                    for part in self.sparse.value.replace(";", ",").split(",") if part.strip()]
        low, high = self.ranks.value
        if low != high:
            grid["ranks"] = list(range(low, high + 1))
        base = RunConfig(algorithm=grid["algorithm"][0], ranks=high, epochs=self.epochs.value)
        return Sweep(base, grid, seeds=_numbers(self.seeds.value, int, "seeds"), name=self.name,
                     target_accuracy=self.target.value, store=self.store)

    def start(self) -> None:
        """Launch (or resume) the sweep in a background thread."""
        if self._thread is not None and self._thread.is_alive():
            return
        try:
            self.sweep = self.build()
        except ConfigError as exc:
            self.status.value = f"<b style='color:#b00'>{exc}</b>"
            return
        total, pending = len(self.sweep), len(self.sweep.pending())
        self.progress.max, self.progress.value = total, total - pending
        self.status.value = f"sweep {self.sweep.sweep_id}: {pending} of {total} runs to go"
        self.launch.disabled, self.stop_button.disabled = True, False
        self._thread = threading.Thread(target=self._run, daemon=True, name="sweep-panel")
        self._thread.start()

    def _run(self) -> None:
        try:
            self.sweep.run(self.cluster, progress=False, on_result=self._on_result)
            self.status.value = f"done: {self.progress.value} of {self.progress.max} runs"
        except Exception as exc:  # noqa: BLE001 - shown in the panel, not lost in a thread
            log.error("sweep panel: sweep %s stopped", getattr(self.sweep, "sweep_id", "?"), exc_info=exc)
            self.status.value = f"<b style='color:#b00'>sweep stopped: {html.escape(str(exc))}</b>"
        finally:
            self.launch.disabled, self.stop_button.disabled = False, True
            self._redraw()

    def _on_result(self, key: str, result, error: str | None) -> None:
        self.progress.value += 1
        self.status.value = (f"{self.progress.value}/{self.progress.max} " +
                             (f"<span style='color:#b00'>{key} failed: {error.splitlines()[0]}</span>"
                              if error else f"{key} finished"))
        self._redraw()

    def _redraw(self) -> None:
        """:meth:`refresh` from the sweep's thread: a drawing error is logged and shown in the
        status line, and the sweep goes on."""
        try:
            self.refresh()
        except Exception as exc:  # noqa: BLE001 - drawing must not end the sweep
            log.error("sweep panel: redraw failed", exc_info=exc)
            first_line = (str(exc).strip().splitlines() or [""])[0]
            self.status.value += (f"<br><span style='color:#b00'>drawing failed: {type(exc).__name__}: "
                                  f"{html.escape(first_line[:200])}</span>")

    def stop(self) -> None:
        """Cancel the run in progress and end the sweep."""
        if self.sweep is not None:
            self.status.value = "stopping..."
            threading.Thread(target=self.sweep.stop, daemon=True).start()

    def wait(self, timeout: float | None = None) -> None:
        """Block until the background sweep ends (for scripts and tests)."""
        if self._thread is not None:
            self._thread.join(timeout)

    def refresh(self) -> None:
        """Redraw the results table and the plot from the store."""
        if self.sweep is None:
            return
        frame = self.sweep.results()
        if frame.empty:
            return
        columns = [c for c in ("algorithm", "tau", "sync_every", "lr", "rho", "ranks", "fusion_bytes", "wire_dtype", "sparse_ratio",
                               "seed", "status", "final_test_accuracy", "time_to_target", "comm_fraction",
                               "wire_bytes") if c in frame.columns]
        self.table.value = frame[columns].to_html(index=False, float_format=lambda v: f"{v:.3g}")
        figure = self.sweep.plot()
        with self.figure.batch_update():
            self.figure.data = ()
            for trace in figure.data:
                self.figure.add_trace(trace)
            self.figure.layout.title = figure.layout.title
            self.figure.layout.xaxis.title = figure.layout.xaxis.title
            self.figure.layout.yaxis.title = figure.layout.yaxis.title
