"""Fit the simulator's link latency and bandwidth to all-reduces measured on real MPI.

    cal = calibrate("benchmarks/results/allreduce_4ranks.json", topology.bus(4))
    cal.link_latency, cal.link_bandwidth        # seconds per hop, bytes per second
    cal.table                                   # measured vs predicted, per algorithm and size
    cal.simulate(schedules.multitree(topology.torus(8, 8)), topology.torus(8, 8), 64 << 20)

The lock-step model is linear in its two parameters: a schedule's simulated time is
``alpha * H + beta * V``, where ``H`` (hops on the critical path, summed over steps) and ``V``
(bytes on the busiest link, summed over steps) come from two runs of the simulator. The fit is
a non-negative least squares on *relative* errors, so a 4 KiB all-reduce counts as much as a
64 MiB one. The measurements are ``workbench bench allreduce --json`` files (median seconds
per algorithm and size); rows for ``native``, ``auto`` and ``gloo`` are not schedules and are
left out.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from .. import schedules
from ..schedules.schedule import Schedule
from .simulator import SimResult, simulate
from ..network.topology import Topology, fully_connected


class CalibrationError(ValueError):
    """A measurements file that is missing, lacks columns or cannot be fitted."""


def load_measurements(source) -> pd.DataFrame:
    """``algorithm, bytes, seconds`` rows from a bench JSON file (path or its parsed dict), a
    DataFrame or a list of dicts with those keys (``median_s`` is read as ``seconds``)."""
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.exists():
            raise CalibrationError(f"calibrate: no measurements at {path} (make one with "
                                "`workbench bench allreduce --json FILE`)")
        source = json.loads(path.read_text())
    if isinstance(source, dict):
        source = source.get("results", [])
    frame = pd.DataFrame(source).rename(columns={"median_s": "seconds"})
    missing = {"algorithm", "bytes", "seconds"} - set(frame.columns)
    if missing:
        raise CalibrationError(f"calibrate: measurements lack the column(s) {sorted(missing)}")
    frame = frame[frame["algorithm"].isin(list(schedules.SCHEDULES))]
    if frame.empty:
        raise CalibrationError("calibrate: no measurements of a schedule algorithm "
                            f"({', '.join(schedules.SCHEDULES)})")
    return frame[["algorithm", "bytes", "seconds"]].reset_index(drop=True)


@dataclass
class Calibration:
    """Fitted ``link_latency`` (s per hop) and ``link_bandwidth`` (bytes/s) on ``topology``,
    and ``table``: measured vs predicted seconds and the relative error per measurement."""

    link_latency: float
    link_bandwidth: float
    topology: Topology
    nranks: int
    table: pd.DataFrame

    def simulate(self, schedule: Schedule, topo: Topology, nbytes: float, **options) -> SimResult:
        """What ``schedule`` would cost on ``topo`` with links like the measured ones."""
        return simulate(schedule, topo, nbytes, link_bandwidth=self.link_bandwidth,
                        link_latency=self.link_latency, **options)

    def within(self, tolerance: float = 0.25) -> float:
        """Share of the measurements predicted within ``tolerance`` (relative)."""
        return float((self.table["error"].abs() <= tolerance).mean())

    def __repr__(self) -> str:
        return (f"Calibration({self.topology.kind}, {self.nranks} ranks: latency {self.link_latency * 1e6:.2f} us"
                f"/hop, bandwidth {self.link_bandwidth / 1e9:.3f} GB/s; {self.within():.0%} of "
                f"{len(self.table)} measurements within 25%)")


def calibrate(measurements, topo: Topology | None = None) -> Calibration:
    """Fit latency and bandwidth so the lock-step simulator reproduces ``measurements``.

    ``topo`` is the network the ranks ran on, as a model (default ``fully_connected(n)`` with
    ``n`` the rank count recorded in the bench file, else 4). Ranks of one host share memory
    bandwidth: :func:`~workbench.network.topology.bus` models that.
    """
    nranks = None
    if isinstance(measurements, (str, Path)) and Path(measurements).exists():
        nranks = json.loads(Path(measurements).read_text()).get("ranks")
    elif isinstance(measurements, dict):
        nranks = measurements.get("ranks")
    frame = load_measurements(measurements)
    nranks = topo.nodes if topo is not None else int(nranks or 4)
    topo = topo if topo is not None else fully_connected(nranks)
    hops, volume = [], []
    for algorithm, nbytes in zip(frame["algorithm"], frame["bytes"]):
        schedule = schedules.SCHEDULES[algorithm](nranks)
        hops.append(simulate(schedule, topo, nbytes, link_bandwidth=1e300, link_latency=1.0).seconds)
        volume.append(simulate(schedule, topo, nbytes, link_bandwidth=1.0, link_latency=0.0).seconds)
    features = np.column_stack([hops, volume])
    measured = frame["seconds"].to_numpy(dtype=float)
    weights = 1.0 / measured
    (alpha, beta), _ = nnls(features * weights[:, None], measured * weights)
    if beta <= 0:
        raise CalibrationError("calibrate: the measurements do not grow with size; cannot fit a bandwidth")
    table = frame.rename(columns={"seconds": "measured_s"})
    table["predicted_s"] = features @ np.array([alpha, beta])
    table["error"] = table["predicted_s"] / table["measured_s"] - 1.0
    return Calibration(float(alpha), float(1.0 / beta), topo, nranks, table)


def calibrate_file(path, topo: Topology | None = None) -> Calibration:
    """:func:`calibrate` of a ``workbench bench allreduce --json`` file on ``topo``, by default a
    :func:`~workbench.network.topology.bus` of the file's ranks (ranks of one host share its memory
    bandwidth: what ``workbench calibrate``, ``predict`` and ``plan`` assume)."""
    from ..network.topology import bus
    if topo is None:
        path = Path(path)
        ranks = json.loads(path.read_text()).get("ranks", 4) if path.exists() else 4
        topo = bus(int(ranks))
    return calibrate(path, topo)
