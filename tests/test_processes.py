"""workbench.runtime.processes: the one TERM-wait-KILL helper, on real processes."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from workbench.runtime.processes import alive, stop_processes

#: a process that says it is ready, then sleeps (``ignore``: with SIGTERM ignored)
SLEEPER = ("import signal, sys, time\n"
           "if {ignore}: signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
           "print('ready', flush=True)\ntime.sleep(60)\n")


def _sleeper(ignore_term: bool = False) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", SLEEPER.format(ignore=ignore_term)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"   # its handler is in place
    return proc


def _ended():
    codes = {}
    return codes, lambda p: codes.setdefault(p.pid, p.returncode)


def test_sigterm_ends_a_polite_process_at_once_and_its_exit_status_is_reported():
    proc = _sleeper()
    codes, callback = _ended()
    start = time.monotonic()
    assert stop_processes([proc.pid], grace=5.0, callback=callback) == []
    assert time.monotonic() - start < 3.0
    assert codes == {proc.pid: -signal.SIGTERM}   # reaped by psutil: our child
    assert not alive(proc.pid)


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace():
    proc = _sleeper(ignore_term=True)
    codes, callback = _ended()
    start = time.monotonic()
    assert stop_processes([psutil.Process(proc.pid)], grace=0.5, callback=callback) == []
    assert 0.5 <= time.monotonic() - start < 4.0
    assert codes == {proc.pid: -signal.SIGKILL}


def test_grace_zero_kills_at_once_and_hurry_cuts_the_grace_short():
    now = _sleeper()
    codes, callback = _ended()
    stop_processes([now.pid], grace=0, callback=callback)
    assert codes == {now.pid: -signal.SIGKILL}   # no SIGTERM first
    stubborn = _sleeper(ignore_term=True)
    start = time.monotonic()
    stop_processes([stubborn.pid], grace=30.0, hurry=lambda: time.monotonic() - start > 0.3)
    assert 0.3 <= time.monotonic() - start < 5.0 and not alive(stubborn.pid)


def test_first_none_sends_nothing_during_the_grace():
    proc = _sleeper()   # would end at SIGTERM
    codes, callback = _ended()
    start = time.monotonic()
    stop_processes([proc.pid], grace=0.4, first=None, callback=callback)
    assert time.monotonic() - start >= 0.4
    assert codes == {proc.pid: -signal.SIGKILL}


def test_gone_processes_and_zombies_of_others_count_as_ended():
    # a child that exits under a parent that never reaps it: a zombie, not ours to reap
    parent = subprocess.Popen([sys.executable, "-c",
                               "import subprocess, sys, time\n"
                               "child = subprocess.Popen([sys.executable, '-c', 'pass'])\n"
                               "print(child.pid, flush=True)\ntime.sleep(60)\n"], stdout=subprocess.PIPE, text=True)
    try:
        zombie = int(parent.stdout.readline())
        deadline = time.monotonic() + 20
        while psutil.Process(zombie).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the child never exited"
            time.sleep(0.01)
        assert not alive(zombie) and not alive(None)   # None is no pid (psutil.Process(None) is this process)
        with pytest.raises(TypeError):
            stop_processes([None])
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()
        start = time.monotonic()
        assert stop_processes([zombie, gone.pid], grace=10.0) == []
        assert time.monotonic() - start < 1.0
    finally:
        parent.kill()
        parent.wait()


def test_a_process_this_user_may_not_signal_is_returned_not_waited_for():
    """As a user who may not signal init: root's test drops to nobody in a forked child (no exec, so
    no interpreter path to reach)."""
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        code = 1
        try:
            if os.geteuid() == 0:
                os.setgid(65534)
                os.setuid(65534)
            start = time.monotonic()
            left = [p.pid for p in stop_processes([1], grace=10.0)]
            os.write(write, f"{left} {time.monotonic() - start:.3f}".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as pipe:
        said = pipe.read()
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0, said
    left, seconds = said.rsplit(" ", 1)
    assert left == "[1]" and float(seconds) < 1.0  # init: returned at once, not waited for
