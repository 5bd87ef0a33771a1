"""The private single-node Slurm (workbench.vcluster.slurm_local) that the Slurm tests
run on: MPI ranks under srun, batch jobs, cancelling, a clean stop, clear errors."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from workbench.vcluster.slurm_local import LocalSlurm, SlurmUnavailable, leftover_pids

# the venv's python by its absolute path (not resolved: the venv's symlink is what finds mpi4py)
PYTHON = os.path.abspath(sys.executable)
HELLO = "from mpi4py import MPI; print(MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size())"
slurm = pytest.mark.slurm


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _until(check, timeout: float = 20, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not reached in {timeout} s", pytrace=False)
        time.sleep(0.1)


def _ok(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 0, f"{res.args} exited {res.returncode}: {res.stderr}"
    return res.stdout


@slurm
def test_srun_pmi2_starts_one_mpi_job(local_slurm, tmp_path):
    out = _ok(local_slurm.run(["srun", "-n", "2", "--mpi=pmi2", "--kill-on-bad-exit=1", PYTHON,
                                   "-c", HELLO], cwd=tmp_path, timeout=30))
    assert sorted(out.split("\n")[:-1]) == ["0 2", "1 2"]


@slurm
def test_without_pmi2_every_task_is_a_singleton(local_slurm, tmp_path):
    # MpiDefault=none: no PMI server, so each MPICH task initialises alone
    out = _ok(local_slurm.run(["srun", "-n", "2", "--kill-on-bad-exit=1", PYTHON, "-c", HELLO],
                              cwd=tmp_path, timeout=30))
    assert out.split("\n")[:-1] == ["0 1", "0 1"]


@slurm
def test_more_tasks_than_cpus_with_overcommit(local_slurm, tmp_path):
    n = 2 * local_slurm.cpus
    out = _ok(local_slurm.run(["srun", "-n", str(n), "--overcommit", "hostname"], cwd=tmp_path))
    assert len(out.split()) == n


@slurm
def test_sbatch_wrap_writes_its_output(local_slurm, tmp_path):
    job = _ok(local_slurm.run(["sbatch", "--parsable", "-o", str(tmp_path / "job-%j.out"),
                               "--wrap", "echo hello from job $SLURM_JOB_ID"],
                              cwd=tmp_path)).strip().split(";")[0]
    out = tmp_path / f"job-{job}.out"

    def finished():
        queued = _ok(local_slurm.run(["squeue", "-h", "-o", "%i"])).split()
        return job not in queued and out.exists() and out.read_text()
    assert _until(finished, what=f"job {job}'s output") == f"hello from job {job}\n"


@slurm
def test_scancel_removes_a_running_job(local_slurm, tmp_path):
    job = _ok(local_slurm.run(["sbatch", "--parsable", "-o", "/dev/null", "--wrap", "sleep 300"],
                              cwd=tmp_path)).strip().split(";")[0]

    def state():
        lines = _ok(local_slurm.run(["squeue", "-h", "-o", "%i %T"])).splitlines()
        return dict(line.split() for line in lines).get(job)
    _until(lambda: state() == "RUNNING", what=f"job {job} running")
    _ok(local_slurm.run(["scancel", job]))
    _until(lambda: state() is None, what=f"job {job} gone from squeue")
    assert "JobState=CANCELLED" in _ok(local_slurm.run(["scontrol", "show", "job", job]))


@slurm
def test_srun_mpi_list(local_slurm):
    res = local_slurm.run(["srun", "--mpi=list"])
    listing = res.stdout + res.stderr
    print(listing)
    assert res.returncode == 0 and "pmi2" in listing and "none" in listing, listing


def test_a_missing_binary_is_a_clear_error(tmp_path):
    s = LocalSlurm(binaries={"slurmctld": str(tmp_path / "no-such-slurmctld")})
    with pytest.raises(SlurmUnavailable) as err:
        s.start()
    message = str(err.value)
    assert "\n" not in message and "slurmctld not found" in message
    assert str(tmp_path / "no-such-slurmctld") in message and "make slurm" in message
    assert not s.root.exists()


@slurm
def test_a_daemon_that_exits_is_named_and_nothing_is_left(tmp_path):
    s = LocalSlurm(binaries={"slurmd": "/bin/false"})
    with pytest.raises(SlurmUnavailable, match=r"^slurmd exited with code 1 while starting") as err:
        s.start(timeout=30)
    assert "\n" not in str(err.value)
    assert not s.root.exists() and not leftover_pids(s.root, s.cluster)


@slurm
def test_stop_leaves_no_process(local_slurm, tmp_path):
    # a second instance beside the session's: its own ports, paths and cluster name
    s = LocalSlurm(mpi_default="pmi2")
    with s:
        assert s.conf != local_slurm.conf and s.cluster != local_slurm.cluster
        out = _ok(s.run(["srun", "-n", "2", "--kill-on-bad-exit=1", PYTHON, "-c", HELLO],
                         cwd=tmp_path, timeout=30))
        assert sorted(out.split("\n")[:-1]) == ["0 2", "1 2"]      # MpiDefault=pmi2
        pids = s.pids
        assert sorted(pids) == ["munged", "slurmctld", "slurmd"]
        client = subprocess.Popen(["srun", "-n", "1", "sleep", "300"], env=s.env, cwd=tmp_path,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            # beside the daemons: slurmctld's slurmscriptd, the step's slurmstepd and its task
            def step_and_task():
                found = leftover_pids(s.root, s.cluster)
                lines = [_cmdline(pid) for pid in found]
                return found if (any(line.startswith("slurmstepd") for line in lines)
                                 and any(line.endswith("sleep 300") for line in lines)) else None
            tracked = _until(step_and_task, what="the job's slurmstepd and task")
        finally:
            s.stop()
        assert client.wait(timeout=20) != 0
    for pid in {*pids.values(), *tracked}:
        assert not _alive(pid), f"pid {pid} is still alive after stop()"
    assert not s.root.exists()
    # the session's instance is untouched
    assert all(_alive(pid) for pid in local_slurm.pids.values())
