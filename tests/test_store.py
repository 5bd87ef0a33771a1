"""The SQLite results store: round trips, concurrency, status transitions, sweeps, the CLI's records."""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from workbench.config import RunConfig
from workbench.results import RunResult, history_frame
from workbench.store import RUN_COLUMNS, SCHEMA_VERSION, Store

ROOT = Path(__file__).resolve().parent.parent


def _records(n: int = 12) -> list[dict]:
    """Train records of 2 ranks, evaluations (one final) as the worker writes them."""
    records = [{"kind": "train", "rank": i % 2, "step": i // 2, "t": 0.01 * i, "loss": 2.3 - 0.1 * i}
               for i in range(n)]
    records += [{"kind": "eval", "rank": 0, "t": 0.05, "test_accuracy": 0.6, "test_loss": 1.1, "step": 3},
                {"kind": "eval", "rank": 0, "t": 0.11, "test_accuracy": 0.93, "test_loss": 0.4, "step": 6},
                {"kind": "eval", "rank": 0, "t": 0.12, "test_accuracy": 0.95, "test_loss": 0.3, "final": True}]
    return records


def _result(run_id: str = "r1", algorithm: str = "sync-sgd", status: str = "finished", **config) -> RunResult:
    trace = [{"name": "allreduce:ring", "cat": "comm", "ph": "X", "ts": 10.0 * i, "dur": 4.5, "pid": i % 2,
              "tid": 0, "args": {"bytes_sent": 4096}} for i in range(6)]
    summary = None if status != "finished" else {
        "final_test_accuracy": 0.95, "final_loss": 1.25, "wall_seconds": 2.5, "comm_fraction": 0.25,
        "steps": 12, "bytes_sent": np.int64(24576), "time_in": {"compute": 1.0, "comm": 0.5}}
    return RunResult(run_id=run_id, config=RunConfig(algorithm=algorithm, ranks=2, **config).to_dict(),
                     summary=summary, history=history_frame(_records()), trace=trace, status=status,
                     error=None if status == "finished" else "rank 1 failed: boom", run_dir=f"/runs/{run_id}")


@pytest.fixture
def store(tmp_path) -> Store:
    return Store(tmp_path / "results.sqlite")


def test_a_run_round_trips_config_summary_history_and_trace(store):
    original = _result()
    assert store.add(original) == "r1"
    loaded = store.load("r1")
    assert loaded.config == original.config
    assert loaded.summary == {**original.summary, "bytes_sent": 24576}  # numpy int stored as a JSON number
    pd.testing.assert_frame_equal(loaded.history, original.history)
    assert loaded.trace == original.trace
    assert (loaded.status, loaded.error, loaded.run_dir) == ("finished", None, "/runs/r1")
    assert loaded.time_to_accuracy(0.9) == pytest.approx(0.11)  # the final evaluation does not count


def test_add_replaces_the_whole_run(store):
    store.add(_result())
    shorter = _result()
    shorter.history = history_frame(_records()[:3])
    shorter.trace = []
    store.add(shorter)
    loaded = store.load("r1")
    assert len(loaded.history) == 3 and loaded.trace == [] and len(store.runs()) == 1


def test_file_is_wal_with_a_schema_version_and_holds_json_text_not_pickle(store):
    store.add(_result())
    store.create_sweep("s", {"epochs": 1}, {"tau": [1, 2]}, [0])
    conn = sqlite3.connect(store.path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    for table, column in (("runs", "config"), ("runs", "summary"), ("metrics", "record"), ("traces", "events"),
                          ("sweeps", "base_config"), ("sweeps", "grid"), ("sweeps", "seeds")):
        for kind, text in conn.execute(f"SELECT typeof({column}), {column} FROM {table}"):
            assert kind == "text", (table, column)
            json.loads(text)  # parses as JSON
    config, summary = conn.execute("SELECT config, summary FROM runs").fetchone()
    assert json.loads(config)["algorithm"] == "sync-sgd" and json.loads(summary)["steps"] == 12
    assert conn.execute("SELECT COUNT(*) FROM metrics WHERE kind = 'eval'").fetchone()[0] == 3
    conn.close()
    raw = b"".join(p.read_bytes() for p in store.path.parent.glob(f"{store.path.name}*"))  # with any -wal
    assert b"\x80\x04\x95" not in raw and b"\x80\x05\x95" not in raw  # no pickle protocol 4/5 frames


_WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from workbench.store import Store
    path, ready, go, name = sys.argv[1:]
    store = Store(path)
    Path(ready).touch()
    while not Path(go).exists():
        time.sleep(0.005)
    store.start_run(name, {"algorithm": "sync-sgd", "ranks": 2})
    for i in range(60):
        store.append_metrics(name, [{"kind": "train", "rank": 0, "step": i, "t": i, "loss": 1.0}] * 3)
        store.append_metrics("shared", [{"kind": "train", "rank": 9, "step": i, "t": i, "loss": 1.0}])
""")


def test_threads_opening_a_new_store_file_at_once_all_get_it(tmp_path):
    """The first openers of a new file race to switch it to WAL; SQLite answers the loser's switch
    with "database is locked" without waiting, so the store retries it (seen: 8 of 300 races failed)."""
    errors: list[BaseException] = []
    for trial in range(150):
        path, barrier = tmp_path / f"new-{trial}.sqlite", threading.Barrier(6)

        def open_at_once(path=path, barrier=barrier) -> None:
            try:
                barrier.wait(timeout=60)
                Store(path)
            except BaseException as exc:  # noqa: BLE001 - collected, asserted below
                errors.append(exc)
        threads = [threading.Thread(target=open_at_once) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        with sqlite3.connect(path) as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert errors == []


def test_two_threads_and_a_process_write_at_once_without_locking_errors(tmp_path):
    path, go = tmp_path / "busy.sqlite", tmp_path / "go"
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def open_then(work) -> None:
        try:
            store = Store(path)  # the threads also race to create the file's schema
            barrier.wait(timeout=60)
            work(store)
        except BaseException as exc:  # noqa: BLE001 - collected, asserted below
            errors.append(exc)
            barrier.abort()  # the main thread stops waiting for this one

    def writer(name: str):
        def work(store: Store) -> None:
            while not go.exists():
                time.sleep(0.005)
            store.start_run(name, {"algorithm": "sync-sgd", "ranks": 2})
            for i in range(60):
                store.append_metrics(name, [{"kind": "train", "rank": 1, "step": i, "t": i, "loss": 1.0}] * 3)
                store.append_metrics("shared", [{"kind": "train", "rank": 9, "step": i, "t": i, "loss": 1.0}])
                if i % 20 == 0:
                    store.add(_result(f"{name}-whole-{i}"))
        return work

    def reader(store: Store) -> None:  # the dashboard: reads all along, must never block writers
        while not go.exists():
            time.sleep(0.005)
        for _ in range(40):
            store.runs()

    threads = [threading.Thread(target=open_then, args=(w,))
               for w in (writer("thread-a"), writer("thread-b"), reader)]
    for t in threads:
        t.start()
    Store(path).start_run("shared", {"algorithm": "sync-sgd", "ranks": 2})
    try:
        barrier.wait(timeout=60)
    except threading.BrokenBarrierError:  # a thread failed before the barrier: show its error
        raise AssertionError(f"a thread failed before starting: {errors!r}") from None
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path), str(tmp_path / "ready"), str(go), "process"],
                            cwd=ROOT, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (tmp_path / "ready").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()  # all three writers (and the reader) start together
    for t in threads:
        t.join(timeout=120)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr[-3000:]
    assert errors == []
    store = Store(path)
    for name in ("thread-a", "thread-b", "process"):
        assert len(store.load(name).history) == 180
    shared = store.load("shared").history
    assert len(shared) == 180 and sorted(shared["step"]).count(0) == 3  # no append lost or doubled
    assert len(store.runs()) == 10  # shared + 3 live + 2 x 3 whole runs


def test_start_append_then_fail_keeps_the_live_metrics(store):
    store.start_run("live", RunConfig(algorithm="sync-sgd", ranks=2).to_dict(), run_dir="/runs/live",
                    sweep_id="sweep-x", sweep_key="k")
    row = store.runs().iloc[0]
    assert (row["status"], row["run_dir"], pd.isna(row["final_test_accuracy"])) == ("running", "/runs/live", True)
    store.append_metrics("live", [{"kind": "train", "rank": 0, "step": 0, "t": 0.1, "loss": 2.3}])
    store.append_metrics("live", [{"kind": "train", "rank": 1, "step": 0, "t": 0.1, "loss": 2.2},
                                  {"kind": "train", "rank": 0, "step": 1, "t": 0.2, "loss": 2.1}])
    assert store.load("live").status == "running" and len(store.load("live").history) == 3
    store.fail("live", "MPI job on 2 ranks exited with code 1: rank(s) 1 failed")
    loaded = store.load("live")
    assert loaded.status == "failed" and "rank(s) 1" in loaded.error
    assert loaded.history["loss"].tolist() == [2.3, 2.2, 2.1]
    store.fail("live", "stopped", status="cancelled")
    assert store.load("live").status == "cancelled"
    with pytest.raises(ValueError, match="'failed' or 'cancelled'"):
        store.fail("live", "x", status="finished")
    with pytest.raises(KeyError, match="'ghost'"):
        store.fail("ghost", "x")
    with pytest.raises(KeyError, match="'ghost'"):
        store.append_metrics("ghost", [{"kind": "train"}])


def test_finish_keeps_sweep_membership_creation_time_and_live_data(store):
    store.start_run("r1", _result().config, sweep_id="sweep-x", sweep_key="k1")
    created = store.runs()["created"].iloc[0]
    store.append_metrics("r1", _records()[:4])
    died = RunResult(run_id="r1", config=_result().config, status="failed", error="rank 0 failed")
    store.finish(died)  # a result with no history of its own keeps the live metrics
    assert len(store.load("r1").history) == 4 and store.load("r1").error == "rank 0 failed"
    store.finish(_result("r1"))
    row = store.runs().iloc[0]
    assert (row["sweep_id"], row["sweep_key"], row["created"], row["status"]) == ("sweep-x", "k1", created, "finished")
    assert len(store.load("r1").history) == len(_records()) and store.load("r1").error is None


def test_runs_lists_newest_first_with_filters_and_typed_columns(store):
    store.add(_result("old", algorithm="sync-easgd", tau=4, lr=0.05))  # sync-sgd would refuse tau=4: it ignores it
    time.sleep(0.01)
    store.add(_result("broken", status="failed"))
    time.sleep(0.01)
    store.add(_result("new", algorithm="easgd"))
    frame = store.runs()
    assert frame["run_id"].tolist() == ["new", "broken", "old"]
    assert frame.columns.tolist()[:len(RUN_COLUMNS)] == RUN_COLUMNS
    assert {"lr", "rho", "tau", "momentum", "batch_size", "epochs", "seed", "model", "dataset", "collective",
            "fusion_bytes", "cfg_algorithm", "cfg_ranks"} <= set(frame.columns)
    assert pd.api.types.is_datetime64_any_dtype(frame["created"]) and frame["created"].is_monotonic_decreasing
    assert str(frame["ranks"].dtype) == "Int64" and str(frame["steps"].dtype) == "Int64"
    assert frame["final_test_accuracy"].dtype == "float64" and frame["lr"].dtype == "float64"
    old = frame.set_index("run_id").loc["old"]
    assert (old["tau"], old["lr"], old["bytes_sent"], old["comm_fraction"]) == (4, 0.05, 24576, 0.25)
    assert pd.isna(frame.set_index("run_id").loc["broken", "final_test_accuracy"])
    assert frame["time_to_target"].isna().all()
    assert store.runs(target_accuracy=0.9)["time_to_target"].tolist() == pytest.approx([0.11] * 3)
    assert store.runs(target_accuracy=0.99)["time_to_target"].isna().all()
    assert store.runs(status="failed")["run_id"].tolist() == ["broken"]
    assert store.runs(algorithm="easgd")["run_id"].tolist() == ["new"]
    assert store.runs(algorithm="easgd", status="failed").empty


def test_an_empty_store_gives_an_empty_frame_with_the_columns(tmp_path):
    frame = Store(tmp_path / "empty.sqlite").runs()
    assert frame.empty and frame.columns.tolist()[:len(RUN_COLUMNS)] == RUN_COLUMNS
    assert {"lr", "tau", "seed", "cfg_algorithm"} <= set(frame.columns)


def test_unknown_run_id_is_a_key_error_that_names_it_and_says_how_to_list(store):
    with pytest.raises(KeyError, match=r"run 'nope' is not in the store .*workbench runs"):
        store.load("nope")
    store.add(_result())
    store.delete("r1")
    with pytest.raises(KeyError, match="'r1'"):
        store.load("r1")
    with pytest.raises(KeyError, match="'r1'"):
        store.delete("r1")
    conn = sqlite3.connect(store.path)
    assert conn.execute("SELECT COUNT(*) FROM metrics").fetchone()[0] == 0  # cascaded
    assert conn.execute("SELECT COUNT(*) FROM traces").fetchone()[0] == 0


def test_sweep_id_is_stable_and_keys_are_tracked(store):
    sweep = store.create_sweep("tau", {"epochs": 1, "ranks": 2}, {"tau": [1, 4]}, [0, 1])
    assert sweep.startswith("sweep-")
    assert sweep == store.create_sweep("tau", {"ranks": 2, "epochs": 1}, {"tau": [1, 4]}, [0, 1])  # key order
    assert sweep == Store(store.path).create_sweep("tau", {"epochs": 1, "ranks": 2}, {"tau": [1, 4]}, [0, 1])
    other = store.create_sweep("tau", {"epochs": 1, "ranks": 2}, {"tau": [1, 8]}, [0, 1])
    assert other != sweep
    store.add(_result("a"), sweep_id=sweep, sweep_key="tau=1")
    store.add(_result("b", status="failed"), sweep_id=sweep, sweep_key="tau=4")
    store.add(_result("c", status="failed"), sweep_id=sweep, sweep_key="tau=1")  # an earlier try
    store.add(_result("d"), sweep_id=other, sweep_key="tau=8")
    assert store.finished_keys(sweep) == {"tau=1"}
    assert store.failed_keys(sweep) == {"tau=4"}  # tau=1 finished since
    assert set(store.sweep_runs(sweep)["run_id"]) == {"a", "b", "c"}
    sweeps = store.sweeps().set_index("sweep_id")
    assert len(sweeps) == 2 and sweeps.loc[sweep, ["runs", "finished", "failed"]].tolist() == [3, 1, 2]
    assert sweeps.loc[sweep, "grid"] == {"tau": [1, 4]} and sweeps.loc[sweep, "seeds"] == [0, 1]


def test_the_environment_variable_and_the_default_choose_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_STORE", str(tmp_path / "env" / "chosen.sqlite"))
    Store().add(_result())
    assert (tmp_path / "env" / "chosen.sqlite").exists()
    assert repr(Store()) == f"<workbench.Store {tmp_path / 'env' / 'chosen.sqlite'}: 1 run>"
    monkeypatch.delenv("WORKBENCH_STORE")
    monkeypatch.chdir(tmp_path)
    assert Store().path == Path("data/workbench.sqlite") and (tmp_path / "data" / "workbench.sqlite").exists()
    assert Store(tmp_path / "arg.sqlite").path == tmp_path / "arg.sqlite"


@pytest.mark.mpi
def test_a_real_run_directory_round_trips(tmp_path, store, monkeypatch):
    from workbench.runtime.launch.batch import train
    monkeypatch.setenv("WORKBENCH_TUNING_CACHE", str(tmp_path / "tuning.json"))
    train(RunConfig(algorithm="sync-easgd", ranks=2, epochs=1), tmp_path / "run")
    run_id = store.add_run_dir(tmp_path / "run")
    loaded = store.load(run_id)
    assert run_id == "run" and loaded.status == "finished"
    assert loaded.summary == json.loads((tmp_path / "run" / "summary.json").read_text())
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(loaded.history) == len(lines) and (loaded.history["kind"] == "train").sum() == loaded.summary["steps"]
    assert len(loaded.trace) > 0 and all(e["ph"] == "X" for e in loaded.trace)
    assert store.runs().iloc[0]["final_test_accuracy"] == loaded.summary["final_test_accuracy"]


def _cli(*args: str, env: dict, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workbench.cli", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=ROOT)


@pytest.mark.mpi
def test_the_cli_records_finished_and_failed_runs_and_lists_them(tmp_path):
    env = {**os.environ, "WORKBENCH_TUNING_CACHE": str(tmp_path / "tuning.json")}
    db = tmp_path / "cli.sqlite"
    base = ["train", "--algorithm", "sync-sgd", "--ranks", "2", "--epochs", "1", "--store", str(db)]
    ok = _cli(*base, "--out", str(tmp_path / "good-run"), env=env)
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert "run_id               good-run" in ok.stdout
    bad = _cli(*base, "--out", str(tmp_path / "bad-run"), "--fail-rank", "1", "--fail-step", "3", env=env)
    assert bad.returncode == 1 and "run bad-run recorded as failed" in bad.stderr
    store = Store(db)
    frame = store.runs().set_index("run_id")
    assert frame.loc["good-run", "status"] == "finished" and frame.loc["bad-run", "status"] == "failed"
    assert "rank(s) 1 failed" in frame.loc["bad-run", "error"]
    assert frame.loc["good-run", "run_dir"] == str((tmp_path / "good-run").resolve())
    assert len(store.load("good-run").history) > 0
    listing = _cli("runs", "--store", str(db), env=env, timeout=60)
    assert listing.returncode == 0, listing.stderr
    lines = listing.stdout.splitlines()
    assert any("good-run" in line and "finished" in line for line in lines)
    # the error column shows the first line of the error, which starts with the rank that failed
    assert any("bad-run" in line and "failed" in line and "rank 1 on node " in line for line in lines)
    assert "2 of 2 runs" in listing.stdout
    only_failed = _cli("runs", "--store", str(db), "--status", "failed", "--limit", "5", env=env, timeout=60)
    assert "bad-run" in only_failed.stdout and "good-run" not in only_failed.stdout
    missing = _cli("runs", "--store", str(tmp_path / "none.sqlite"), env=env, timeout=60)
    assert missing.returncode == 0 and "does not exist yet" in missing.stdout
    assert not (tmp_path / "none.sqlite").exists()


def test_the_table_shows_the_hyper_parameters_the_run_used_while_the_config_keeps_what_was_given(store):
    cfg = RunConfig(algorithm="async-sgd", ranks=3)  # lr, momentum, rho left to the algorithm
    store.start_run("defaults", cfg.to_dict())
    store.start_run("given", RunConfig(algorithm="async-sgd", ranks=3, lr=0.2).to_dict())
    frame = store.runs().set_index("run_id")
    assert frame.loc["defaults", "lr"] == 0.05 and frame.loc["defaults", "momentum"] == 0.0
    assert frame.loc["defaults", "rho"] == pytest.approx(0.9 / (2 * 0.05))  # BETA / (workers * lr)
    assert frame.loc["given", "lr"] == 0.2
    assert RunConfig.from_dict(store.load("defaults").config) == cfg  # stored as given: round-trips
