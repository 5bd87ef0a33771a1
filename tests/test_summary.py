"""The summary schema, the one step count and the one communication share (no MPI needed)."""
from __future__ import annotations

import random
import typing

import pytest

from workbench import data, summary
from workbench.config import RunConfig
from workbench.results import RunResult
from workbench.store import SUMMARY_COLUMNS
from workbench.telemetry import CATEGORIES, comm_fraction, exposed_comm_seconds, time_shares

US = 1e6


@pytest.mark.parametrize("dataset", ["digits", "synthetic"])
def test_planned_steps_are_the_batches_a_worker_draws(dataset):
    loaded = data.load(dataset)
    train = data.describe(dataset).train_samples
    assert train == len(loaded.y_train)  # what the client can know without loading the data
    for workers in (1, 3, 4, 7):
        for batch_size in (1, 16, 33):
            expected = [data.Batches(loaded, w, workers, batch_size, 0).steps_per_epoch * 3 for w in range(workers)]
            assert summary.planned_steps(train, workers, batch_size, 3) == expected


def _events(rank: int = 0) -> list[dict]:
    spans = [("batch", "io", 0.0, 0.1), ("forward_backward", "compute", 0.1, 0.5),
             ("allreduce:ring", "comm", 0.3, 0.9), ("join_allreduce", "wait", 0.5, 1.0),
             ("update", "compute", 1.0, 1.2), ("exchange", "comm", 1.2, 1.6)]
    return [{"name": n, "cat": c, "ph": "X", "ts": a * US, "dur": (b - a) * US, "pid": rank, "tid": 0,
             "args": {"wire_bytes": 100} if n.startswith("allreduce") else {}} for n, c, a, b in spans]


def test_comm_fraction_is_exposed_communication_over_wall_time():
    events = _events()
    # comm or wait open and no compute/io: 0.5-1.0 and 1.2-1.6 = 0.9 s of a 2 s wall
    assert comm_fraction(events, 2.0) == pytest.approx(0.45)
    assert comm_fraction(events, 2.0) == pytest.approx(exposed_comm_seconds(events) / 2.0)


def test_the_dashboards_comm_and_wait_shares_are_the_comm_fraction():
    rng = random.Random(1)
    for _ in range(50):
        events = []
        for _ in range(30):
            start = rng.uniform(0, 5)
            events.append({"cat": rng.choice(CATEGORIES), "ph": "X", "ts": start * US,
                           "dur": rng.uniform(0, 1) * US})
        wall = max(e["ts"] + e["dur"] for e in events) / US
        shares = time_shares(events)  # the wall defaults to the end of the last span
        assert sum(shares.values()) == pytest.approx(1.0)
        assert shares["comm"] + shares["wait"] == pytest.approx(comm_fraction(events, wall))
        assert comm_fraction(events, wall) == pytest.approx(exposed_comm_seconds(events) / wall)


def test_time_shares_of_a_window_and_of_no_spans():
    shares = time_shares(_events(), start=1.0, end=1.6)  # update 1.0-1.2, exchange 1.2-1.6
    assert shares["compute"] == pytest.approx(1 / 3) and shares["comm"] == pytest.approx(2 / 3)
    assert time_shares([]) == {"compute": 0.0, "comm": 0.0, "wait": 0.0, "io": 0.0, "other": 1.0}


def _report(rank: int, steps: int, wall: float = 2.0, telemetry: bool = True) -> summary.RankReport:
    """A rank that sent 10 bytes, and 100 more when it trained (its one byte counter)."""
    metrics = [{"kind": "train", "rank": rank, "step": s, "t": 0.1 * s, "loss": 1.0 + rank} for s in range(steps)]
    traffic = {"wire_bytes": 10 + (100 if steps else 0), "messages": 1 + (1 if steps else 0)}
    return summary.rank_report(rank, wall, 0.5, steps, False, metrics,
                               _events(rank) if steps and telemetry else [], traffic)


def test_build_summary_holds_the_design_contract_and_counts_steps_once():
    cfg = RunConfig(algorithm="async-easgd", ranks=3, epochs=1)
    reports = [_report(0, 0, wall=2.5), _report(1, 4), _report(2, 6)]
    final = {"kind": "eval", "test_accuracy": 0.9, "test_loss": 0.3, "final": True}
    result = summary.build_summary(cfg, reports, final, parameters=123)
    assert set(summary.CONTRACT_KEYS) <= set(result)
    assert set(result) <= set(typing.get_type_hints(summary.Summary))
    assert (result["steps"], result["steps_per_worker"], result["workers"]) == (10, 6, 2)
    assert result["wall_seconds"] == 2.5 and result["bytes_sent"] == 3 * 10 + 2 * 100
    # one byte counter: bytes_sent (kept one release) is wire_bytes summed over the ranks
    assert result["bytes_sent"] == pytest.approx(3 * result["wire_bytes"])
    assert result["comm_fraction"] == pytest.approx((0.0 + 0.45 + 0.45) / 3)
    assert result["comm_fraction_workers"] == pytest.approx(0.45)
    assert "weights_checksum" not in result and result["evaluations"] == 0
    checksummed = summary.build_summary(RunConfig(algorithm="sync-sgd", ranks=2, epochs=1),
                                        [_report(0, 3), _report(1, 3)], final, 123, weights_checksum="ab")
    assert checksummed["weights_checksum"] == "ab" and checksummed["steps"] == 6
    off = summary.build_summary(RunConfig(algorithm="sync-sgd", ranks=2, epochs=1, telemetry=False),
                                [_report(0, 3), _report(1, 3)], final, 123)
    assert off["comm_fraction"] is None and off["comm_fraction_workers"] is None
    dark = summary.build_summary(RunConfig(algorithm="async-easgd", ranks=3, epochs=1, telemetry=False),
                                 [_report(0, 0, telemetry=False), _report(1, 4, telemetry=False),
                                  _report(2, 6, telemetry=False)], final, 123)
    assert (dark["bytes_sent"], dark["wire_bytes"]) == (result["bytes_sent"], result["wire_bytes"])  # no spans needed


def test_the_store_the_cli_and_run_result_read_the_schema():
    hints = typing.get_type_hints(summary.Summary)
    assert SUMMARY_COLUMNS == list(summary.STORE_COLUMNS) and set(SUMMARY_COLUMNS) <= set(hints)
    assert set(summary.PRINTED_KEYS) <= set(hints) and set(summary.CONTRACT_KEYS) <= set(hints)
    assert [summary.status_of(s) for s in (None, {"steps": 3}, {"cancelled": True})] == [
        "failed", "finished", "cancelled"]
    result = RunResult(run_id="r", config={"ranks": 2}, summary={"steps": 7})
    assert result.total_steps == 7


def test_traffic_is_per_rank_averaged_over_ranks_and_per_step_of_a_worker():
    cfg = RunConfig(algorithm="sync-sgd", ranks=2, epochs=1)
    final = {"kind": "eval", "test_accuracy": 0.9, "test_loss": 0.3, "final": True}
    reports = [_report(0, 4), _report(1, 4)]
    reports[0]["traffic"] = {"wire_bytes": 1000, "dense_wire_bytes": 4000, "messages": 8, "skipped_steps": 1}
    reports[1]["traffic"] = {"wire_bytes": 3000, "dense_wire_bytes": 4000, "messages": 12, "skipped_steps": 1}
    result = summary.build_summary(cfg, reports, final, parameters=123)
    assert (result["wire_bytes"], result["dense_wire_bytes"], result["messages"]) == (2000, 4000, 10)
    assert (result["wire_bytes_per_step"], result["messages_per_step"]) == (500, 2.5)
    assert result["compression_ratio"] == 2.0 and result["skipped_steps"] == 1
    quiet = [_report(0, 4), _report(1, 4)]
    for report in quiet:
        report["traffic"] = dict.fromkeys(summary.TRAFFIC_KEYS, 0)
    silent = summary.build_summary(cfg, quiet, final, parameters=123)
    assert silent["wire_bytes"] == 0 and silent["compression_ratio"] is None  # nothing counted: no ratio


def test_lock_step_workers_take_the_steps_of_the_smallest_shard():
    # digits at 4 workers, batch 8: shards of 360, 359, 359, 359 samples give 45, 44, 44, 44 steps
    assert summary.planned_steps(1437, 4, 8, 2) == [90, 88, 88, 88]
    assert summary.planned_steps(1437, 4, 8, 2, synchronous=True) == [88, 88, 88, 88]
