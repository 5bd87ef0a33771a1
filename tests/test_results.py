"""Figures read from a run's records (:mod:`workbench.results`)."""
from __future__ import annotations

import pytest

from workbench.results import history_frame, step_seconds


def test_step_seconds_take_the_slowest_rank_of_each_step_in_a_row():
    t = {0: [0.0, 1.0, 3.0, 4.5, 9.0], 1: [0.2, 1.5, 3.1, 4.6, 9.1]}  # rank 1 is late at step 1
    records = [{"kind": "train", "rank": r, "step": s, "t": v} for r, ts in t.items() for s, v in enumerate(ts)]
    records += [{"kind": "eval", "rank": 0, "t": 20.0, "step": 5, "test_accuracy": 0.5}]  # not a step
    records = [r for r in records if not (r["rank"] == 1 and r["step"] == 3)]  # a step one rank lacks
    history = history_frame(records)
    # steps 0-1: max(1.0, 1.3); 1-2: max(2.0, 1.6); steps 3 and 4 are not both on every rank's record
    assert step_seconds(history) == pytest.approx([1.3, 2.0])
    assert step_seconds(history, skip=1) == pytest.approx([2.0])
    assert step_seconds(history_frame([])) == []
