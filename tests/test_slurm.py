"""The HPC path against a running Slurm (the session's private single-node Slurm 22.05,
``local_slurm``, ``MpiDefault=none``; the pip MPICH's ranks find each other through
``srun --mpi=pmi2``): ``wb.Cluster(engines="slurm")`` from start to stop, ``workbench train`` under
srun (inside an ``sbatch`` job and with ``--launcher srun``), and what a Slurm user meets when
something is wrong. One Slurm cluster of 4 engines serves the module; the node has fewer CPUs
than that, so jobs ask for ``--overcommit`` (4 tasks on 2 cores, as the mpiexec tests run).
"""
from __future__ import annotations

import socket

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from workbench.config import ConfigError, RunConfig
from workbench.runtime.client import records
from workbench.runtime.client.cluster import Cluster, cleanup_stale_clusters
from workbench.runtime.client.run import RunError

pytestmark = [pytest.mark.slurm, pytest.mark.mpi]

ROOT = Path(__file__).resolve().parent.parent
PMI = ["--mpi=pmi2"]  # the fixture's MpiDefault is none, as on many real clusters
OVERCOMMIT = "#SBATCH --overcommit"  # 4 tasks on a node with fewer CPUs
TIMES: dict[str, float] = {}  # what the module measured, printed at its end


@pytest.fixture(scope="module")
def slurm_env(local_slurm, tmp_path_factory):
    """This process as a Slurm user of the fixture: SLURM_CONF set, no SLURM_* of any job this
    test run may itself be in, a private state folder; the working directory is a scratch folder
    (nothing may be written there)."""
    scratch = tmp_path_factory.mktemp("slurm")
    with pytest.MonkeyPatch.context() as mp:
        for key in [k for k in os.environ if k.startswith("SLURM_")]:
            mp.delenv(key)
        mp.setenv("SLURM_CONF", local_slurm.env["SLURM_CONF"])
        mp.setenv("WORKBENCH_STATE_DIR", str(scratch / "state"))
        (scratch / "cwd").mkdir()
        mp.chdir(scratch / "cwd")
        yield local_slurm, scratch
    if TIMES:
        print("\nSlurm timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in TIMES.items()))


@pytest.fixture(scope="module")
def cluster(slurm_env):
    started = time.monotonic()
    c = Cluster(n=4, engines="slurm", srun_args=PMI, options=OVERCOMMIT, start_timeout=120)
    try:
        c.start()
        TIMES["cluster start (4 engines)"] = time.monotonic() - started
        yield c
    finally:
        c.stop()


def _squeue(job: str) -> str:
    """The job's state as plain ``squeue -j`` lists it (pending, running, completing), '' once gone."""
    return subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True).stdout.strip()


def _gone_from_squeue(job: str, timeout: float = 20) -> bool:
    deadline = time.monotonic() + timeout
    while _squeue(job) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not _squeue(job)


def _engine_states(cluster) -> dict:
    """rank -> (process state, CPU seconds) of the engines: what a hung run looks like."""
    states = {}
    for rank, pid in cluster.pids.items():
        try:
            p = psutil.Process(pid)
            states[rank] = (p.status(), round(sum(p.cpu_times()[:2]), 1))
        except psutil.Error as exc:
            states[rank] = type(exc).__name__
    return states


# -- wb.Cluster(engines="slurm") -----------------------------------------------------------
def test_engines_are_one_mpi_job_in_a_recorded_slurm_job(cluster, slurm_env):
    _, scratch = slurm_env
    assert sorted(cluster.ranks.values()) == [0, 1, 2, 3]
    assert _squeue(cluster.slurm_job) == "RUNNING"
    record = json.loads((scratch / "state" / "clusters" / f"{cluster.cluster_id}.json").read_text())
    assert record["slurm_jobs"] == [cluster.slurm_job] and record["engines"] == "slurm"
    folder = scratch / "state" / "batch" / cluster.cluster_id
    scripts = list(folder.glob("engines-*.sbatch"))
    assert len(scripts) == 1 and "srun --kill-on-bad-exit=1 --mpi=pmi2" in scripts[0].read_text()
    assert list(folder.glob("engines-*.out"))  # Slurm's output of the job
    assert os.listdir(scratch / "cwd") == [], "the batch script or Slurm output went to the working directory"


def test_train_streams_live_history_from_the_slurm_engines(cluster, tmp_path):
    started = time.monotonic()
    run = cluster.train(RunConfig(algorithm="sync-easgd", ranks=4, epochs=3), tmp_path / "run", store=False)
    seen_while_running = 0
    deadline = time.monotonic() + 150
    while not run.done():
        seen_while_running = max(seen_while_running, len(run.history))
        if time.monotonic() > deadline:
            steps = (run.history["kind"] == "train").sum() if len(run.history) else 0
            run.cancel(timeout=10)
            pytest.fail(f"the run did not end in 150 s: {steps} of {run.total_steps} steps arrived; "
                        f"engines {_engine_states(cluster)}; Slurm output:\n{cluster.slurm_output(20)}")
        time.sleep(0.05)
    result = run.wait(timeout=120)
    TIMES["train 3 epochs"] = time.monotonic() - started
    assert result.status == "finished" and result.summary["steps"] == run.total_steps
    assert seen_while_running > 0  # the dashboard's data arrived before the end
    live = run.history
    assert (live["kind"] == "train").sum() == run.total_steps
    assert sorted(live.loc[live["kind"] == "train", "rank"].unique()) == [0, 1, 2, 3]


def test_cancel_stops_the_ranks_and_keeps_the_job(cluster, tmp_path):
    job = cluster.slurm_job
    run = cluster.train(RunConfig(algorithm="sync-sgd", ranks=4, epochs=500), tmp_path / "c", store=False)
    while (run.history["kind"] == "train").sum() < 20:
        time.sleep(0.05)
    result = run.cancel(timeout=30)
    assert result.status == "cancelled" and 0 < result.summary["steps"] < run.total_steps
    assert cluster.healthy() and cluster.slurm_job == job  # no new job: the engines were kept


def test_failing_rank_is_named_and_a_new_job_replaces_the_engines(cluster, tmp_path):
    job = cluster.slurm_job
    run = cluster.train(RunConfig(algorithm="sync-sgd", ranks=4, epochs=3, fail_rank=2, fail_step=5),
                        tmp_path / "fail", store=False)
    with pytest.raises(RunError) as info:
        run.wait(timeout=180)
    assert info.value.rank == 2 and "injected failure on rank 2" in str(info.value)
    assert cluster.slurm_job != job and _gone_from_squeue(job)  # the old job was cancelled
    assert cluster.healthy() and sorted(cluster.ranks.values()) == [0, 1, 2, 3]


def test_killed_engine_is_named_with_its_rank_pid_and_signal(cluster, tmp_path):
    run = cluster.train(RunConfig(algorithm="sync-easgd", ranks=4, epochs=200), tmp_path / "die", store=False)
    while len(run.history) < 20:
        time.sleep(0.05)
    pid = cluster.pids[1]
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(RunError) as info:
        run.wait(timeout=120)
    assert info.value.rank == 1
    assert str(info.value).startswith(f"rank 1 on node {socket.gethostname()} (pid {pid}) ") and "killed by signal 9 (SIGKILL)" in str(info.value)
    assert cluster.healthy()


def test_sweep_runs_on_the_slurm_cluster(cluster, tmp_path):
    from workbench.store import Store
    from workbench.sweep import Sweep
    store = Store(tmp_path / "sweep.sqlite")
    sweep = Sweep(RunConfig(algorithm="sync-sgd", ranks=4, epochs=1), {"lr": [0.05, 0.1]}, seeds=[0],
                  store=store, name="slurm")
    frame = sweep.run(cluster, progress=False)
    assert len(frame) == 2 and set(frame["status"]) == {"finished"}
    assert sorted(frame["lr"]) == [0.05, 0.1]
    assert Sweep(RunConfig(algorithm="sync-sgd", ranks=4, epochs=1), {"lr": [0.05, 0.1]}, seeds=[0],
                 store=store, name="slurm").pending() == []


def test_stop_takes_the_job_out_of_squeue(cluster, slurm_env):
    # runs last of the module cluster's tests (file order); the fixture's stop() is then a no-op
    _, scratch = slurm_env
    jobs, cluster_id = list(cluster._slurm_jobs), cluster.cluster_id
    started = time.monotonic()
    cluster.stop()
    TIMES["cluster stop"] = time.monotonic() - started
    assert all(_squeue(job) == "" for job in jobs), [(job, _squeue(job)) for job in jobs]
    assert records.processes_of(cluster_id) == []
    assert not (scratch / "state" / "batch" / cluster_id).exists()
    assert not (scratch / "state" / "clusters" / f"{cluster_id}.json").exists()


# -- what a Slurm user meets when something is wrong -----------------------------------------
def test_engines_without_a_pmi_give_a_one_line_config_error(slurm_env):
    with pytest.raises(ConfigError) as info:
        Cluster(n=2, engines="slurm", start_timeout=120).start()
    message = str(info.value)
    assert "\n" not in message and "each is rank 0 of size 1" in message
    assert 'srun_args=["--mpi=pmix"] or ["--mpi=pmi2"]' in message
    assert "`srun --mpi=list` offers here: " in message and "pmi2" in message.rsplit("offers here: ", 1)[1]


def test_a_request_the_cluster_can_never_satisfy_fails_fast_and_cancels_its_job(slurm_env):
    local, _ = slurm_env
    started = time.monotonic()
    c = Cluster(n=64 * local.cpus, engines="slurm", srun_args=PMI, start_timeout=30)
    with pytest.raises((RuntimeError, TimeoutError)) as info:
        c.start()
    assert time.monotonic() - started < 30 + 15
    message = str(info.value)
    job = message.split("Slurm job ", 1)[1].split()[0]
    assert f"({64 * local.cpus} tasks)" in message and "the job was cancelled" in message
    assert "PartitionConfig" in message or "pending" in message
    assert _gone_from_squeue(job)


def test_a_job_still_pending_at_start_timeout_is_cancelled_with_slurms_reason(slurm_env):
    started = time.monotonic()
    c = Cluster(n=2, engines="slurm", srun_args=PMI, options="#SBATCH --begin=now+1hour", start_timeout=3)
    with pytest.raises(TimeoutError) as info:
        c.start()
    assert time.monotonic() - started < 3 + 15
    message = str(info.value)
    assert "was still pending after 3 s (start_timeout), Slurm's reason: BeginTime; the job was cancelled" in message
    assert _gone_from_squeue(message.split("Slurm job ", 1)[1].split()[0])


def test_a_job_that_ends_before_its_engines_register_shows_its_slurm_output(slurm_env):
    with pytest.raises(RuntimeError) as info:
        Cluster(n=2, engines="slurm", srun_args=["--mpi=no_such_plugin"], start_timeout=60).start()
    message = str(info.value)
    assert "ended (FAILED) after 0 of 2 engines registered" in message or "ended (" in message
    assert "no_such_plugin" in message  # srun's own complaint, from the job's output file


def test_a_dead_kernels_slurm_job_is_cancelled_by_the_next_cluster(slurm_env, tmp_path, monkeypatch):
    script = textwrap.dedent(f"""
        import os
        from workbench.runtime.client.cluster import Cluster
        import psutil
        c = Cluster(n=2, engines="slurm", srun_args={PMI!r}, start_timeout=120).start()
        here = [p.pid for p in psutil.Process().children(recursive=True)]  # the controller
        print(c.cluster_id, c.slurm_job, *here, flush=True)
        os.kill(os.getpid(), 9)  # a kernel that dies without stopping its cluster
    """)
    state = tmp_path / "state"
    env = {**os.environ, "WORKBENCH_STATE_DIR": str(state)}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=180)
    assert proc.stdout.strip(), proc.stderr[-3000:]
    cluster_id, job, *controller = proc.stdout.split()
    assert controller and all(psutil.pid_exists(int(pid)) for pid in controller)
    assert _squeue(job) == "RUNNING", "the dead kernel's engine job should still run"
    monkeypatch.setenv("WORKBENCH_STATE_DIR", str(state))
    assert cleanup_stale_clusters() == [cluster_id]  # what the next wb.Cluster().start() does first
    assert _squeue(job) == ""
    assert records.processes_of(cluster_id) == []
    assert not [pid for pid in controller if psutil.pid_exists(int(pid))
                and psutil.Process(int(pid)).status() != psutil.STATUS_ZOMBIE], "the controller is left"
    assert not list((state / "clusters").glob("*.json"))


# -- workbench train under srun --------------------------------------------------------------
def _cli(*args: str, env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workbench.cli", *args], capture_output=True, text=True,
                          env=env or dict(os.environ), timeout=timeout, cwd=ROOT)


def _row(store: Path, run_id: str) -> tuple[str, str | None]:
    with sqlite3.connect(store) as conn:
        return conn.execute("SELECT status, error FROM runs WHERE run_id = ?", (run_id,)).fetchone()


def test_sbatch_wrap_workbench_train_runs_its_ranks_with_srun(slurm_env, tmp_path):
    store, out, log = tmp_path / "store.sqlite", tmp_path / "run", tmp_path / "job.out"
    command = (f"{sys.executable} -m workbench.cli train --algorithm sync-sgd --ranks 4 --epochs 1 "
               f"--srun-args=--mpi=pmi2 --out {out} --store {store}")
    started = time.monotonic()
    submitted = subprocess.run(["sbatch", "--parsable", "-n", "4", "--overcommit", "-o", str(log),
                                "--chdir", str(ROOT), "--wrap", command], capture_output=True, text=True, timeout=30)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    assert _gone_from_squeue(job, timeout=240), f"job {job} still in squeue: {log.read_text()[-2000:]}"
    TIMES["sbatch --wrap workbench train (1 epoch)"] = time.monotonic() - started
    text = log.read_text()
    assert f"launcher             srun --mpi=pmi2 in Slurm job {job}" in text, text[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ranks"] == 4 and summary["steps"] > 0
    assert _row(store, "run") == ("finished", None)
    runs = _cli("runs", "--store", str(store))
    assert runs.returncode == 0 and "finished" in runs.stdout
    assert any(line.split()[:1] == ["run"] for line in runs.stdout.splitlines()), runs.stdout


SRUN = ["--launcher", "slurm", "--srun-args=--mpi=pmi2 --overcommit"]


def test_cli_fail_rank_under_srun_names_the_rank_with_its_traceback(slurm_env, tmp_path):
    store = tmp_path / "store.sqlite"
    proc = _cli("train", "--algorithm", "sync-sgd", "--ranks", "4", "--epochs", "3", "--fail-rank", "1",
                "--fail-step", "3", *SRUN, "--out", str(tmp_path / "run"), "--store", str(store))
    assert proc.returncode == 1, proc.stderr[-3000:]
    message = proc.stderr.split("workbench train: ", 1)[1]
    assert message.startswith(f"rank 1 on node {socket.gethostname()} (pid "), message[:2000]
    assert "injected failure on rank 1 at step 3" in message and "Traceback" in message
    status, error = _row(store, "run")
    assert status == "failed" and error.startswith("rank 1 ")


def test_cli_killed_rank_under_srun_is_named_and_nothing_is_left(slurm_env, tmp_path):
    store, mark = tmp_path / "store.sqlite", f"wb-test-{os.getpid()}-{time.time_ns()}"
    env = dict(os.environ, WORKBENCH_TEST_MARK=mark)
    proc = subprocess.Popen([sys.executable, "-m", "workbench.cli", "train", "--algorithm", "sync-easgd",
                             "--ranks", "4", "--epochs", "2000", *SRUN, "--out", str(tmp_path / "run"),
                             "--store", str(store)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)

    def ranks() -> dict[int, psutil.Process]:
        found = {}
        for p in psutil.process_iter():
            try:
                environ, cmd = p.environ(), p.cmdline()
            except (psutil.Error, OSError):
                continue
            if environ.get("WORKBENCH_TEST_MARK") == mark and cmd[1:3] == ["-m", "mpi4py"]:
                found[int(environ["SLURM_PROCID"])] = p
        return found

    deadline = time.monotonic() + 120
    while len(found := ranks()) < 4:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the ranks did not start"
        time.sleep(0.3)
    time.sleep(3)  # past MPI_Init
    victim = found[2]
    victim.kill()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err[-3000:]
    first_line = err.split("workbench train: ", 1)[1].splitlines()[0]
    assert first_line.startswith(f"rank 2 on node {socket.gethostname()} (pid {victim.pid}) "), err[-3000:]
    assert "killed by signal 9 (SIGKILL)" in first_line
    time.sleep(1)
    assert not ranks(), "ranks of the job are still running"
    assert _row(store, "run")[0] == "failed"


def test_cli_timeout_under_srun_cancels_the_step(slurm_env, tmp_path):
    proc = _cli("train", "--algorithm", "sync-sgd", "--ranks", "4", "--epochs", "2000", *SRUN,
                "--timeout", "10", "--out", str(tmp_path / "run"), "--store", str(tmp_path / "store.sqlite"))
    assert proc.returncode == 1 and "ran past its 10 s timeout and was killed" in proc.stderr, proc.stderr[-3000:]
    name = proc.stderr.split("--job-name=", 1)[1].split()[0]
    jobs = subprocess.run(["squeue", "-h", "-n", name, "-o", "%i"], capture_output=True, text=True).stdout.split()
    assert all(_gone_from_squeue(job) for job in jobs)
    assert not [p for p in psutil.process_iter(["cmdline"]) if name in " ".join(p.info["cmdline"] or [])]
