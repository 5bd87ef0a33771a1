"""The dashboard: figures from a real run, replay, static HTML, live redraws at <= 2 Hz."""
from __future__ import annotations

import itertools
import logging
import sys
import threading
import time

import pandas as pd
import pytest

from workbench.config import RunConfig
from workbench.dashboard import Dashboard, time_shares
from workbench.results import RunObserver, RunResult, history_frame
from workbench.runtime.launch.batch import train

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def sync_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("sync") / "run"
    train(RunConfig(algorithm="sync-easgd", ranks=4, epochs=2), path)
    return RunResult.from_run_dir(path)


@pytest.fixture(scope="module")
def master_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("master") / "run"
    train(RunConfig(algorithm="async-easgd", ranks=3, epochs=2), path)
    return RunResult.from_run_dir(path)


def test_loss_figure_has_a_line_per_worker_and_the_accuracy(sync_run, master_run):
    for result, workers in ((sync_run, ["0", "1", "2", "3"]), (master_run, ["1", "2"])):
        dash = Dashboard(result)
        names = [t.name for t in dash.loss.data]
        assert [n.split()[-1] for n in names if n.startswith("loss rank")] == workers
        acc = [t for t in dash.loss.data if t.name.startswith("test accuracy")][0]
        evals = result.history[result.history["kind"] == "eval"]
        assert len(acc.y) == len(evals) and all(0 <= y <= 1 for y in acc.y)
        for trace in dash.loss.data:
            assert len(trace.x) > 0 and pd.Series(trace.y).notna().all()


def test_time_shares_sum_to_one_and_match_the_summary(sync_run):
    shares = time_shares(sync_run.trace, 4)
    assert list(shares.index) == ["rank 0", "rank 1", "rank 2", "rank 3"]
    assert (shares.sum(axis=1) - 1).abs().max() < 1e-6
    compute = shares["compute"].mean()
    expected = sync_run.summary["time_in"]["compute"] / sync_run.summary["wall_seconds"]
    assert compute == pytest.approx(expected, abs=0.15)
    # one definition: the dashboard's comm + wait bars are summary.json's comm_fraction (the ranks'
    # wall ends at their loop's end, the bars' at their last span: a hair apart)
    assert (shares["comm"] + shares["wait"]).mean() == pytest.approx(sync_run.summary["comm_fraction"], abs=0.02)


def test_timeline_has_one_row_per_rank_coloured_by_category(sync_run, master_run):
    for result in (sync_run, master_run):
        dash = Dashboard(result, window_seconds=0.5)
        ranks = result.ranks
        assert list(dash.timeline.layout.yaxis.categoryarray) == [f"rank {r}" for r in range(ranks)]
        bars = {t.name: t for t in dash.timeline.data if t.type == "bar"}
        assert set(bars) == {"compute", "comm", "wait", "io"}
        assert len({b.marker.color for b in bars.values()}) == 4
        assert sum(len(b.x) for b in bars.values()) > 0


def test_status_line_and_static_html(sync_run, tmp_path):
    dash = Dashboard(sync_run)
    assert f"step {sync_run.summary['steps']}/{sync_run.summary['steps']}" in dash.status.value
    assert dash.progress.value == 1.0
    html = dash.to_html(tmp_path / "report.html").read_text()
    assert html.count("plotly.js v") == 1  # the library embedded once
    for title in ("Loss and test accuracy", "Time share per rank", "Per-rank timeline"):
        assert title in html


class _Replayer:
    """A live source that replays a real run's records over ~1.5 s (drives the dashboard)."""

    def __init__(self, result: RunResult) -> None:
        self.config, self.total_steps, self.summary = result.config, result.summary["steps"], None
        self.status = "running"
        self._records = result.history.astype(object).where(result.history.notna(), None).to_dict("records")
        self._spans = result.trace
        self._n = 0
        self.observers: list[RunObserver] = []
        self.calls = 0

    @property
    def history(self):
        return history_frame([{k: v for k, v in r.items() if v is not None} for r in self._records[:self._n]])

    @property
    def trace(self):
        return self._spans[: int(len(self._spans) * self._n / len(self._records))]

    def done(self):
        return self.status != "running"

    def add_observer(self, obs):
        self.observers.append(obs)

    def play(self, seconds: float = 1.5) -> None:
        steps = 300
        for i in range(1, steps + 1):
            self._n = len(self._records) * i // steps
            for obs in self.observers:
                obs.on_data(self)
            self.calls += 1
            time.sleep(seconds / steps)
        self.status = "finished"
        for obs in self.observers:
            obs.on_finish(self)


def test_live_dashboard_redraws_at_most_twice_a_second(sync_run):
    source = _Replayer(sync_run)
    dash = Dashboard(source)
    start = time.monotonic()
    player = threading.Thread(target=source.play)
    player.start()
    player.join()
    dash._thread.join(timeout=5)
    elapsed = time.monotonic() - start
    assert not dash.errors
    # 300 data notifications in ~1.5 s: a dashboard that redrew on each would show ~300 redraws
    assert 2 <= dash.redraws <= 2 * elapsed + 2 and dash.redraws < source.calls / 10
    assert f"step {sync_run.summary['steps']}/" in dash.status.value and "finished" in dash.status.value


def test_a_redraw_that_raises_is_logged_and_shown_in_the_status_line(sync_run, monkeypatch, caplog):
    import workbench.dashboard as dashboard_module
    real, calls = dashboard_module.loss_traces, []

    def failing_after_the_first_draw(history, algorithm=None):
        calls.append(len(history))
        if len(calls) > 1:  # the constructor's draw works; every live redraw fails
            raise ValueError("cannot draw <loss>\nsecond line")
        return real(history, algorithm)

    monkeypatch.setattr(dashboard_module, "loss_traces", failing_after_the_first_draw)
    source = _Replayer(sync_run)
    with caplog.at_level(logging.ERROR, logger="workbench.dashboard"):
        dash = Dashboard(source)
        assert "drawing failed" not in dash.status.value
        player = threading.Thread(target=source.play)
        player.start()
        player.join()
        dash._thread.join(timeout=5)
    assert not dash._thread.is_alive()  # the loop survived the errors and ended with the run
    assert len(dash.errors) >= 2 and all(isinstance(e, ValueError) for e in dash.errors)
    status = dash.status.value
    assert f"drawing failed {len(dash.errors)} times" in status
    assert "ValueError: cannot draw &lt;loss&gt;" in status and "second line" not in status  # escaped, one line
    assert "finished" in status  # the rest of the status line is the run's current state
    logged = [r for r in caplog.records if r.name == "workbench.dashboard"]
    assert len(logged) == len(dash.errors)
    assert all(r.levelno == logging.ERROR and r.exc_info[0] is ValueError for r in logged)


def test_the_accuracy_line_says_whose_weights_were_evaluated():
    from workbench.dashboard.figures import loss_traces
    history = history_frame([{"kind": "eval", "rank": 0, "t": 0.5, "test_accuracy": 0.5}])
    names = {a: loss_traces(history, a)[-1]["name"] for a in ("sync-easgd", "async-sgd", "sync-sgd", "diloco",
                                                                  "streaming-diloco", "local-sgd")}
    assert names == {"sync-easgd": "test accuracy (center)", "async-sgd": "test accuracy (master's weights)",
                     "sync-sgd": "test accuracy (model)", "diloco": "test accuracy (outer model)",
                     "streaming-diloco": "test accuracy (outer model)", "local-sgd": "test accuracy (averaged model)"}


def test_the_sweep_panel_sweeps_gradient_communication_options(tmp_path):
    from types import SimpleNamespace

    from workbench.config import ConfigError
    from workbench.dashboard.sweep_panel import SweepPanel
    from workbench.store import Store
    panel = SweepPanel(SimpleNamespace(n=4), store=Store(tmp_path / "panel.sqlite"))  # build() reads only n
    panel.algorithms.value = ("sync-sgd",)
    panel.tau.value = "1"
    panel.seeds.value = "0"
    panel.fusion.value = "0, 64K, inf"
    panel.wire.value = ("fp32", "fp16")
    panel.sparse.value = "dense, 0.1"
    sweep = panel.build()
    points = {(c.fusion_bytes, c.wire_dtype, c.sparse_ratio) for _, c in sweep.points}
    assert points == {(f, w, s) for f in (0, 65536, None) for w in ("fp32", "fp16") for s in (None, 0.1)}
    panel.fusion.value = "lots"
    with pytest.raises(ConfigError, match="fusion bytes: must be 0 \\(one message per tensor\\), inf or none"):
        panel.build()


def test_the_sweep_panel_sweeps_the_period_of_each_family(tmp_path):
    """tau is the EASGD family's period, sync_every the descendants': each algorithm keeps its own."""
    from types import SimpleNamespace

    from workbench.dashboard.sweep_panel import SweepPanel
    from workbench.store import Store
    panel = SweepPanel(SimpleNamespace(n=4), store=Store(tmp_path / "panel.sqlite"))
    assert {"local-sgd", "diloco", "streaming-diloco"} <= set(panel.algorithms.options)
    panel.algorithms.value = ("sync-easgd", "diloco")
    panel.tau.value = "1, 4"
    panel.sync_every.value = "10, 50"
    panel.seeds.value = "0"
    points = {(c.algorithm, c.tau, c.sync_every) for _, c in panel.build().points}
    assert points == {("sync-easgd", 1, 10), ("sync-easgd", 4, 10), ("diloco", 1, 10), ("diloco", 1, 50)}


def test_buckets_in_flight_get_rows_and_the_status_line_shows_bytes_on_the_wire(tmp_path):
    from workbench.sizes import format_bytes
    train(RunConfig(algorithm="sync-sgd", ranks=2, epochs=1, fusion_bytes=1024, collective="ring"), tmp_path / "run")
    result = RunResult.from_run_dir(tmp_path / "run")
    dash = Dashboard(result, window_seconds=0.5)
    assert list(dash.timeline.layout.yaxis.categoryarray) == ["rank 0", "rank 0 in flight", "rank 1",
                                                              "rank 1 in flight"]
    comm = next(t for t in dash.timeline.data if t.name == "comm")
    assert {"rank 0 in flight", "rank 1 in flight"} <= set(comm.y)  # the buckets beside backward
    assert f"on the wire {format_bytes(result.summary['wire_bytes_per_step'])}/step per rank" in dash.status.value


def test_bytes_on_the_wire_come_from_the_byte_counter_not_from_spans():
    """The run's one byte counter: a finished run's summary; a live run's train records (each
    rank's counter when the record was made, after ``step`` steps); nothing without either."""
    from workbench.dashboard.figures import wire_bytes_per_step
    train_rows = pd.DataFrame([{"kind": "train", "rank": r, "step": s, "wire_bytes": 100 * (r + 1) * s}
                               for r in (0, 1) for s in range(5)])
    assert wire_bytes_per_step(None, train_rows) == (100 + 200) / 2
    assert wire_bytes_per_step({"wire_bytes_per_step": 42.0}, train_rows) == 42.0
    assert wire_bytes_per_step({}, train_rows.drop(columns="wire_bytes")) is None
    assert wire_bytes_per_step(None, train_rows.iloc[0:0]) is None


class _Flipping(_Replayer):
    """A finished source whose history alternates between one record and all of them: every
    redraw changes the number of loss traces, so each replaces the widget's traces."""

    def __init__(self, result: RunResult) -> None:
        super().__init__(result)
        self._n, self.status, self._flips = len(self._records), "finished", itertools.count()

    @property
    def history(self):
        records = self._records[:1] if next(self._flips) % 2 else self._records
        return history_frame([{k: v for k, v in r.items() if v is not None} for r in records])


def test_redraws_from_two_threads_at_once_do_not_corrupt_the_figures(sync_run):
    """The notebook's ``dashboard.refresh()`` after ``run.wait()`` meets the live loop's last redraw:
    plotly's trace replacement is not thread-safe (IndexError in its data setter, seen in the browser test)."""
    dash = Dashboard(_Flipping(sync_run))
    errors = []

    def redraw():
        try:
            for _ in range(40):
                dash.refresh()
        except Exception as exc:  # noqa: BLE001 - collected and asserted on
            errors.append(exc)

    threads = [threading.Thread(target=redraw) for _ in range(3)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as Python can: the race shows in a few redraws
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors
    assert len(dash.loss.data) == len({t.name for t in dash.loss.data})  # no trace left twice
