"""Where a measurement ran: every benchmark JSON records the machine and its load average.

    from workbench.bench.machine import Load, describe
    load = Load()                 # the load average now, before measuring
    ...                           # measure
    report = {..., "machine": describe(), "load_average": load.done()}

Machines that run the benchmarks are often shared (other jobs, a test suite): timings move with
the load, by 2x and more on a 2-core machine, so a number is only readable beside the load it was
measured under and the machine it ran on. One helper, so that every JSON spells both the same
way: ``machine`` = ``{"host", "cpus", "system", "python"}``; ``load_average`` = ``{"before":
[1, 5, 15 min], "after": [...]}`` (``os.getloadavg``). Standard library only.
"""
from __future__ import annotations

import os
import platform


def describe() -> dict:
    """This machine: host name, logical CPUs, operating system and kernel, Python version."""
    return {"host": platform.node(), "cpus": os.cpu_count(), "system": platform.platform(),
            "python": platform.python_version()}


class Load:
    """The load average before a measurement (taken when built) and after it (:meth:`done`)."""

    def __init__(self) -> None:
        self.before = list(os.getloadavg())

    def done(self) -> dict:
        """``{"before": [1, 5, 15 min], "after": [1, 5, 15 min]}``: the load averages around the run."""
        return {"before": self.before, "after": list(os.getloadavg())}


def write_report(path, report: dict, load: Load) -> None:
    """``report`` with the load around the run (``load.done()``) as JSON at ``path`` (its folder made),
    and a line saying where."""
    import json
    from pathlib import Path
    report["load_average"] = load.done()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(report, indent=1, default=str))
    print(f"\nwrote {path}")


def wall_and_faults(call, steps: int) -> tuple[float, float]:
    """Median wall milliseconds and minor page faults of this process per ``call()``, over
    ``steps`` calls after one untimed (a model-sized temporary's cost is mostly its page faults)."""
    import resource
    import statistics
    import time
    wall, faults = [], []
    for i in range(steps + 1):
        f, w = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
        call()
        w, f = time.perf_counter() - w, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f
        if i:
            wall.append(w)
            faults.append(f)
    return statistics.median(wall) * 1e3, statistics.median(faults)
