"""A batch run's metric records while it runs (workbench.runtime.live): the ranks' live files, the
launcher's follower, ``workbench train --progress`` and the store keeping a failed run's records."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.runtime import live
from workbench.runtime.live import LIVE_FOLDER, LiveFile, LiveFiles, Progress, following, records_in
from workbench.store import Store

ROOT = Path(__file__).resolve().parent.parent


def test_the_file_channel_is_read_in_whole_lines_once_and_tells_each_ranks_progress(tmp_path, monkeypatch):
    monkeypatch.setattr(live, "FLUSH_SECONDS", 3600.0)   # nothing written between flushes in this test
    folder = tmp_path / LIVE_FOLDER
    channel = LiveFile(folder, 1)
    reader, progress = LiveFiles(tmp_path), Progress()
    channel.plan(20)
    plan = reader.read()
    assert plan == [{"rank": 1, "plan": 20}]                       # the plan is sent at once
    channel.on_metric({"kind": "train", "rank": 1, "step": 0, "loss": 2.0})   # the first record flushes
    channel.on_metric({"kind": "train", "rank": 1, "step": 1, "loss": 1.5})
    channel.on_span({"name": "allreduce"})                          # files carry no spans
    first = reader.read()
    assert records_in(first) == ([{"kind": "train", "rank": 1, "step": 0, "loss": 2.0}], [])  # step 1 pending
    channel.close()
    rest = reader.read()
    assert [r["step"] for r in records_in(rest)[0]] == [1] and rest[-1] == {"rank": 1, "end": "finished"}
    assert reader.read() == []                                     # each line once
    with open(folder / "rank0.jsonl", "w") as f:                   # a rank mid-way through a line
        f.write(json.dumps({"rank": 0, "plan": 0}) + "\n" + '{"rank": 0, "metrics": [{"kind": "eval", "te')
    mid = reader.read()
    assert mid == [{"rank": 0, "plan": 0}]
    with open(folder / "rank0.jsonl", "a") as f:
        f.write('st_accuracy": 0.5, "test_loss": 1.0}]}\n')
    last = reader.read()
    assert records_in(last)[0] == [{"kind": "eval", "test_accuracy": 0.5, "test_loss": 1.0}]
    for messages in (plan, first, rest, mid, last):
        progress.note(messages)
    assert progress.planned == {0: 0, 1: 20} and progress.done == {1: 2} and progress.latest[1]["loss"] == 1.5
    assert progress.evaluation["test_accuracy"] == 0.5


def test_a_rank_that_raises_sends_its_records_then_its_traceback_and_nothing_after(tmp_path, monkeypatch):
    monkeypatch.setattr(live, "FLUSH_SECONDS", 3600.0)
    channel = LiveFile(tmp_path / LIVE_FOLDER, 2)
    channel.on_metric({"kind": "train", "rank": 2, "step": 0, "loss": 2.0})
    channel.on_metric({"kind": "train", "rank": 2, "step": 1, "loss": 1.9})   # pending
    channel.error("rank 2 failed: boom")
    channel.close("failed")
    channel.close("finished")                                      # once: the first end stays
    channel.on_metric({"kind": "train", "rank": 2, "step": 2, "loss": 1.8})   # after the end: dropped,
    channel.flush()                                                # a hogwild thread's late record too
    messages = LiveFiles(tmp_path).read()
    assert [r["step"] for r in records_in(messages)[0]] == [0, 1]
    assert messages[-2:] == [{"rank": 2, "error": "rank 2 failed: boom"}, {"rank": 2, "end": "failed"}]


def test_following_hands_new_messages_to_consumers_and_drops_one_that_fails(tmp_path, capsys):
    seen, failing = [], []

    def broken(messages):
        failing.append(len(messages))
        raise OSError("the store's disk is full")

    channel = LiveFile(tmp_path / LIVE_FOLDER, 0)
    with following(tmp_path, [broken, seen.extend], interval=0.05) as errors:
        channel.plan(3)
        channel.on_metric({"kind": "train", "rank": 0, "step": 0, "loss": 1.0})
        channel.on_metric({"kind": "train", "rank": 0, "step": 1, "loss": 0.9})
        channel.close()
    # what the rank wrote last arrives with the final read; the failed consumer was called once, then dropped
    assert [r["step"] for r in records_in(seen)[0]] == [0, 1] and seen[0] == {"rank": 0, "plan": 3}
    assert len(failing) == 1
    assert [str(e) for e in errors] == ["the store's disk is full"]
    assert "(OSError: the store's disk is full); the run goes on" in capsys.readouterr().err


def test_a_run_handle_reads_every_transport_the_same_way(tmp_path):
    from workbench.runtime.client.handle import RunHandle
    handle = RunHandle("r", {"algorithm": "sync-sgd"})
    handle.receive([{"rank": 0, "plan": 4}, {"rank": 1, "plan": 4},
                    {"rank": 1, "metrics": [{"kind": "train", "rank": 1, "step": 0, "loss": 1.0}],
                     "spans": [{"name": "allreduce", "tid": 1}]},
                    {"rank": 1, "error": "rank 1 failed: boom"}, {"rank": 0, "error": "rank 0 failed: then"}])
    assert handle.progress.planned == {0: 4, 1: 4} and handle.progress.done == {1: 1}
    assert len(handle.history) == 1 and handle.trace == [{"name": "allreduce", "tid": 1}]
    assert (handle.failed_rank, handle.error) == (1, "rank 1 failed: boom")   # the first to report


def _train(tmp_path: Path, *options: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=str(tmp_path))
    return subprocess.run([sys.executable, "-m", "workbench.cli", "train", "--algorithm", "sync-sgd", "--ranks", "2",
                           "--store", str(tmp_path / "store.sqlite"), "--out", str(tmp_path / "run"), *options],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def _live_messages(run_dir: Path) -> list[dict]:
    return [json.loads(line) for path in sorted((run_dir / LIVE_FOLDER).glob("rank*.jsonl"))
            for line in path.read_text().splitlines()]


@pytest.mark.mpi
def test_train_shows_progress_and_its_live_records_are_the_runs_metrics(tmp_path):
    done = _train(tmp_path, "--epochs", "2", "--progress")
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "run"
    messages = _live_messages(run)
    plans = [m for m in messages if "plan" in m]
    total = sum(p["plan"] for p in plans)
    assert [p["rank"] for p in plans] == [0, 1] and total > 0
    assert f"{total}/{total}" in done.stderr and "test_acc=" in done.stderr, done.stderr[-2000:]
    final = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    key = lambda r: json.dumps(r, sort_keys=True)  # noqa: E731
    assert sorted(map(key, records_in(messages)[0])) == sorted(map(key, final))
    assert sorted(m["rank"] for m in messages if m.get("end") == "finished") == [0, 1]
    # without --progress (and stderr not a terminal) no bar
    (tmp_path / "again").mkdir()
    quiet = _train(tmp_path / "again", "--epochs", "1")
    assert quiet.returncode == 0 and "step/s" not in quiet.stderr, quiet.stderr[-2000:]


@pytest.mark.mpi
def test_a_failed_run_keeps_the_records_its_ranks_made_in_the_store(tmp_path):
    done = _train(tmp_path, "--epochs", "20", "--fail-rank", "1", "--fail-step", "40")
    assert done.returncode == 1 and "injected failure on rank 1 at step 40" in done.stderr, done.stderr[-3000:]
    store = Store(tmp_path / "store.sqlite")
    [run_id] = store.runs()["run_id"]
    result = store.load(run_id)
    assert result.status == "failed" and not (tmp_path / "run" / "summary.json").exists()
    history = result.history
    steps = history[(history["kind"] == "train") & (history["rank"] == 1)]["step"]
    # the failing rank wrote every step it took before it raised, the last ones as it ended
    assert sorted(steps.astype(int)) == list(range(40))
    listing = subprocess.run([sys.executable, "-m", "workbench.cli", "runs", "--store", str(tmp_path / "store.sqlite")],
                             cwd=ROOT, capture_output=True, text=True, timeout=60)
    [row] = [line for line in listing.stdout.splitlines() if " failed " in line]
    # how far it got, from those records (rank 0 may have recorded step 40 before the abort)
    assert row.split()[0] == run_id and (" step 40 " in row or " step 41 " in row), listing.stdout


def test_the_store_tells_how_far_a_run_got_from_its_records(tmp_path):
    store = Store(tmp_path / "store.sqlite")
    for run_id in ("a", "b", "empty"):
        store.start_run(run_id, {"algorithm": "sync-sgd", "ranks": 2})
    store.append_metrics("a", [{"kind": "train", "rank": r, "step": s, "t": s, "loss": 1.0} for s in range(5) for r in (0, 1)])
    store.append_metrics("a", [{"kind": "eval", "rank": 0, "t": 5, "test_accuracy": 0.5, "test_loss": 1.0},
                               {"kind": "train", "rank": 1, "step": 5, "t": 6, "loss": 0.9},
                               {"kind": "eval", "rank": 0, "t": 7, "test_accuracy": 0.625, "test_loss": 0.9}])
    store.append_metrics("b", [{"kind": "train", "rank": 0, "step": 0, "t": 0, "loss": 2.0}])
    assert store.progress(["a", "b", "empty"]) == {"a": {"steps": 6, "test_accuracy": 0.625},
                                                   "b": {"steps": 1, "test_accuracy": None}}


def test_following_a_stored_run_takes_each_record_once_and_the_config_on_the_first_look(tmp_path):
    store = Store(tmp_path / "store.sqlite")
    store.start_run("a", {"algorithm": "sync-sgd", "ranks": 2})
    store.append_metrics("a", [{"kind": "train", "rank": r, "step": 0, "t": 0, "loss": 1.0} for r in (0, 1)])
    status, error, records, seq, config = store.follow("a", -1)
    assert (status, error, [r["rank"] for r in records], config["ranks"]) == ("running", None, [0, 1], 2)
    assert store.follow("a", seq) == ("running", None, [], seq, None)  # nothing new, no config read again
    store.append_metrics("a", [{"kind": "train", "rank": 0, "step": 1, "t": 1, "loss": 0.5}])
    store.fail("a", "rank 1 on node n1: boom")
    status, error, records, later, config = store.follow("a", seq)
    assert (status, error, [r["step"] for r in records], later, config) == (
        "failed", "rank 1 on node n1: boom", [1], seq + 1, None)
    with pytest.raises(KeyError, match="nobody"):
        store.follow("nobody", -1)
