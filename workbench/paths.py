"""Where the workbench keeps what it makes once per machine or user: allreduce tuning decisions
(:mod:`workbench.comm.tuning`), the generated data sets (:mod:`workbench.generated_sets`), the clusters'
records (:mod:`workbench.runtime.client.records`). Each has an environment variable that moves it;
by default all live under ``~/.cache/workbench``. Pure (the standard library only).
"""
from __future__ import annotations

import os
from pathlib import Path

#: the words that turn a cache off (``WORKBENCH_TUNING_CACHE=none``): nothing is kept
OFF = ("", "none", "off")


def cache_home() -> Path:
    """``~/.cache/workbench``: the default home of everything below."""
    return Path.home() / ".cache" / "workbench"


def from_env(variable: str, default: str, *, may_be_off: bool = True) -> Path | None:
    """The path in the environment variable ``variable``, else ``cache_home() / default``. With
    ``may_be_off``, the variable set to ``none``, ``off`` or nothing means keep nothing (None)."""
    value = os.environ.get(variable)
    if value is None:
        return cache_home() / default
    if may_be_off and value.strip().lower() in OFF:
        return None
    return Path(value)


def state_dir() -> Path:
    """Where clusters (notebook clusters, virtual clusters) are recorded: ``$WORKBENCH_STATE_DIR`` or
    ``~/.cache/workbench``."""
    return from_env("WORKBENCH_STATE_DIR", "", may_be_off=False)
