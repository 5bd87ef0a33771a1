"""How the store writes values: JSON text for everything structured (never pickle), numpy
scalars as plain numbers, metric records as rows."""
from __future__ import annotations

import json
import math
import os
from typing import Any

import pandas as pd

#: One metric record as a row of ``metrics`` (see :func:`metric_rows`).
METRIC_ROW = "INSERT INTO metrics (run_id, seq, kind, rank, step, t, record) VALUES (?, ?, ?, ?, ?, ?, ?)"


def plain(value: Any) -> Any:
    """numpy scalars and arrays as Python values (what json can write)."""
    if hasattr(value, "tolist") and type(value).__module__ == "numpy":
        return value.tolist()
    return value


def _missing(value: Any) -> bool:
    return value is None or value is pd.NA or value is pd.NaT or (isinstance(value, float) and math.isnan(value))


def json_default(value: Any) -> Any:
    """``json.dumps(default=...)``: numpy values and paths as JSON; anything else is refused."""
    if type(value).__module__ == "numpy":
        return plain(value)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"the results store keeps JSON only; {type(value).__name__} {value!r} is not JSON")


def dumps(value: Any) -> str | None:
    """``value`` as JSON text; None stays None (SQL NULL)."""
    return None if value is None else json.dumps(value, default=json_default)


def loads(text: str | None) -> Any:
    """JSON text back to a value; NULL back to None."""
    return None if text is None else json.loads(text)


def history_records(history: pd.DataFrame) -> list[dict]:
    """A history DataFrame back to metric records (the missing fields left out, as in metrics.jsonl)."""
    return [{key: value for key, value in ((k, plain(v)) for k, v in row.items()) if not _missing(value)}
            for row in history.to_dict("records")]


def metric_rows(run_id: str, start: int, records: list[dict]) -> list[tuple]:
    """Rows for :data:`METRIC_ROW`, numbered from ``start``."""
    return [(run_id, start + i, r.get("kind"), plain(r.get("rank")), plain(r.get("step")), plain(r.get("t")),
             dumps(r)) for i, r in enumerate(records)]
