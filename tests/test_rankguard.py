"""The rank guard when its own parent (hydra's proxy, slurmstepd) dies, without MPI: a small
parent process starts the guard, the test kills that parent."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from workbench.runtime.launch.mpiexec import GUARD

#: a parent that starts the guard (argv[1:]) and waits for it, as hydra's proxy does
PARENT = "import subprocess, sys; subprocess.Popen(sys.argv[1:]).wait()"


def _until(condition, what: str, step: float = 0.05) -> None:
    """Poll ``condition()`` until it is true, failing with ``what`` after 30 s."""
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(step)


def _guarded_sleep(status_dir: Path) -> tuple[subprocess.Popen, dict]:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, sys.executable, "-I", str(GUARD), str(status_dir),
                               "sleep", "120"], env={**os.environ, "PMI_RANK": "0"})
    start = status_dir / "rank0.start"
    _until(lambda: start.exists() or parent.poll() is not None, "the guard did not start")
    assert parent.poll() is None, "the guard did not start"
    time.sleep(0.3)  # past the guard's set-up (its handler for the parent's death)
    return parent, json.loads(start.read_text())


def _end_record(status_dir: Path) -> dict:
    path = status_dir / "rank0.status"
    _until(path.exists, "the guard recorded no end")
    return json.loads(path.read_text())


def _ended(process: psutil.Process) -> bool:
    """``process`` is gone or a zombie."""
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_for_state(pid: int, state: str) -> None:
    _until(lambda: psutil.Process(pid).status() == state, f"process {pid} is not {state}", step=0.01)


def test_a_guard_whose_parent_dies_ends_its_rank_and_says_why(tmp_path):
    parent, start = _guarded_sleep(tmp_path)
    parent.kill()
    parent.wait()
    end = _end_record(tmp_path)
    assert end["launcher_died"] == parent.pid and end["signal"] == signal.SIGTERM, end
    assert json.loads((tmp_path / "rank0.orphaned").read_text())["launcher_died"] == parent.pid


def test_a_rank_that_ended_before_its_launcher_is_not_blamed_on_it(tmp_path):
    """The rank is killed, then its launcher dies before the guard has seen the rank end (a guard
    starved of CPU while hydra ends the job): how the rank ended is its own, not the launcher's."""
    parent, start = _guarded_sleep(tmp_path)
    os.kill(start["guard_pid"], signal.SIGSTOP)
    try:
        _wait_for_state(start["guard_pid"], psutil.STATUS_STOPPED)
        os.kill(start["pid"], signal.SIGKILL)
        _wait_for_state(start["pid"], psutil.STATUS_ZOMBIE)  # ended, not yet reaped by its stopped guard
        parent.kill()
        parent.wait()
    finally:
        os.kill(start["guard_pid"], signal.SIGCONT)
    end = _end_record(tmp_path)
    assert end["signal"] == signal.SIGKILL and "launcher_died" not in end, end
    assert not (tmp_path / "rank0.orphaned").exists()


def test_the_guard_runs_above_its_rank_where_it_may(tmp_path):
    """The guard must record its rank's end before an MPI_Abort elsewhere makes hydra SIGKILL it, so
    it runs at a higher priority (root only: elsewhere it cannot raise one, and nothing changes); the
    rank keeps its launcher's."""
    from workbench.runtime.launch.rankguard import GUARD_PRIORITY
    parent, start = _guarded_sleep(tmp_path)
    try:
        guard, rank = psutil.Process(start["guard_pid"]), psutil.Process(start["pid"])
        assert rank.nice() == psutil.Process(parent.pid).nice()
        if os.geteuid() == 0:
            assert guard.nice() == max(rank.nice() - GUARD_PRIORITY, -20)
        else:
            assert guard.nice() == rank.nice()
    finally:
        parent.kill()
        parent.wait()
        _end_record(tmp_path)   # the guard ended its rank (its launcher died)


def test_a_guard_that_vanished_after_noting_its_launchers_death_is_a_killed_node():
    """A node's processes killed together: one guard may outlive its proxy long enough to note the
    launcher's death (``.orphaned``) but not to record its rank's end; blame names the vanished ranks,
    not a launcher that died under live guards."""
    from workbench.runtime.launch.blame import MPIResult, failure
    starts = {r: {"rank": r, "pid": 100 + r, "host": "vc-3"} for r in (6, 7)}
    ends = [{"rank": 7, "pid": 107, "host": "vc-3", "launcher_died": 90, "time": 5.0}]   # a note, no end
    error = failure(8, MPIResult(255, "", {}), starts, ends, vanished={6: 5.1, 7: 5.2})
    assert str(error).startswith("rank 6 on node vc-3") and "vanished with its guard" in str(error), str(error)
    # a guard that lived to record its rank's end after its launcher died is the launcher's case
    ended = [{**ends[0], "signal": 15}]
    assert "the launcher's process on node vc-3" in str(failure(8, MPIResult(255, "", {}), starts, ended,
                                                                  vanished={6: 5.1}))



def test_a_rank_killed_by_a_signal_is_named_before_one_that_aborted_and_exited_first():
    """Each guard records when it saw its rank end: a killed rank's guard can see it after another rank,
    whose MPI saw the broken link, aborted and exited. The killed rank is the cause; a rank its guard
    killed as the launcher ended the job is not."""
    from workbench.runtime.launch.blame import MPIResult, failure
    abort = "Abort(143) on node 0 (rank 0 in comm 0): Fatal error in internal_Allreduce_c: Other MPI error"
    result = MPIResult(143, abort, {0: abort})
    starts = {r: {"rank": r, "pid": 100 + r, "host": "vm"} for r in (0, 1)}
    aborted = {"rank": 0, "pid": 100, "host": "vm", "exit_code": 143, "time": 5.0}
    killed = {"rank": 1, "pid": 101, "host": "vm", "signal": 9, "time": 5.2}
    error = failure(2, result, starts, [aborted, killed])
    assert str(error).startswith("rank 1 on node vm (pid 101) was killed by signal 9 (SIGKILL)"), str(error)
    assert error.failed_ranks == [1]
    crashed = {**killed, "signal": 11, "rank": 0, "pid": 100, "time": 5.0}  # a crash in its own MPI_Abort
    error = failure(2, result, starts, [crashed, killed])
    assert str(error).startswith("rank 1 on node vm (pid 101) was killed by signal 9 (SIGKILL)"), str(error)
    stopped = {**killed, "launcher_stopped": 90}
    for ends in ([aborted, stopped], [crashed, stopped]):  # the rank that aborted is named with its abort
        error = failure(2, result, starts, ends)
        assert str(error).startswith("rank 0 on node vm (pid 100) raised an exception and called MPI_Abort with "
                                     "code 143"), str(error)
    assert str(failure(2, result, starts, [stopped])).startswith("rank 0 on node vm (pid 100) raised an exception "
                                                                 "and called MPI_Abort with code 143")


def test_the_first_cause_is_a_killed_rank_unless_the_launcher_kills_every_task_on_an_abort():
    """The choice both the CLI's errors and a notebook's dead engines take: a consequence (a rank its
    guard ended) is never the cause; a signal before an earlier exit, except under srun."""
    from workbench.runtime.launch.blame import first_cause
    exited = {"rank": 0, "exit_code": 143, "time": 1.0}
    killed = {"rank": 1, "signal": 9, "time": 2.0}
    stopped = {"rank": 2, "signal": 9, "launcher_stopped": 7, "time": 0.5}
    orphaned = {"rank": 3, "signal": 15, "launcher_died": 7, "time": 0.4}
    assert first_cause([orphaned, stopped, exited, killed]) is killed
    assert first_cause([orphaned, stopped, exited, killed], abort_kills_all=True) is exited
    assert first_cause([orphaned, stopped, exited]) is exited
    crashed = {"rank": 5, "signal": 11, "time": 1.5}  # it called MPI_Abort, then crashed
    assert first_cause([crashed, killed], aborted={5}) is killed and first_cause([crashed, killed]) is crashed
    assert first_cause([orphaned, stopped, {"rank": 4, "exit_code": 0, "time": 0.1}]) is None

def test_each_librarys_launcher_kills_are_consequences_and_its_abort_line_names_the_rank():
    """Open MPI's prterun SIGTERMs every other rank itself (not through the guards) and prints the abort in
    its own output; srun SIGKILLs every task, the one that raised too, in an order that says nothing."""
    from workbench.mpilib import OpenMPI
    from workbench.runtime.launch.blame import MPIResult, failure, first_cause
    starts = {r: {"rank": r, "pid": 100 + r, "host": "vm"} for r in range(4)}
    said = ("MPI_ABORT was invoked on rank 2 in communicator MPI_COMM_WORLD\n  Proc: [[1,1],2]\n  Errorcode: 1\n")
    traceback = "Traceback (most recent call last):\nRuntimeError: injected failure on rank 2"
    result = MPIResult(1, said, {2: traceback})
    ends = [{"rank": 2, "pid": 102, "host": "vm", "exit_code": 1, "time": 1.0},
            {"rank": 3, "pid": 103, "host": "vm", "signal": 15, "time": 1.01},
            {"rank": 1, "pid": 101, "host": "vm", "signal": 15, "time": 1.02}]
    error = failure(4, result, starts, ends, flavour=OpenMPI())
    assert str(error).startswith("rank 2 on node vm (pid 102) raised an exception and called MPI_Abort with code 1")
    assert first_cause(ends) is ends[1]  # without the library's ways, prterun's SIGTERM looked like the cause
    killed = {"rank": 1, "pid": 101, "host": "vm", "signal": 9, "time": 1.0}  # a kill from outside, then prterun's
    assert first_cause([killed, *ends[1:2]], launcher_signals=OpenMPI.stop_signals) is killed
    # srun: every task SIGKILLed, rank 0's recorded first; rank 2 raised (its traceback): rank 2
    srun = MPIResult(1, "srun: error: vm: tasks 0-3: Killed", {2: traceback})
    sigkills = [{"rank": r, "pid": 100 + r, "host": "vm", "signal": 9, "time": 1.0 + r / 100} for r in (0, 2, 3)]
    error = failure(4, srun, starts, sigkills, abort_kills_all=True, flavour=OpenMPI())
    assert str(error).startswith("rank 2 on node vm (pid 102) raised an exception (srun then killed every task)")
    error = failure(4, MPIResult(1, "", {}), starts, sigkills, abort_kills_all=True)  # nothing raised: the first
    assert str(error).startswith("rank 0 on node vm (pid 100) was killed by signal 9 (SIGKILL)")


#: rank 0 calls MPI_Abort once the file ``go`` exists; rank 1 sleeps (both say they are ready)
ABORT_ON_GO = """
import os, sys, time
from mpi4py import MPI
folder, rank = sys.argv[1], MPI.COMM_WORLD.Get_rank()
open(os.path.join(folder, f"ready{rank}"), "w").close()
while rank == 0 and not os.path.exists(os.path.join(folder, "go")):
    time.sleep(0.02)
if rank == 0:
    MPI.COMM_WORLD.Abort(3)
time.sleep(600)
"""


@pytest.mark.mpi
def test_a_killed_rank_is_named_when_another_aborts_before_its_guard_sees_it(tmp_path):
    """The race a clean-clone make test lost: a rank is killed, another rank's MPI sees the broken
    link at once and calls MPI_Abort, and hydra kills its children's process groups before the killed
    rank's guard has recorded the signal. Made certain here: rank 1's guard is stopped, rank 1 killed,
    rank 0 aborts, and the guard goes on only once rank 0 has ended. The guard outlives hydra's kill
    (its own session) and records the signal; blame names the killed rank, not the one that aborted."""
    from workbench.runtime.launch.blame import MPILaunchError
    from workbench.runtime.launch.launcher import run_mpi
    program = tmp_path / "abort_on_go.py"
    program.write_text(ABORT_ON_GO)
    outcome = {}

    def launch():
        try:
            run_mpi(2, [str(program), str(tmp_path)], timeout=120, job_dir=tmp_path / "job")
        except MPILaunchError as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=launch)
    thread.start()
    try:
        _until(lambda: (tmp_path / "ready0").exists() and (tmp_path / "ready1").exists(), "the ranks did not start")
        starts = {r: json.loads(next((tmp_path / "job").glob(f"*/ranks/rank{r}.start")).read_text()) for r in (0, 1)}
        guard, victim, other = (psutil.Process(starts[1]["guard_pid"]), psutil.Process(starts[1]["pid"]),
                                psutil.Process(starts[0]["pid"]))
        guard.suspend()
        try:
            _wait_for_state(guard.pid, psutil.STATUS_STOPPED)
            victim.kill()
            (tmp_path / "go").touch()
            _until(lambda: _ended(other), "rank 0 did not abort")
            time.sleep(0.5)  # hydra kills what it started
        finally:
            guard.resume()
    finally:
        thread.join(150)
    message = str(outcome.get("error"))
    assert message.startswith(f"rank 1 on node {socket.gethostname()} (pid {victim.pid}) was killed by signal 9 "
                              "(SIGKILL)"), message
