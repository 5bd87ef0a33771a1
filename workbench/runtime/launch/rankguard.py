"""The parent of every rank: ``python rankguard.py STATUS_DIR [--output DIR] PROGRAM ARGS...`` (run by path).

``mpiexec`` starts this guard in place of each rank. It runs the rank's program in a child and
waits for it, so that it knows exactly how the rank ended, which neither the MPI
launcher (its text names a PID, often not the first process that died) nor the client (not the
rank's parent) can tell. It writes ``STATUS_DIR/rank<R>.start`` (rank, pid, host) when the rank
starts and ``STATUS_DIR/rank<R>.status`` (the same, plus ``exit_code`` or ``signal`` and the
time it ended) when it ends, then ends the same way (same exit code, or killed by the same
signal), so ``mpiexec`` sees what it would have seen without the guard. With ``--output DIR`` the
rank's stdout and stderr go straight to ``DIR/rank<R>.out`` and ``.err``.

With ``WORKBENCH_HEARTBEAT=ADDR:PORT:TOKEN`` in its environment the guard also sends a UDP
heartbeat there every second while the rank runs (:mod:`.heartbeat`: how the launcher tells a
node that stopped answering from one that is busy).

The guard runs in two processes. The launcher's child, the *front*, does nothing but pass on the
signals it gets and end as the guard ends; the guard proper, its child, runs in its own session.
On an ``MPI_Abort`` hydra kills the process groups it started and exits: the front dies, the guard
lives on to record how its rank ended. That matters when a rank is killed and another rank's MPI
sees the broken link (a peer's memory gone, a connection reset) and aborts at once: the killed
rank's guard may see its rank's end only after hydra's kill, and its record is the only evidence of
which rank died first (a clean-clone make test named the aborting rank when the guard was hydra's
child). The launcher waits for the guards' records after mpiexec ends
(:meth:`~workbench.runtime.launch.job.Job.settle`). In a Slurm job step the guard stays in the
front's process group (Slurm may track a step's processes by it, and ends them all together anyway).

Signals the front receives (``mpiexec`` forwarding one, the launcher cleaning up) are passed to
the guard and by it to the rank; if the guard itself is killed, the rank is killed too
(``PR_SET_PDEATHSIG``, Linux). A front killed without a word (hydra ending the job) has its
guard SIGKILL the rank at once, as hydra meant, and record ``launcher_stopped`` (not a cause). If the
launcher itself dies while the rank runs (hydra's proxy, or slurmstepd: the process that forwards the
rank's signals and tells ``mpiexec`` it ended), the front tells the guard (:data:`LAUNCHER_SIGNAL`)
and ends; the guard writes ``STATUS_DIR/rank<R>.orphaned`` at once, ends the rank (SIGTERM, then
SIGKILL after :data:`ORPHAN_GRACE` s) and records ``launcher_died`` (the launcher's pid) with how it
ended: the ranks hold the proxy's connections, so without this ``mpiexec`` could wait on them until a
deadline. Where it may (root), the guard runs at a higher priority than its rank, so that the time
it records is close to when its rank ended (:func:`_first_to_know`).
Standard library only (and :mod:`workbench.files`, loaded by path), run by path, so it starts in a few
milliseconds.
"""
import json
import os
import signal
import socket
import sys
import threading
import time

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
ORPHAN_GRACE = 5.0  #: seconds between the SIGTERM and the SIGKILL for a rank whose launcher died
#: what the kernel sends the guard when its parent, the front, dies (``PR_SET_PDEATHSIG``): a real-time
#: signal, which no launcher forwards
ORPHAN_SIGNAL = signal.SIGRTMIN + 3 if hasattr(signal, "SIGRTMIN") else None
#: what the kernel sends the front when the launcher dies, and the front then the guard, before the
#: front ends: lower than :data:`ORPHAN_SIGNAL`, so a guard that gets both answers this one first
LAUNCHER_SIGNAL = signal.SIGRTMIN + 2 if hasattr(signal, "SIGRTMIN") else None
#: nice steps the guard runs above its rank (where allowed: root): see :func:`_first_to_know`
GUARD_PRIORITY = 10


def _rank() -> str:
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if os.environ.get(name, "").isdigit():
            return os.environ[name]
    return f"pid{os.getpid()}"


def _atomic_write():
    """:func:`workbench.files.atomic_write`, loaded by path (``workbench/files.py``, which imports
    only ``os``): the guard imports no package, so that it starts in milliseconds."""
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "files.py")
    spec = importlib.util.spec_from_file_location("_workbench_files", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.atomic_write


atomic_write = _atomic_write()


def _write(path: str, record: dict) -> None:
    try:
        atomic_write(path, json.dumps(record))
    except OSError:  # the launcher's folder is gone (it was interrupted): nothing to tell
        pass


def _die_with_parent(parent: int) -> None:
    if _pdeathsig(signal.SIGKILL) and os.getppid() != parent:  # the guard died before prctl: do not run unguarded
        os._exit(1)


def _pass_signals_to(pid: int):
    """Pass the :data:`FORWARDED` signals this process gets on to ``pid``; the handler."""
    def forward(signum, frame):
        try:
            os.kill(pid, signum)
        except OSError:  # it has just ended
            pass

    for sig in FORWARDED:
        signal.signal(sig, forward)
    return forward


def _first_to_know() -> None:
    """Run this guard :data:`GUARD_PRIORITY` nice steps above its rank (root only; elsewhere nothing
    changes), so that it wakes when its rank ends, not behind busy-polling ranks on shared cores: blame
    orders the ranks' ends by the times the guards record. The guard sleeps until its rank ends, so
    the priority costs nothing else."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, os.getpriority(os.PRIO_PROCESS, 0) - GUARD_PRIORITY)
    except (OSError, AttributeError):  # not root, or not POSIX
        pass


def _heartbeats(spec: str, rank: str, host: str, pid: int, stop: threading.Event) -> None:
    """Send ``TOKEN RANK HOST PID`` to ``spec`` (``ADDR:PORT:TOKEN``) every second until ``stop``;
    a send that fails (no route while a link is down) is not an error."""
    try:
        address, port, token = spec.rsplit(":", 2)
        target = (address, int(port))
    except ValueError:
        return
    message = f"{token} {rank} {host} {pid}".encode()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        while not stop.is_set():
            try:
                sock.sendto(message, target)
            except OSError:
                pass
            stop.wait(1.0)


def _end_rank(pid: int, stop: threading.Event) -> None:
    """SIGTERM the rank ``pid``, then SIGKILL :data:`ORPHAN_GRACE` s later unless ``stop`` (it ended) is set."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except OSError:  # it has just ended
            return
        if stop.wait(ORPHAN_GRACE):
            return


def _pdeathsig(signum: int) -> bool:
    """Have the kernel send ``signum`` to this process when its parent dies (Linux); False elsewhere."""
    try:
        import ctypes
        return ctypes.CDLL(None, use_errno=True).prctl(1, signum) == 0  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return False


def _running(pid: int) -> bool:
    """``pid`` is a live process (not gone, not a zombie waiting for its parent)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def _being_killed(pid: int) -> bool:
    """``pid`` is being killed already: SIGKILL is pending, or its main thread has exited while others
    are still ending (a zombie that ``waitid`` does not report yet). Linux (``/proc``); else False."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        pending = int(fields["SigPnd"], 16) | int(fields["ShdPnd"], 16)
        return fields["State"].split()[0] in ("Z", "X") or bool(pending & (1 << (signal.SIGKILL - 1)))
    except (OSError, KeyError, ValueError, IndexError):
        return False


def _on_front_death(front: int, launcher: int, pid: int, path: str, base: dict, stop: threading.Event,
                    orphaned: dict) -> None:
    """Answer the end of this guard's parent, the ``front``, while the rank ``pid`` still runs (not
    reaped here: the main thread's ``waitpid`` does). The front tells the guard first
    (:data:`LAUNCHER_SIGNAL`) when it ends because the ``launcher`` died: note ``launcher_died`` in
    ``orphaned`` and in a record at ``path`` at once (what is left of the job may be killed moments
    later), then end the rank: SIGTERM, SIGKILL :data:`ORPHAN_GRACE` s later. A front that ends
    without telling (:data:`ORPHAN_SIGNAL` alone) was killed by the launcher ending the job (hydra
    kills its children's process groups): the rank is SIGKILLed at once, as the launcher meant, and its
    record says ``launcher_stopped``. Linux only."""
    if ORPHAN_SIGNAL is None:
        return

    def running() -> bool:  # the rank ended before (killed, then the launcher ended the job): not why it ended
        try:
            return not orphaned and os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
        except ChildProcessError:
            return False

    def launcher_died(signum=None, frame=None):
        if running():
            orphaned["launcher_died"] = launcher
            _write(path, {**base, **orphaned, "time": time.time()})
            threading.Thread(target=_end_rank, args=(pid, stop), daemon=True).start()

    def front_ended(signum=None, frame=None):
        if os.getppid() == front or not running() or _being_killed(pid):  # a thread of the front ended, not the
            return                                                         # front; or the rank ends by itself
        if signum is None and not _running(launcher):  # both gone before prctl: which went first is not known
            launcher_died()
            return
        orphaned["launcher_stopped"] = launcher
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:  # it has just ended
            pass

    signal.signal(LAUNCHER_SIGNAL, launcher_died)
    signal.signal(ORPHAN_SIGNAL, front_ended)
    if _pdeathsig(ORPHAN_SIGNAL):
        front_ended()  # the front died before prctl


def _output_to_files(output_dir: str, rank: str) -> None:
    """The rank's stdout and stderr straight into ``output_dir/rank<R>.out`` and ``.err``: each byte
    the rank writes is in the file when its write returns. (Hydra's ``-outfile-pattern`` writes what
    its proxy forwarded: a rank that calls MPI_Abort has the proxy kill the job, and its last words,
    MPICH's abort message or the traceback, could still be in the pipe, unread, and were lost.)"""
    for fd, suffix in ((1, "out"), (2, "err")):
        try:
            target = os.open(os.path.join(output_dir, f"rank{rank}.{suffix}"),
                             os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as exc:  # the output stays on the launcher's pipes
            print(f"rank {rank}: cannot write its output to {output_dir}: {exc}", file=sys.stderr, flush=True)
            continue
        os.dup2(target, fd)
        os.close(target)


def main(argv: list[str]) -> None:
    status_dir, program, output_dir = argv[0], argv[1:], None
    if program[:1] == ["--output"]:
        output_dir, program = program[1], program[2:]
    launcher, front = os.getppid(), os.getpid()
    guard = os.fork()
    if guard == 0:
        if not os.environ.get("SLURM_STEP_ID"):  # (Slurm may track a step's processes by process group)
            os.setsid()  # out of the process group the launcher signals and kills: the front's alone
        _guard(status_dir, program, output_dir, front, launcher)
    _front(guard, launcher)


def _front(guard: int, launcher: int) -> None:
    """The launcher's child: passes the signals it gets to the guard and ends as the guard ends; when
    the launcher dies (``PR_SET_PDEATHSIG``) it tells the guard (:data:`LAUNCHER_SIGNAL`) and ends.
    Killed (hydra answering an ``MPI_Abort`` elsewhere kills its children's process groups), it leaves
    the guard, in its own session, alive to record its rank's end."""
    forward = _pass_signals_to(guard)

    def launcher_died(signum=None, frame=None):
        if os.getppid() == launcher:  # a thread of the launcher ended (slurmstepd), not the launcher
            return
        forward(LAUNCHER_SIGNAL, None)
        os.kill(os.getpid(), signal.SIGKILL)

    if LAUNCHER_SIGNAL is not None:
        signal.signal(LAUNCHER_SIGNAL, launcher_died)
        if _pdeathsig(LAUNCHER_SIGNAL):
            launcher_died()  # it died before prctl
    _end_as(_wait(guard), None, None, os.getpid())


def _wait(pid: int) -> int:
    """``waitpid`` status of the child ``pid`` (0 if it was reaped elsewhere)."""
    try:
        return os.waitpid(pid, 0)[1]
    except ChildProcessError:
        return 0


def _name_of(pid: int) -> str:
    """The process name of ``pid`` (the node's launcher: ``hydra_pmi_proxy``, ``prted``, ``slurmstepd``)."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _guard(status_dir: str, program: list[str], output_dir: str | None, front: int, launcher: int) -> None:
    """The rank's parent, in its own session: start the rank, record its start and how it ended, and
    end the same way (never returns)."""
    rank, host, guard = _rank(), socket.gethostname(), os.getpid()
    pid = os.fork()
    if pid == 0:
        _die_with_parent(guard)
        if output_dir is not None:
            _output_to_files(output_dir, rank)
        try:
            os.execvp(program[0], program)
        except OSError as exc:
            print(f"rank {rank}: cannot run {program[0]}: {exc}", file=sys.stderr, flush=True)
            os._exit(127)
    _first_to_know()   # after the fork: the rank keeps the launcher's priority
    _pass_signals_to(pid)
    base = {"rank": int(rank) if rank.isdigit() else rank, "pid": pid, "guard_pid": guard, "front_pid": front,
            "host": host, "launcher": _name_of(launcher)}
    if os.environ.get("SLURM_STEP_ID"):  # a task of srun: its job step, which the launcher can cancel
        base["slurm_step"] = f"{os.environ.get('SLURM_JOB_ID')}.{os.environ['SLURM_STEP_ID']}"
    _write(os.path.join(status_dir, f"rank{rank}.start"), base)
    stop = threading.Event()
    if os.environ.get("WORKBENCH_HEARTBEAT"):
        threading.Thread(target=_heartbeats, args=(os.environ["WORKBENCH_HEARTBEAT"], rank, host, pid, stop),
                         daemon=True).start()
    orphaned: dict = {}
    _on_front_death(front, launcher, pid, os.path.join(status_dir, f"rank{rank}.orphaned"), base, stop, orphaned)
    status = _wait(pid)
    stop.set()
    _end_as(status, {**base, **orphaned}, os.path.join(status_dir, f"rank{rank}.status"), guard)


def _end_as(status: int, record: dict | None, path: str | None, guard: int) -> None:
    """Record at ``path`` how the rank ended (``status`` from ``waitpid``; no record without ``path``),
    then end this process (``guard``) the same way: killed by the same signal, or exiting with the same code."""
    ended = time.time()
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if path is not None:
            _write(path, {**record, "signal": sig, "time": ended})
        for s in FORWARDED:
            signal.signal(s, signal.SIG_DFL)
        try:
            import resource
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the rank dumped core, if anything
        except (ImportError, ValueError, OSError):
            pass
        try:
            sys.stdout.flush()
        except OSError:  # a pipe to a launcher that died
            pass
        os.kill(guard, sig)
        time.sleep(1)  # a signal whose default action is not to terminate
        os._exit(128 + sig)
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1
    if path is not None:
        _write(path, {**record, "exit_code": code, "time": ended})
    os._exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
