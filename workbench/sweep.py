"""Parameter sweeps: every combination of a grid, for several seeds, each run stored.

    sweep = wb.Sweep(wb.RunConfig(algorithm="async-easgd", epochs=5),
                     grid={"algorithm": ["async-easgd", "async-sgd"], "tau": [1, 4, 16]},
                     seeds=[0, 1])
    frame = sweep.run(cluster)          # tqdm progress; resumable; failures recorded, not fatal
    sweep.plot()                        # time to target accuracy against tau, per algorithm

Every configuration is validated before the first launch (a bad grid value is a
:class:`~workbench.config.ConfigError` naming it). The sweep's id is a hash of its definition,
so running the same sweep again (after a kernel restart) skips the configurations that already
finished in the store, and retries the failed ones.

Defaults follow the grid: ``lr``, ``momentum`` and ``rho`` left at the base algorithm's defaults
are re-derived for each grid point's algorithm (each algorithm's own default learning rate, and
``rho = 0.9 / (workers * lr)``), unless the grid or the base sets them explicitly.

Options are shared by the grid's algorithms: a point whose algorithm ignores one (``tau`` on
sync-sgd, ``rho`` on the SGD baselines, ``collective`` on the master-based algorithms; see
:func:`~workbench.config.ignored_options`) runs without it, with one warning per sweep, where a
single ``RunConfig`` would refuse it.
"""
from __future__ import annotations

import itertools
import json
import threading
from dataclasses import fields
from typing import Any, Callable

import pandas as pd

from .config import ConfigError, RunConfig, without_ignored
from .results import RunResult

def _base_values(base: RunConfig | dict) -> dict[str, Any]:
    """The base's fields as given (a RunConfig keeps ``lr=None`` etc.: each point derives its own)."""
    if isinstance(base, dict):
        RunConfig(**base)  # validate now
        return dict(base)
    return base.to_dict()


class Sweep:
    """A grid of run configurations times seeds.

    Args:
        base: the configuration every point starts from (RunConfig or dict of its fields).
        grid: field name -> list of values; every combination is one configuration.
        seeds: seeds to run each configuration with.
        name: a label (part of the sweep's identity).
        target_accuracy: test accuracy (a fraction in [0, 1]) for the time-to-target column and plot.
        store (Store | str | PathLike | None): a :class:`~workbench.store.Store`, a path, or None for the
            default store.

    Raises:
        ConfigError: a grid key that is no RunConfig field, a grid value that is not a non-empty list, no
            seeds, or a base or a point (named by its values and seed) that RunConfig refuses; all checked
            before anything runs.
        TypeError: a base dict with a key that is no RunConfig field.

    Warns:
        UserWarning: once per sweep, naming the options a point's algorithm ignores (its points run
            without them).

    Attributes:
        points (list[tuple[str, RunConfig]]): ``(key, RunConfig)`` of every point, validated; ``key`` is
            the point's grid values and seed as JSON (its ``sweep_key`` in the store).
        sweep_id (str): the sweep's id in the store, a hash of its definition (``sweep-<12 hex>``).
        store (Store): the :class:`~workbench.store.Store` its runs are recorded in.
        base (dict): the base's fields as given; ``grid``, ``seeds``, ``name``, ``target_accuracy``: as given.
        current_run (Run | None): the :class:`~workbench.runtime.client.run.Run` going on now (None between points).
    """

    def __init__(self, base: RunConfig | dict, grid: dict[str, list], seeds: list[int] = (0,), *,
                 name: str = "sweep", target_accuracy: float = 0.9, store=None) -> None:
        names = {f.name for f in fields(RunConfig)}
        for key, values in grid.items():
            if key not in names:
                raise ConfigError(f"grid: unknown parameter {key!r}; allowed: {', '.join(sorted(names))}")
            if not isinstance(values, (list, tuple)) or not values:
                raise ConfigError(f"grid[{key!r}]: a non-empty list of values, got {values!r}")
        if not seeds:
            raise ConfigError("seeds: give at least one seed")
        self.base, self.grid, self.seeds = _base_values(base), dict(grid), list(seeds)
        self.name, self.target_accuracy = name, target_accuracy
        from .store import Store
        self.store = store if isinstance(store, Store) else Store(store)
        self.points = self._points()  # validated here, before anything is launched
        self.sweep_id = self.store.create_sweep(name, self.base, self.grid, self.seeds)
        self._stop = threading.Event()
        self.current_run = None

    def _points(self) -> list[tuple[str, RunConfig]]:
        points, dropped = [], {}
        keys = list(self.grid)
        for combo in itertools.product(*(self.grid[k] for k in keys)):
            for seed in self.seeds:
                values, ignored = without_ignored({**self.base, **dict(zip(keys, combo)), "seed": seed})
                for name in ignored:
                    dropped.setdefault(values.get("algorithm"), set()).add(name)
                where = ", ".join(f"{k}={v!r}" for k, v in zip(keys, combo))
                try:
                    cfg = RunConfig(**values)
                except ConfigError as exc:
                    raise ConfigError(f"sweep point {where}, seed={seed}: {exc}") from None
                key = json.dumps({**dict(zip(keys, combo)), "seed": seed}, sort_keys=True)
                points.append((key, cfg))
        if dropped:
            import warnings
            warnings.warn("sweep: " + "; ".join(f"{a} ignores {', '.join(sorted(n))}: its points run without it"
                                                for a, n in dropped.items()), stacklevel=3)
        return points

    def __len__(self) -> int:
        return len(self.points)

    def pending(self) -> list[tuple[str, RunConfig]]:
        """Points not yet finished in the store (failed ones are retried), as ``(key, RunConfig)``."""
        done = self.store.finished_keys(self.sweep_id)
        return [(key, cfg) for key, cfg in self.points if key not in done]

    def stop(self) -> None:
        """Stop :meth:`run` before its next point, after cancelling the current run (10 s for its ranks to
        stop); from another thread, e.g. a Stop button."""
        self._stop.set()
        if self.current_run is not None and not self.current_run.done():
            self.current_run.cancel(timeout=10)

    def run(self, cluster, *, progress: bool = True, run_timeout: float = 3600.0,
            on_result: Callable[[str, RunResult | None, str | None], None] | None = None) -> pd.DataFrame:
        """Run every pending point on ``cluster``, one after another; return :meth:`results`.

        A point that fails (a failed run, a refused configuration, a timeout) is recorded with its
        error and the sweep goes on.

        Args:
            cluster (Cluster): the :class:`~workbench.runtime.client.cluster.Cluster` to train on.
            progress: show a tqdm progress bar of the points.
            run_timeout: seconds before a point's run is cancelled.
            on_result: called as ``on_result(key, result, error)`` after each point, ``result`` None
                and ``error`` the message when it failed (the sweep panel updates its table there).

        Returns:
            :meth:`results`: one row per run of the sweep.
        """
        from tqdm.auto import tqdm

        from .runtime.client.run import RunError
        self._stop.clear()
        todo = self.pending()
        bar = tqdm(total=len(self.points), initial=len(self.points) - len(todo), desc=self.name,
                   disable=not progress, unit="run")
        try:
            for key, cfg in todo:
                if self._stop.is_set():
                    break
                result, error = None, None
                try:
                    self.current_run = cluster.train(cfg, store=self.store, timeout=run_timeout,
                                                     sweep_id=self.sweep_id, sweep_key=key)
                    result = self.current_run.wait()
                except (RunError, ConfigError, TimeoutError) as exc:
                    error = str(exc)
                bar.update(1)
                bar.set_postfix_str(f"{cfg.algorithm} {'failed' if error else 'ok'}")
                if on_result is not None:
                    on_result(key, result, error)
        finally:
            bar.close()
            self.current_run = None
        return self.results()

    def results(self) -> pd.DataFrame:
        """One row per run of this sweep (from the store), with the grid's parameters, the
        seed and ``time_to_target`` (seconds to ``target_accuracy``, NaN if never reached)."""
        return self.store.sweep_runs(self.sweep_id, target_accuracy=self.target_accuracy)

    def summary(self, by: list[str] | None = None) -> pd.DataFrame:
        """Median and spread over seeds of time to target and final accuracy per configuration, from the
        finished runs.

        Args:
            by: the columns that make a configuration (default: the grid's parameters).

        Returns:
            One row per configuration: ``runs``, ``time_to_target_median``, ``_min`` and ``_max`` (seconds),
                ``final_accuracy_median`` and ``comm_fraction_median``; empty when no run is stored.
        """
        frame = self.results()
        by = by or list(self.grid)
        if frame.empty:
            return frame
        done = frame[frame["status"] == "finished"]
        return done.groupby(by).agg(runs=("run_id", "count"),
                                    time_to_target_median=("time_to_target", "median"),
                                    time_to_target_min=("time_to_target", "min"),
                                    time_to_target_max=("time_to_target", "max"),
                                    final_accuracy_median=("final_test_accuracy", "median"),
                                    comm_fraction_median=("comm_fraction", "median")).reset_index()

    def plot(self, x: str | None = None, y: str = "time_to_target", color: str | None = None):
        """A plotly figure of ``y`` against ``x``, one line per ``color``, median over seeds of the finished
        runs with min-max error bars.

        Args:
            x: a column of :meth:`results` (default: the first grid parameter other than ``algorithm``,
                else ``algorithm``).
            y: the column plotted (default ``time_to_target``, seconds).
            color: the column whose values are the lines (default: ``algorithm`` if it is in the grid).

        Returns:
            (plotly.graph_objects.Figure): The figure (no line when no run finished).
        """
        import plotly.graph_objects as go
        frame = self.results()
        keys = list(self.grid)
        x = x or next((k for k in keys if k != "algorithm"), keys[0])
        color = color or ("algorithm" if "algorithm" in keys and x != "algorithm" else None)
        fig = go.Figure()
        if not frame.empty:
            done = frame[frame["status"] == "finished"]
            groups = done.groupby(color) if color else [(self.base.get("algorithm", "runs"), done)]
            for label, part in groups:
                stats = part.groupby(x)[y].agg(["median", "min", "max"]).reset_index().sort_values(x)
                fig.add_trace(go.Scatter(
                    x=stats[x], y=stats["median"], name=str(label), mode="lines+markers",
                    error_y=dict(type="data", symmetric=False, array=stats["max"] - stats["median"],
                                 arrayminus=stats["median"] - stats["min"])))
        label = f"seconds to {self.target_accuracy:g} test accuracy" if y == "time_to_target" else y
        fig.update_layout(title=f"{self.name}: {label} (median over seeds, min-max bars)",
                          xaxis_title=x, yaxis_title=label, template="plotly_white")
        return fig

    def __repr__(self) -> str:
        return (f"<workbench.Sweep {self.name!r} {self.sweep_id}: {len(self.points)} runs, "
                f"{len(self.pending())} pending>")
