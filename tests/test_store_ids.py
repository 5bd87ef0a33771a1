"""The store never loses a run (issue 11, part 5): ids unique whatever the folder is called, a
finished run's row and files never overwritten, a resume is a new run linked to the old one."""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.config import RunConfig
from workbench.results import RunResult
from workbench.store import SCHEMA_VERSION, Store

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def store(tmp_path) -> Store:
    return Store(tmp_path / "ids.sqlite")


def _finished(run_id: str) -> RunResult:
    return RunResult(run_id=run_id, config=RunConfig(algorithm="sync-sgd", ranks=2).to_dict(),
                     summary={"final_test_accuracy": 0.9, "steps": 10}, status="finished", run_dir=f"/runs/{run_id}")


def test_two_folders_of_the_same_name_are_two_runs(store, tmp_path):
    from workbench.runtime.rundir import run_id_for
    cfg = RunConfig(algorithm="sync-sgd", ranks=2)
    first = run_id_for(tmp_path / "a" / "myrun", cfg, store)
    store.start_run(first, cfg.to_dict(), run_dir=str(tmp_path / "a" / "myrun"))
    second = run_id_for(tmp_path / "b" / "myrun", cfg, store)
    store.start_run(second, cfg.to_dict(), run_dir=str(tmp_path / "b" / "myrun"))
    assert first == "myrun" and second.startswith("myrun-") and second != first
    assert set(store.runs()["run_id"]) == {first, second}
    assert store.run_id_of(tmp_path / "b" / "myrun") == second
    assert "-sync-sgd-" in run_id_for(None, cfg, store)


def test_a_finished_row_is_never_overwritten(store):
    store.add(_finished("done"))
    with pytest.raises(ValueError, match="'done' is already finished"):
        store.start_run("done", RunConfig(algorithm="sync-easgd", ranks=4).to_dict())
    with pytest.raises(ValueError, match="'done' already finished"):
        store.fail("done", "a later failure")
    kept = store.load("done")
    assert (kept.status, kept.summary, kept.error, kept.config["algorithm"]) == (
        "finished", {"final_test_accuracy": 0.9, "steps": 10}, None, "sync-sgd")
    store.start_run("retry", {"algorithm": "sync-sgd", "ranks": 2})
    store.fail("retry", "boom")
    store.start_run("retry", {"algorithm": "sync-sgd", "ranks": 2})  # a failed row may be retried
    assert store.load("retry").status == "running"


def test_a_resumed_run_is_linked_to_the_run_it_continues(store):
    store.add(_finished("first"))
    store.start_run("second", _finished("x").config, run_dir="/runs/second", resumed_from="first")
    store.start_run("second", _finished("x").config, run_dir="/runs/second")  # the launcher's own start keeps it
    result = _finished("second")
    store.finish(result)
    assert store.load("second").resumed_from == "first"
    frame = store.runs().set_index("run_id")
    assert frame.loc["second", "resumed_from"] == "first" and frame.loc["first", "status"] == "finished"


_V1_RUNS = """CREATE TABLE runs (
    run_id TEXT PRIMARY KEY, created REAL NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('running', 'finished', 'failed', 'cancelled')),
    algorithm TEXT, ranks INTEGER, config TEXT NOT NULL, summary TEXT, error TEXT,
    run_dir TEXT, sweep_id TEXT, sweep_key TEXT)"""


def test_a_version_1_store_is_migrated_and_keeps_its_runs(tmp_path):
    path = tmp_path / "v1.sqlite"
    conn = sqlite3.connect(path)
    conn.execute(_V1_RUNS)
    conn.execute("CREATE TABLE metrics (run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE, "
                 "seq INTEGER NOT NULL, kind TEXT, rank INTEGER, step INTEGER, t REAL, record TEXT NOT NULL, "
                 "PRIMARY KEY (run_id, seq))")
    conn.execute("CREATE TABLE traces (run_id TEXT PRIMARY KEY REFERENCES runs (run_id) ON DELETE CASCADE, "
                 "events TEXT NOT NULL)")
    conn.execute("CREATE TABLE sweeps (sweep_id TEXT PRIMARY KEY, name TEXT NOT NULL, created REAL NOT NULL, "
                 "base_config TEXT NOT NULL, grid TEXT NOT NULL, seeds TEXT NOT NULL)")
    conn.execute("INSERT INTO runs (run_id, created, status, algorithm, ranks, config, summary) VALUES "
                 "('old', 1.0, 'finished', 'sync-sgd', 2, ?, '{\"steps\": 5}')",
                 (json.dumps(RunConfig(algorithm="sync-sgd", ranks=2).to_dict()),))
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    store = Store(path)
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 2
    old = store.load("old")
    assert (old.status, old.summary, old.resumed_from) == ("finished", {"steps": 5}, None)
    store.start_run("new", old.config, resumed_from="old")
    assert store.load("new").resumed_from == "old" and len(Store(path).runs()) == 2


def test_make_run_dir_refuses_a_folder_holding_a_run(tmp_path):
    from workbench.config import ConfigError
    from workbench.runtime.rundir import make_run_dir
    run = make_run_dir(tmp_path / "run", "--out")
    (run / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="--out: .* already holds a run"):
        make_run_dir(run, "--out")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is a file"):
        make_run_dir(tmp_path / "file")


def _cli(*args: str, env: dict, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workbench.cli", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=ROOT)


@pytest.mark.mpi
def test_the_cli_keeps_every_run_and_a_failed_resume_leaves_the_old_run_alone(tmp_path):
    env = {**os.environ, "WORKBENCH_TUNING_CACHE": str(tmp_path / "tuning.json"),
           "WORKBENCH_RUNS": str(tmp_path / "runs")}
    env.pop("WORKBENCH_SHARED", None)
    db = tmp_path / "cli.sqlite"
    base = ["train", "--algorithm", "sync-sgd", "--ranks", "2", "--epochs", "1", "--store", str(db)]
    # 44 steps per epoch (718 samples per worker, batches of 16): checkpoints at 20 and 40
    first = _cli(*base, "--checkpoint-every", "20", "--out", str(tmp_path / "a" / "myrun"), env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    second = _cli(*base, "--out", str(tmp_path / "b" / "myrun"), env=env)
    assert second.returncode == 0, second.stderr[-3000:]
    store = Store(db)
    frame = store.runs().set_index("run_id")
    assert len(frame) == 2 and set(frame["status"]) == {"finished"}  # one row each, neither lost
    assert frame.loc["myrun", "run_dir"] == str((tmp_path / "a" / "myrun").resolve())
    other = next(i for i in frame.index if i != "myrun")
    assert other.startswith("myrun-") and frame.loc[other, "run_dir"] == str((tmp_path / "b" / "myrun").resolve())
    assert oct(os.stat(tmp_path / "a" / "myrun").st_mode & 0o777) == oct(0o700)

    old_dir = tmp_path / "a" / "myrun"
    files = {name: (old_dir / name).read_bytes() for name in ("config.json", "summary.json", "metrics.jsonl")}
    old_row = store.load("myrun")
    failed = _cli(*base, "--resume", str(old_dir), "--fail-rank", "1", "--fail-step", "42", "--lr", "0.05",
                  env=env)
    assert failed.returncode == 1, failed.stderr[-3000:]
    assert f"resumed_from         myrun" in failed.stdout
    kept = store.load("myrun")
    assert (kept.status, kept.summary, kept.config) == ("finished", old_row.summary, old_row.config)
    assert {name: (old_dir / name).read_bytes() for name in files} == files  # nothing rewritten
    frame = store.runs().set_index("run_id")
    new = frame[frame["resumed_from"] == "myrun"]
    assert len(new) == 1 and new["status"].iloc[0] == "failed" and new["run_dir"].iloc[0] != str(old_dir.resolve())

    again = _cli(*base, "--resume", str(old_dir), "--out", str(tmp_path / "continued"), env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    continued = store.load(store.run_id_of(tmp_path / "continued"))
    assert continued.status == "finished" and continued.resumed_from == "myrun"
    assert continued.history.query("kind == 'train'")["step"].min() == 40  # it went on from the checkpoint
    into_itself = _cli(*base, "--resume", str(old_dir), "--out", str(old_dir), env=env, timeout=60)
    assert into_itself.returncode == 2 and "already holds a run" in into_itself.stderr
    assert {name: (old_dir / name).read_bytes() for name in files} == files
    assert len(Store(db).runs()) == 4
