"""The live dashboard's redraw cost, and where it goes (a cProfile of the redraws).

A real run (Sync EASGD on the digits MLP, 4 ranks under mpiexec, 20 epochs by default) is
recorded once; a live-looking source then holds the first 25%, 50% and 100% of its metric
records and spans (``history`` is rebuilt from the record dicts on every read, as a live
:class:`~workbench.runtime.client.run.Run` does), and ``Dashboard.refresh()`` (what the drawing
thread runs, at most twice a second) is timed on it: CPU time of this thread and wall time, and
the part of that which only computes the figures' traces (the rest is the widgets:
``batch_update``, validation, serialisation to the frontend's model). With no frontend attached
nothing is sent over a comm, so this is the notebook process's own cost per redraw.

Prints the tables and the profile's top functions and writes them as JSON (default
benchmarks/results/redraw.json).

    python benchmarks/redraw.py [--epochs 20] [--redraws 20] [--quick]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import tempfile
import time
from pathlib import Path

from tabulate import tabulate

from workbench.bench.machine import Load, describe

RESULTS = Path(__file__).resolve().parent / "results"


class LiveSource:
    """A run in progress: the first ``fraction`` of a finished run's records and spans."""

    def __init__(self, result, fraction: float) -> None:
        frame = result.history
        records = frame.astype(object).where(frame.notna(), None).to_dict("records")
        self._records = [{k: v for k, v in r.items() if v is not None} for r in records]
        self._records = self._records[: max(1, int(len(self._records) * fraction))]
        trace = sorted(result.trace, key=lambda e: e["ts"] + e["dur"])
        self._spans = trace[: int(len(trace) * fraction)]
        self.config, self.total_steps, self.summary, self.status = result.config, result.summary["steps"], None, "running"
        self.run_id = result.run_id

    @property
    def history(self):
        from workbench.results import history_frame
        return history_frame(list(self._records))  # what Run.history does with its records

    @property
    def trace(self) -> list[dict]:
        return list(self._spans)

    def done(self) -> bool:
        return False


def _compute_only(dash) -> None:
    """The figure data of one redraw without touching the widgets."""
    from workbench.dashboard.figures import loss_traces, share_traces, status_line, timeline_traces
    history, trace = dash.source.history, dash.source.trace
    timeline_traces(trace, dash.ranks, dash.window_seconds)
    loss_traces(history, dash.algorithm)
    share_traces(dash._shares(trace))
    status_line(dash.source)


def _timed(fn, n: int) -> tuple[list[float], list[float]]:
    cpu, wall = [], []
    for _ in range(n):
        c, w = time.thread_time(), time.perf_counter()
        fn()
        cpu.append(time.thread_time() - c)
        wall.append(time.perf_counter() - w)
    return cpu, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--redraws", type=int, default=20, help="timed redraws per size")
    parser.add_argument("--top", type=int, default=15, help="profile rows to print")
    parser.add_argument("--quick", action="store_true", help="5 epochs, 5 redraws per size")
    parser.add_argument("--json", help="where the JSON goes (default benchmarks/results/redraw.json)")
    args = parser.parse_args()
    if args.quick:
        args.epochs, args.redraws = 5, 5
    args.json = args.json or RESULTS / "redraw.json"

    import plotly.graph_objects as go

    from workbench.config import RunConfig
    from workbench.dashboard import Dashboard
    from workbench.results import RunResult
    from workbench.runtime.launch.batch import train

    go.FigureWidget()  # one-time imports (anywidget, plotly validators) are not a per-redraw cost
    load = Load()
    with tempfile.TemporaryDirectory() as tmp:
        train(RunConfig(algorithm="sync-easgd", ranks=args.ranks, epochs=args.epochs), Path(tmp) / "run")
        result = RunResult.from_run_dir(Path(tmp) / "run")

    rows, sizes = [], []
    for fraction in (0.25, 0.5, 1.0):
        source = LiveSource(result, fraction)
        dash = Dashboard(source)  # draws once (the first draw builds the traces); no thread: no add_observer
        cpu, wall = _timed(dash.refresh, args.redraws)
        compute_cpu, _ = _timed(lambda: _compute_only(dash), args.redraws)
        size = {"fraction": fraction, "records": len(source._records), "spans": len(source._spans),
                "cpu_ms": 1e3 * statistics.median(cpu), "wall_ms": 1e3 * statistics.median(wall),
                "compute_cpu_ms": 1e3 * statistics.median(compute_cpu),
                "runs_cpu_ms": [1e3 * c for c in cpu], "runs_wall_ms": [1e3 * w for w in wall]}
        size["widgets_cpu_ms"] = size["cpu_ms"] - size["compute_cpu_ms"]
        sizes.append(size)
        rows.append([f"{fraction:.0%}", size["records"], size["spans"], f"{size['cpu_ms']:.1f}",
                     f"{size['compute_cpu_ms']:.1f}", f"{size['widgets_cpu_ms']:.1f}", f"{size['wall_ms']:.1f}"])
        if fraction < 1.0:
            dash.close()
    print(f"Dashboard.refresh(), sync-easgd digits MLP, {args.ranks} ranks, {args.epochs} epochs; "
          f"median of {args.redraws} redraws per size (load average {load.before[0]:.1f})\n")
    print(tabulate(rows, headers=["run so far", "records", "spans", "CPU ms", "of which traces",
                                  "of which widgets", "wall ms"]))

    profiler = cProfile.Profile()  # the whole run's data: where a redraw's time goes
    profiler.enable()
    for _ in range(args.redraws):
        dash.refresh()
    profiler.disable()
    dash.close()
    stats = pstats.Stats(profiler)
    total = sum(ct for (file, _, name), (_, _, _, ct, _) in stats.stats.items()
                if name == "refresh" and file.endswith("dashboard/__init__.py"))
    parts = {  # (file suffix, function) -> what it is
        ("results.py", "history_frame"): "run.history: records -> DataFrame (twice per redraw)",
        ("figures.py", "loss_traces"): "loss and accuracy traces (downsampled per worker)",
        ("__init__.py", "_shares"): "time shares of the last 5 s of spans",
        ("figures.py", "timeline_traces"): "timeline bars of the last 2 s",
        ("figures.py", "status_line"): "status line",
        ("basedatatypes.py", "update"): "plotly: new data into the widgets (validation)",
    }
    breakdown = []
    for (suffix, function), what in parts.items():
        cum = max((ct for (file, _, name), (_, _, _, ct, _) in stats.stats.items()
                   if name == function and file.endswith(suffix)), default=0.0)  # max: nested updates
        breakdown.append({"function": function, "what": what, "share_of_redraw": cum / total if total else None})
    top = sorted(((func, tottime, calls) for func, (_, calls, tottime, _, _) in stats.stats.items()),
                 key=lambda row: row[1], reverse=True)[: args.top]
    profile = [{"function": f"{Path(file).name}:{line} {name}", "calls_per_redraw": calls / args.redraws,
                "share_of_redraw_own": tottime / total} for (file, line, name), tottime, calls in top]
    print(f"\nwhere a redraw of the whole run goes (cProfile of {args.redraws} redraws; shares of the profiled "
          "time, which the profiler inflates several-fold, so shares and not milliseconds)\n")
    print(tabulate([[b["function"], b["what"], f"{b['share_of_redraw']:.0%}"] for b in breakdown],
                   headers=["function", "what", "share (cumulative)"]))
    print()
    print(tabulate([[p["function"][-70:], f"{p['calls_per_redraw']:g}", f"{p['share_of_redraw_own']:.1%}"]
                    for p in profile], headers=[f"top {args.top} by own time", "calls per redraw", "share"]))
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(25)
    Path(args.json).write_text(json.dumps({
        "algorithm": "sync-easgd", "model": "mlp", "ranks": args.ranks, "epochs": args.epochs,
        "redraws": args.redraws, "cpus": os.cpu_count(),
        "machine": describe(), "load_average": load.done(),
        "sizes": sizes, "profile_breakdown": breakdown, "profile_top_own_time": profile,
        "profile_cumulative_text": text.getvalue()}, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
