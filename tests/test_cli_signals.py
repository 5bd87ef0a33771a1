"""``workbench train`` as a real process: a signal stops the whole MPI job and the store and run
folder agree; a rank that is killed is the rank the error names, with how it died (issue 11)."""
from __future__ import annotations

import socket

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from workbench.runtime.launch.leftovers import mapped_shm

pytestmark = pytest.mark.mpi

ROOT = Path(__file__).resolve().parent.parent
MARK = "WORKBENCH_TEST_MARK"


def _start(tmp_path: Path, *options: str) -> tuple[subprocess.Popen, str]:
    """``workbench train`` in its own session (a terminal's job), its processes marked."""
    mark = uuid.uuid4().hex
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env = dict(os.environ, **{MARK: mark, "TMPDIR": str(tmp_path / "tmp"), "OMP_NUM_THREADS": "1"})
    cmd = [sys.executable, "-m", "workbench.cli", "train", *options,
           "--store", str(tmp_path / "store.sqlite"), "--out", str(tmp_path / "run")]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    return proc, mark


def _marked(mark: str) -> list[psutil.Process]:
    """Live processes (zombies aside) started under this test's CLI."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(MARK) == mark and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.Error, OSError):
            continue
    return found


def _ranks(mark: str) -> dict[int, psutil.Process]:
    """Each rank's own process (``python -m mpi4py ...``, not its guard), by rank."""
    ranks = {}
    for p in _marked(mark):
        try:
            rank, cmd = p.environ().get("PMI_RANK"), p.cmdline()
        except (psutil.Error, OSError):
            continue
        if rank is not None and cmd[1:3] == ["-m", "mpi4py"]:
            ranks[int(rank)] = p
    return ranks


def _wait_for(what, timeout: float, proc: subprocess.Popen, step: float = 0.3):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the CLI ended early ({proc.returncode}):\n{out[-2000:]}\n{err[-3000:]}")
        time.sleep(step)
    proc.kill()
    pytest.fail("timed out waiting for the run")


def _shm_of(processes) -> set[str]:
    """The MPICH shared-memory segments these processes map."""
    return mapped_shm(p.pid for p in processes)


def _row(tmp_path: Path) -> tuple[str, str | None, dict | None]:
    with sqlite3.connect(tmp_path / "store.sqlite") as conn:
        rows = conn.execute("SELECT status, error, summary FROM runs").fetchall()
    assert len(rows) == 1, rows
    status, error, summary = rows[0]
    return status, error, json.loads(summary) if summary else None


def _assert_nothing_left(tmp_path: Path, mark: str, segments: set[str]) -> None:
    deadline = time.monotonic() + 5  # orphans, if any, would be reaped by init meanwhile
    while _marked(mark) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [(p.pid, p.cmdline()) for p in _marked(mark)]
    assert not left, f"processes of the run are still there: {left}"
    assert not list((tmp_path / "tmp").glob("workbench-mpi-*")), "the launcher's temporary folder is left"
    assert segments, "the ranks mapped no MPICH segment (nothing to check)"
    assert not [s for s in segments if Path("/dev/shm", s).exists()], "the job's /dev/shm segments are left"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_stops_the_whole_job_and_the_store_agrees_with_the_run_folder(tmp_path, signum):
    proc, mark = _start(tmp_path, "--algorithm", "sync-easgd", "--ranks", "2", "--epochs", "3000",
                        "--checkpoint-every", "20")
    latest = tmp_path / "run" / "checkpoint" / "latest.json"
    _wait_for(lambda: latest.exists() and len(_ranks(mark)) == 2, 120, proc)  # training is under way
    segments = _shm_of(_ranks(mark).values())
    start = time.monotonic()
    if signum == signal.SIGTERM:
        os.kill(proc.pid, signum)  # `kill PID`
    else:
        os.killpg(proc.pid, signum)  # Ctrl-C, or the terminal closing: the whole foreground group
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 128 + signum, err[-3000:]
    assert time.monotonic() - start < 30  # cooperative cancel, or the kill after the grace period
    assert f"interrupted by {signal.Signals(signum).name}" in err
    _assert_nothing_left(tmp_path, mark, segments)

    status, error, stored = _row(tmp_path)
    summary_path = tmp_path / "run" / "summary.json"
    if summary_path.exists():  # the ranks stopped by themselves: rank 0 wrote a cancelled summary
        summary = json.loads(summary_path.read_text())
        assert summary["cancelled"] is True
        assert status == "cancelled" and stored is not None and stored["cancelled"] is True
    else:  # killed after the grace period
        assert status == "cancelled" and stored is None
        assert signal.Signals(signum).name in error
    assert f"recorded as {status}" in err
    assert not (tmp_path / "run" / "CANCEL").exists()


@pytest.mark.parametrize("algorithm,ranks,victim", [("sync-easgd", 2, 0), ("sync-easgd", 2, 1),
                                                     ("async-easgd", 4, 0), ("async-easgd", 4, 3)])
def test_a_killed_rank_is_the_rank_named_with_its_signal(tmp_path, algorithm, ranks, victim):
    proc, mark = _start(tmp_path, "--algorithm", algorithm, "--ranks", str(ranks), "--epochs", "2000")

    def started():  # every rank is there and past MPI_Init (it maps the node's shared memory)
        found = _ranks(mark)
        return len(found) == ranks and all(_shm_of([p]) for p in found.values()) and found

    found = _wait_for(started, 120, proc)
    segments = _shm_of(found.values())
    time.sleep(0.5)
    pid = found[victim].pid
    os.kill(pid, signal.SIGKILL)
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 1, err[-3000:]
    message = err.split("workbench train: ", 1)[1]
    first_line = message.splitlines()[0]
    assert first_line.startswith(f"rank {victim} on node {socket.gethostname()} (pid {pid}) "), err[-3000:]
    assert "killed by signal 9 (SIGKILL)" in first_line
    others = [r for r in range(ranks) if r != victim]
    assert not any(f"rank {r} " in message or f"rank(s) {r}" in message for r in others), message
    _assert_nothing_left(tmp_path, mark, segments)
    status, error, _ = _row(tmp_path)
    assert status == "failed"
    assert error.startswith(f"rank {victim} on node {socket.gethostname()} (pid {pid}) ") and "SIGKILL" in error.splitlines()[0]


def test_a_rank_that_raises_is_still_named_with_its_traceback(tmp_path):
    proc, mark = _start(tmp_path, "--algorithm", "sync-easgd", "--ranks", "2", "--epochs", "50",
                        "--fail-rank", "1", "--fail-step", "3")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err[-3000:]
    assert "rank(s) 1 failed" in err and "Traceback" in err
    assert "injected failure on rank 1 at step 3" in err
    assert not _marked(mark)
    status, error, _ = _row(tmp_path)
    assert status == "failed" and "injected failure on rank 1" in error
