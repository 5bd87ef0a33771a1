"""``wb.watch(run_id)``: a notebook follows a run that ``workbench train`` launched elsewhere, through
the results store (live records while it runs, the whole run when it ends), as a dashboard's source."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workbench.dashboard import Dashboard
from workbench.results import RunObserver
from workbench.runtime.client.run import RunError
from workbench.runtime.client.watch import watch
from workbench.store import Store

pytestmark = pytest.mark.mpi

ROOT = Path(__file__).resolve().parent.parent


class Seen(RunObserver):
    def __init__(self):
        self.lengths, self.finished = [], 0

    def on_data(self, run):
        self.lengths.append(len(run.history))

    def on_finish(self, run):
        self.finished += 1


def _launch(tmp_path: Path, *options: str) -> tuple[subprocess.Popen, Store]:
    """``workbench train`` in the background (a terminal's or a batch job's run), and its store once
    the run is recorded in it."""
    env = dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-m", "workbench.cli", "train", "--algorithm", "sync-sgd", "--ranks", "2",
                             "--store", str(tmp_path / "store.sqlite"), "--out", str(tmp_path / "elsewhere"),
                             *options], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while not (tmp_path / "store.sqlite").exists() or "elsewhere" not in Store(tmp_path / "store.sqlite"):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    return proc, Store(tmp_path / "store.sqlite")


def test_a_watched_run_grows_while_it_trains_and_ends_as_stored(tmp_path):
    # a run long enough to be seen growing on a quiet machine too (about 1,700 steps a second here
    # alone), stopped by SIGTERM once it has been: it ends cancelled, with a summary
    proc, store = _launch(tmp_path, "--epochs", "5000")
    watched, seen = watch("elsewhere", store=store, interval=0.2), Seen()
    watched.add_observer(seen)
    board = Dashboard(watched)
    assert watched.total_steps > 0 and watched.status == "running", watched
    deadline = time.monotonic() + 240
    while len(set(seen.lengths)) < 3:   # three looks, each with more records than the one before
        assert time.monotonic() < deadline and proc.poll() is None, (seen.lengths, proc.poll())
        time.sleep(0.1)
    assert watched.status == "running" and seen.lengths == sorted(seen.lengths)
    proc.send_signal(signal.SIGTERM)
    result = watched.wait(timeout=120)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    summary = json.loads((tmp_path / "elsewhere" / "summary.json").read_text())
    assert summary["cancelled"] and watched.status == "cancelled"
    assert result.summary == summary and watched.summary == summary
    assert seen.finished == 1 and len(watched.history) == len(result.history) >= max(seen.lengths)
    assert watched.trace and 0 < summary["steps"] < watched.total_steps
    board.refresh()
    assert "cancelled" in board.status.value and 0 < board.progress.value < 1
    assert board.redraws >= 2 and not board.errors   # drawn live (no trace yet) and at the end
    board.close()


def test_a_watched_run_that_fails_raises_with_the_stored_error_and_keeps_its_records(tmp_path):
    proc, store = _launch(tmp_path, "--epochs", "40", "--fail-rank", "1", "--fail-step", "400")
    watched = watch("elsewhere", store=store, interval=0.2)
    with pytest.raises(RunError, match=r"rank 1 on node .* raised an exception"):
        watched.wait(timeout=300)
    proc.communicate(timeout=60)
    history = watched.history
    steps = history[(history["kind"] == "train") & (history["rank"] == 1)]["step"]
    assert watched.status == "failed" and sorted(steps.astype(int)) == list(range(400))
    # a run that ended before it was watched: ended at once
    again = watch("elsewhere", store=store)
    assert again.done() and again.status == "failed" and len(again.history) == len(history)


def test_watching_a_run_the_store_does_not_hold_names_the_store(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"store: the results store .*store.sqlite does not exist"):
        watch("nope", store=tmp_path / "store.sqlite")
    assert not (tmp_path / "store.sqlite").exists()
    Store(tmp_path / "store.sqlite")
    with pytest.raises(KeyError, match=r"run 'nope' is not in the store"):
        watch("nope", store=tmp_path / "store.sqlite")


def test_a_watched_run_deleted_from_the_store_ends_the_watch_with_why(tmp_path):
    store = Store(tmp_path / "store.sqlite")
    store.start_run("gone", {"algorithm": "sync-sgd", "ranks": 2, "dataset": "digits"})
    watched = watch("gone", store=store, interval=0.05)
    store.delete("gone")
    with pytest.raises(RunError, match=r"watching run gone stopped: KeyError"):
        watched.wait(timeout=30)
    assert watched.status == "failed"
