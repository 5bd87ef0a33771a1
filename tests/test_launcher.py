"""One launch stack: the launcher protocol's batch backends (start, wait, signal, stop, records) on a
real ``mpiexec``, and the CLI's run handle (``BatchRun``) as the notebook's ``Run`` behaves: one status,
the records as they come, the store's row, ``wait()`` that names the failed rank."""
from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest

from workbench.config import RunConfig
from workbench.results import RunObserver
from workbench.runtime.client.batch_run import BatchRun
from workbench.runtime.client.handle import RunError, RunHandle
from workbench.runtime.client.run import Run
from workbench.runtime.client.watch import WatchedRun
from workbench.runtime.launch.launcher import (BACKENDS, Launcher, MPILaunchError, Mpiexec, Srun, batch_launcher,
                                               run_mpi)
from workbench.store import Store

ROOT = Path(__file__).resolve().parent.parent

SLEEPER = """
import sys, time
from mpi4py import MPI
print(f"rank {MPI.COMM_WORLD.Get_rank()} up", flush=True)
time.sleep(float(sys.argv[1]))
"""


def test_the_backends_are_named_and_checked_before_anything_starts():
    assert set(BACKENDS) == {"mpiexec", "srun"} and issubclass(Mpiexec, Launcher) and issubclass(Srun, Launcher)
    assert Srun.abort_kills_all and not Mpiexec.abort_kills_all  # what blame reads, said by the backend
    with pytest.raises(ValueError, match="launcher must be one of mpiexec, srun, got 'pbs'"):
        batch_launcher("pbs", 2, ["-c", "pass"])
    with pytest.raises(ValueError, match="srun_args are srun's arguments"):
        batch_launcher("mpiexec", 2, ["-c", "pass"], srun_args=["--mpi=pmi2"])
    with pytest.raises(ValueError, match="mpi_args are mpiexec's arguments"):
        batch_launcher("srun", 2, ["-c", "pass"], mpi_args=["-hosts", "a"])
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        run_mpi(2, ["-c", "pass"], timeout=float("nan"))


@pytest.mark.mpi
def test_mpiexec_backend_starts_signals_stops_and_records_each_rank(tmp_path):
    program = tmp_path / "sleeper.py"
    program.write_text(SLEEPER)
    backend = Mpiexec(2, [str(program), "120"], cwd=ROOT, job_dir=tmp_path / "job")
    backend.start()
    try:
        deadline = time.monotonic() + 60
        while len(backend.records()[0]) < 2:  # each rank's guard records its start
            assert backend.job.proc.poll() is None and time.monotonic() < deadline, backend.job.launcher_output()
            time.sleep(0.1)
        starts, ends = backend.records()
        assert sorted(starts) == [0, 1] and ends == []
        assert all(s["pid"] and s["host"] for s in starts.values())
        backend.signal(signal.SIGTERM)  # mpiexec passes it to every rank
        began = time.monotonic()
        assert backend.wait(60) == "exited"
        assert time.monotonic() - began < 30  # not the program's 120 s
    finally:
        backend.stop()
    assert backend.result.returncode != 0
    assert {e["rank"] for e in backend.ends} == {0, 1}
    # hydra passes SIGTERM on to the ranks (their guards record it), or ends them through their guards
    # (recorded as its own stop): either way no rank ran on, and none ended well
    assert all(e.get("signal") == signal.SIGTERM or e.get("launcher_stopped") for e in backend.ends), backend.ends
    assert not list((tmp_path / "job").glob("workbench-mpi-*"))  # the job's folder went with it
    with pytest.raises(MPILaunchError, match=r"MPI job on 2 ranks exited with code"):
        backend.raise_unless_ok(60)


class Seen(RunObserver):
    def __init__(self):
        self.data, self.finished = 0, 0

    def on_data(self, run):
        self.data += 1

    def on_finish(self, run):
        self.finished += 1


def test_every_front_end_holds_the_same_run_handle():
    for kind in (Run, BatchRun, WatchedRun):
        assert issubclass(kind, RunHandle)
        # the status, the spans, the store's row and the end are said once, in the handle
        for shared in ("status", "trace", "_transition", "_end", "_record_start", "_store_records", "_outcome"):
            assert shared not in vars(kind), f"{kind.__name__} has its own {shared}"


@pytest.mark.mpi
def test_the_cli_run_handle_records_and_blames_like_a_notebook_run(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    cfg = RunConfig(algorithm="sync-sgd", ranks=2, epochs=1, dataset="digits", model="mlp",
                    fail_rank=1, fail_step=30)
    run = BatchRun(store, "failing", cfg, tmp_path / "failing", timeout=120)
    seen = Seen()
    run.add_observer(seen)
    assert run.status == "running" and "failing" not in store
    with pytest.raises(MPILaunchError, match="rank 1"):
        run.run()
    assert run.status == "failed" and run.done() and seen.finished == 1
    with pytest.raises(RunError, match="injected failure on rank 1 at step 30"):
        run.wait(0)
    stored = store.load("failing")
    assert stored.status == "failed" and "rank 1" in stored.error
    steps = stored.history.query("kind == 'train'")["step"]
    assert len(steps) >= 30 and steps.max() < 40  # the records that came before the failure, kept
    assert len(run.history) == len(stored.history)  # what the handle holds is what the store keeps

    ok = BatchRun(store, "ok", RunConfig(algorithm="sync-sgd", ranks=2, epochs=1, dataset="digits", model="mlp"),
                  tmp_path / "ok", timeout=120)
    result = ok.run()
    assert ok.status == "finished" == store.load("ok").status and ok.wait(0) is result
    assert result.summary["final_test_accuracy"] > 0.5
    assert repr(ok).startswith("<workbench.BatchRun ok sync-sgd finished:")
    assert repr(ok).endswith(f"finished: {result.summary['steps_per_worker']} steps a worker, "
                             f"accuracy {result.summary['final_test_accuracy']:.3f}>")  # no restart to name
