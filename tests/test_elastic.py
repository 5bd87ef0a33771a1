"""A run that comes back from a fault (issue 46): ``--max-restarts N`` starts the failed job again from its
newest checkpoint, as one run, and says so; a run that exhausts its restarts ends failed with every fault
named. Real ranks under mpiexec, a rank killed from outside (SIGKILL), the real store."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from workbench.store import Store

ROOT = Path(__file__).resolve().parent.parent
#: long enough (10,560 steps, 8-15 s of training on 2 ranks) to kill a rank in the middle, with a checkpoint
#: every 5,000 steps: the rank is killed once its live file shows a step past the first checkpoint (the flush a
#: second after the checkpoint's own, thousands of steps before the next), so that the failed incarnation did
#: record steps the next one takes again, which the run must drop
LONG = ["--algorithm", "sync-sgd", "--ranks", "2", "--epochs", "240", "--checkpoint-every", "5000", "--no-progress"]


def _cli(tmp_path: Path, out: str, *options: str) -> list[str]:
    return [sys.executable, "-m", "workbench.cli", "train", *options, "--out", str(tmp_path / out),
            "--store", str(tmp_path / "store.sqlite")]


def _env(tmp_path: Path) -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=str(tmp_path))


def _rank_process(cli: psutil.Process, rank: int) -> psutil.Process | None:
    for proc in cli.children(recursive=True):
        try:
            line = " ".join(proc.cmdline())
            if ("workbench.runtime.rank.worker" in line and "rankguard" not in line  # the rank, not its guard
                    and proc.environ().get("PMI_RANK") == str(rank)):
                return proc
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return None


def _steps_seen(run_dir: Path, rank: int) -> int:
    path = run_dir / "live" / f"rank{rank}.jsonl"
    steps = [r["step"] for line in (path.read_text().splitlines() if path.exists() else [])
             for r in json.loads(line).get("metrics", ()) if r.get("kind") == "train"]
    return max(steps, default=-1)


@pytest.mark.mpi
def test_a_killed_rank_restarts_from_the_checkpoint_and_the_run_ends_as_if_never_killed(tmp_path):
    whole = subprocess.run(_cli(tmp_path, "whole", *LONG), cwd=ROOT, env=_env(tmp_path), capture_output=True,
                           text=True, timeout=300)
    assert whole.returncode == 0, whole.stderr[-3000:]
    expected = json.loads((tmp_path / "whole" / "summary.json").read_text())
    run_dir = tmp_path / "elastic"
    cli = subprocess.Popen(_cli(tmp_path, "elastic", *LONG, "--max-restarts", "1"), cwd=ROOT, env=_env(tmp_path),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while _steps_seen(run_dir, 1) < 5000 and time.monotonic() < deadline and cli.poll() is None:
            time.sleep(0.05)
        victim = _rank_process(psutil.Process(cli.pid), 1)
        assert victim is not None and _steps_seen(run_dir, 1) >= 5000, "rank 1 was not found in the middle of the run"
        victim.send_signal(signal.SIGKILL)
        out, err = cli.communicate(timeout=300)
    finally:
        if cli.poll() is None:
            cli.kill()
    assert cli.returncode == 0, err[-3000:]
    fault_lines = [line for line in err.splitlines() if "fault 1 of at most 1" in line]
    assert len(fault_lines) == 1 and "rank 1" in fault_lines[0] and "signal 9" in fault_lines[0], err[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    [fault] = summary["restarts"]
    assert summary["incarnations"] == 2 and fault["rank"] == 1 and "signal 9" in fault["cause"]
    # the newest checkpoint before the kill (the live file is up to a second behind the rank), before the end
    assert fault["resumed_from_step"] == 5000
    failed = [json.loads(line) for path in sorted((run_dir / "live.1").glob("rank*.jsonl"))  # kept aside
              for line in path.read_text().splitlines()]
    assert max(r["step"] for m in failed for r in m.get("metrics", ()) if r.get("kind") == "train") >= 5000
    assert 0 < fault["recovery_seconds"] < 120
    # the same weights, bit for bit, as the run nobody killed: the restart lost nothing and repeated nothing
    assert summary["weights_checksum"] == expected["weights_checksum"]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for rank in (0, 1):  # every step once: what the failed incarnation recorded after its checkpoint is gone
        steps = [r["step"] for r in records if r.get("kind") == "train" and r["rank"] == rank]
        assert sorted(steps) == list(range(expected["steps_per_worker"])), rank
    assert [r["step"] for r in records if r.get("kind") == "resume"] == [fault["resumed_from_step"]] * 2
    stored = Store(tmp_path / "store.sqlite").load("elastic")
    assert stored.status == "finished" and stored.summary["restarts"][0]["rank"] == 1


@pytest.mark.mpi
def test_a_run_that_exhausts_its_restarts_ends_failed_with_every_fault_named(tmp_path):
    done = subprocess.run(_cli(tmp_path, "run", "--algorithm", "sync-sgd", "--ranks", "2", "--epochs", "3",
                               "--checkpoint-every", "10", "--max-restarts", "2", "--fail-rank", "1", "--fail-step",
                               "25", "--no-progress"), cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 1, done.stderr[-3000:]
    assert [line.split(":")[2].strip() for line in done.stderr.splitlines() if " of at most 2: " in line] == \
        ["fault 1 of at most 2", "fault 2 of at most 2"], done.stderr[-3000:]
    assert "restarting from its checkpoint at step 20 on 2 ranks (incarnation 3)" in done.stderr
    assert "(the run had restarted 2 times before: fault 1: rank 1 " in done.stderr
    stored = Store(tmp_path / "store.sqlite").load("run")
    assert stored.status == "failed" and "injected failure on rank 1 at step 25" in stored.error
    assert "had restarted 2 times before" in stored.error
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(tmp_path) in " ".join(p.info["cmdline"] or [])]


def test_restarts_without_checkpoints_are_one_line_before_anything_starts(tmp_path):
    done = subprocess.run(_cli(tmp_path, "run", "--algorithm", "sync-sgd", "--ranks", "2", "--max-restarts", "1"),
                          cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "--max-restarts: a restart continues from the run's newest checkpoint" in done.stderr
    assert "--checkpoint-every K" in done.stderr and not (tmp_path / "run").exists()
