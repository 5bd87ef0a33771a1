"""A private Slurm: its own munged, slurmctld and slurmd, for tests and developers.

One node by default (this host); a virtual cluster (:mod:`workbench.vcluster.slurm`) gives it its
nodes (:class:`SlurmNode`: a name, an address, and the argv prefix that runs a command there) and
the controller's, and each slurmd then runs on its own node.

``LocalSlurm().start()`` writes a ``slurm.conf`` and a munge key under a temporary root, starts
munged, slurmctld and slurmd (ports on 127.0.0.1; one node, this host; one partition ``debug``)
and waits until the node is idle; clients use :attr:`LocalSlurm.env` (``SLURM_CONF``) or
:meth:`LocalSlurm.run`. Instances may run side by side (own ports, paths, ``ClusterName``); the
system's ``/etc/slurm``, ``/run/munge`` and munged are never used. ``stop()`` cancels the jobs
left and kills what this instance started, and only that. The daemons run as root (slurmd
starts job steps as their users), otherwise through this module's ``up`` under ``sudo -n``;
what prevents this raises :class:`SlurmUnavailable` with a one-line reason.

    python -m workbench.runtime.launch.slurm_cli up [--root DIR] [--mpi-default none|pmi2]
    python -m workbench.runtime.launch.slurm_cli down [--root DIR]
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from workbench.ports import free_port
from workbench.runtime.processes import stop_processes
from workbench.syspkgs import advice

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("srun", "sbatch", "squeue", "scancel", "sinfo")
MARK = "WORKBENCH_LOCAL_SLURM"  # in the daemons' (and so slurmstepd's) environment: the root
DEFAULT_ROOT = Path(tempfile.gettempdir()) / "workbench-slurm"
_SEARCH = ("/usr/sbin", "/usr/bin", "/sbin", "/bin", "/usr/local/sbin", "/usr/local/bin")


class SlurmUnavailable(RuntimeError):
    """Slurm could not be started here; the message says why, on one line."""


def _tail(path: Path, lines: int = 3) -> str:
    """The last ``lines`` non-empty lines of a log, on one line."""
    try:
        text = [line.strip() for line in path.read_text(errors="replace").splitlines()]
    except OSError:
        return ""
    return " | ".join([line for line in text if line][-lines:])[-800:]


def leftover_pids(root: Path, cluster: str | None = None) -> list[int]:
    """Processes of the instance under ``root``: its daemons and slurmstepds (they carry
    ``MARK=root``) and its jobs' tasks (``SLURM_CLUSTER_NAME=cluster``); never this process or
    its ancestors."""
    marks = {f"{MARK}={root}".encode(), f"SLURM_CLUSTER_NAME={cluster}".encode() if cluster else b"-"}
    me = psutil.Process()
    mine = {me.pid} | {p.pid for p in me.parents()}
    found = []   # the raw environ: slurmstepd rewrites its own (psutil's parser stops at the first gap)
    for pid in (int(e) for e in os.listdir("/proc") if e.isdigit() and int(e) not in mine):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/environ", "rb") as f:
            found += [pid] if marks & set(f.read().split(b"\0")) else []
    return found


def _die_with_parent() -> None:
    """In a daemon before exec: SIGTERM when the process that started it dies (a test run killed
    with SIGKILL leaves no daemons behind)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)    # PR_SET_PDEATHSIG


def _as_root_cli(sudo: str) -> list[str]:
    """This module's CLI under ``sudo -n``, which resets the environment (so the package is
    found by its path, not by PYTHONPATH)."""
    top = str(Path(__file__).resolve().parents[3])
    return [sudo, "-n", sys.executable, "-c", f"import sys; sys.path.insert(0, {top!r}); "
            "from workbench.runtime.launch.slurm_cli import main; sys.exit(main())"]


@dataclass
class SlurmNode:
    """A machine of a private Slurm: its ``name`` (NodeName, and the name it calls itself),
    ``address`` (NodeAddr) and ``enter``, the argv prefix that runs a command on it (nothing: here)."""

    name: str
    address: str = "127.0.0.1"
    enter: tuple[str, ...] = ()


class LocalSlurm:
    """One private Slurm. ``root``: where its files go (when None, a new directory under the
    temporary directory, removed by ``stop()``); ``cpus``: each node's CPUs (``os.cpu_count()``);
    ``mpi_default``: ``MpiDefault`` (``none``: srun needs ``--mpi=pmi2`` for one MPI job);
    ``binaries``: paths for any of munged, slurmctld, slurmd, srun, sbatch, squeue, scancel, sinfo
    (otherwise found on PATH or in /usr/sbin). ``nodes`` and ``controller``: where slurmd and
    slurmctld run (default: this host, on 127.0.0.1); ``detached``: the daemons outlive the process
    that started them (a virtual cluster's, stopped by its ``down``); ``slurmd_timeout``: seconds
    after which a silent slurmd's node is DOWN and its jobs fail; ``task_env``: environment every
    task gets (a ``TaskProlog``); ``kill_wait``: seconds from SIGTERM to SIGKILL when a job ends early."""

    def __init__(self, root: Path | str | None = None, cpus: int | None = None,
                 mpi_default: str = "none", binaries: dict[str, str] | None = None,
                 debug: str = "info", *, nodes: list[SlurmNode] | None = None,
                 controller: SlurmNode | None = None, detached: bool = False,
                 slurmd_timeout: int | None = None, task_env: dict[str, str] | None = None,
                 kill_wait: int = 2):
        self.cluster = f"wb{os.getpid() % 100000}x{secrets.token_hex(3)}"
        self._tmp = root is None
        self.root = Path(root or Path(tempfile.gettempdir()) / f"wb-slurm-{self.cluster}").absolute()
        self.cpus = cpus or os.cpu_count() or 1
        self.mpi_default, self.debug = mpi_default, debug
        self.binaries, self.node = dict(binaries or {}), socket.gethostname().split(".")[0]
        self.nodes = list(nodes or [SlurmNode(self.node)])
        self.controller = controller or SlurmNode(self.node)
        self.detached, self.slurmd_timeout, self.task_env = detached, slurmd_timeout, dict(task_env or {})
        self.kill_wait = kill_wait
        self.conf, self.socket = self.root / "slurm.conf", self.root / "munge" / "munge.socket.2"
        self.start_seconds: float | None = None
        self._procs: dict[str, subprocess.Popen] = {}   # as root: the daemons
        self._helper: subprocess.Popen | None = None    # not root: `sudo -n ... up`

    @property
    def env(self) -> dict[str, str]:
        """The environment a client needs: this one with ``SLURM_CONF`` set (and the SLURM_*
        variables of any job this process runs in removed); PATH untouched."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k != MARK}
        env["SLURM_CONF"] = str(self.conf)
        return env

    def run(self, args, *, timeout: float = 60, check: bool = False, **kwargs):
        """``subprocess.run(args)`` against this Slurm, output captured as text."""
        return subprocess.run([str(a) for a in args], env=self.env, capture_output=True,
                              text=True, timeout=timeout, check=check, **kwargs)

    @property
    def pids(self) -> dict[str, int]:
        """The daemons' pids, from their pid files (``slurmd@NODE`` on several nodes)."""
        files = {"munged": self.root / "munged.pid", "slurmctld": self.root / "slurmctld.pid"}
        for node in self.nodes:
            files["slurmd" if len(self.nodes) == 1 else f"slurmd@{node.name}"] = self.root / f"slurmd-{node.name}.pid"
        texts = {name: f.read_text().strip() if f.exists() else "" for name, f in files.items()}
        return {name: int(text) for name, text in texts.items() if text.isdigit()}

    def log(self, name: str) -> Path:
        """A daemon's log: ``munged``, ``slurmctld``, ``slurmd`` (the first node's) or ``slurmd@NODE``."""
        if name.startswith("slurmd"):
            return self.root / "log" / f"slurmd-{name.partition('@')[2] or self.nodes[0].name}.log"
        return self.root / "log" / f"{name}.log"    # munged logs to munged.out (it runs with -F)

    def _binary(self, name: str) -> str:
        given = self.binaries.get(name)
        path = given or shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), *_SEARCH]))
        if not path or not os.path.isfile(path) or not os.access(path, os.X_OK):
            where = f"{given} is not an executable file" if given else "not on PATH or in /usr/sbin"
            raise SlurmUnavailable(f"{name} not found: {where} (install Slurm and munge: "
                                   f"{advice('slurmctld', 'slurmd', 'slurm-client', 'munge')}; or `make slurm`)")
        return path

    def start(self, timeout: float = 60) -> "LocalSlurm":
        """Start the daemons and wait until the node is idle (``SlurmUnavailable`` otherwise)."""
        if self._procs or self._helper:
            return self
        t0 = time.monotonic()
        try:
            for name in DAEMONS + CLIENTS:
                self._binary(name)
            if os.geteuid() != 0:
                self._start_with_sudo(timeout)
            for attempt in range(3 if os.geteuid() == 0 else 0):
                try:
                    self._start_here(timeout)
                    break
                except SlurmUnavailable as exc:   # another server took a port free_port() gave
                    if "Address already in use" not in str(exc) or attempt == 2:
                        raise
                    self._stop_daemons()
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def __enter__(self) -> "LocalSlurm":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _write_files(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)       # clients that are not root read slurm.conf and the socket
        for sub in ("state", "spool", "munge", "log"):
            shutil.rmtree(self.root / sub, ignore_errors=True)     # a reused root starts afresh
            (self.root / sub).mkdir(mode=0o700 if sub == "state" else 0o755)
        fd = os.open(self.root / "munge" / "munge.key", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(1024))
        (self.root / "plugstack.conf").write_text("")   # not the system's /etc/slurm/plugstack.conf
        ctld_port = free_port()
        slurmd_port = next(p for p in iter(free_port, None) if p != ctld_port)
        r, names = self.root, ",".join(n.name for n in self.nodes)
        if self.task_env:  # a TaskProlog's `export` lines become every task's environment
            prolog = r / "task_prolog.sh"
            prolog.write_text("#!/bin/sh\n" + "".join(f"echo export {k}={v}\n" for k, v in self.task_env.items()))
            prolog.chmod(0o755)
        self.conf.write_text("\n".join([
            f"# a private Slurm (workbench.vcluster.slurm_local), {time.ctime()}",
            f"ClusterName={self.cluster}", f"SlurmctldHost={self.controller.name}({self.controller.address})",
            f"SlurmctldPort={ctld_port}", f"SlurmdPort={slurmd_port}",
            # every daemon and client binds the address its host's name resolves to, never 0.0.0.0
            "CommunicationParameters=NoCtldInAddrAny,NoInAddrAny",
            "SlurmUser=root", "SlurmdUser=root", "AuthType=auth/munge", "CredType=cred/munge",
            f"AuthInfo=socket={self.socket}", f"StateSaveLocation={r}/state",
            f"SlurmdSpoolDir={r}/spool/%n", f"SlurmctldPidFile={r}/slurmctld.pid",
            f"SlurmdPidFile={r}/slurmd-%n.pid", f"SlurmctldLogFile={r}/log/slurmctld.log",
            f"SlurmdLogFile={r}/log/slurmd-%n.log", f"SlurmctldDebug={self.debug}",
            f"SlurmdDebug={self.debug}", f"PlugStackConfig={r}/plugstack.conf",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
            "SlurmdParameters=config_overrides",        # CPUs= may differ from the hardware
            f"MpiDefault={self.mpi_default}", "SchedulerType=sched/backfill",
            "AccountingStorageType=accounting_storage/none", "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none", "ReturnToService=2", f"KillWait={self.kill_wait}", "MinJobAge=30",
            "JobRequeue=0",  # a job that lost a node fails (its run is recorded failed), never runs again
            # job ids differ between instances: MPICH names its shared memory after PMI_JOBID
            "InactiveLimit=0", f"FirstJobId={1_000_000 + secrets.randbelow(60_000_000)}",
            *([f"SlurmdTimeout={self.slurmd_timeout}"] if self.slurmd_timeout else []),
            *([f"TaskProlog={r}/task_prolog.sh"] if self.task_env else []),
            *(f"NodeName={n.name} NodeAddr={n.address} CPUs={self.cpus} State=UNKNOWN" for n in self.nodes),
            f"PartitionName=debug Nodes={names} Default=YES MaxTime=INFINITE "
            "OverSubscribe=FORCE:4 State=UP", ""]))

    def _spawn(self, name: str, args: list[str], enter: tuple[str, ...] = (), key: str | None = None) -> None:
        """Start daemon ``name`` (on the machine ``enter`` runs commands on), known as ``key``."""
        env = {**self.env, MARK: str(self.root)}
        key = key or name
        with open(self.root / "log" / f"{key}.out", "wb") as out:
            self._procs[key] = subprocess.Popen(
                [*enter, self._binary(name), *args], env=env, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True, cwd=self.root,
                preexec_fn=None if self.detached else _die_with_parent)

    def _check_alive(self) -> None:
        for name, proc in self._procs.items():
            if proc.poll() is not None:
                tail = _tail(self.root / "log" / f"{name}.out") or _tail(self.log(name))
                where = "" if self._tmp else f" (logs in {self.root / 'log'})"
                raise SlurmUnavailable(f"{name} exited with code {proc.returncode} while starting: "
                                       f"{tail or 'no output'}{where}")

    def _start_here(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        self._write_files()
        m = self.root / "munge"
        self._spawn("munged", ["-F", f"--socket={self.socket}", f"--key-file={m}/munge.key",
                               f"--pid-file={self.root}/munged.pid",
                               f"--log-file={self.log('munged')}", f"--seed-file={m}/munged.seed"])
        while not self.socket.exists():
            self._check_alive()
            if time.monotonic() > deadline:
                raise SlurmUnavailable(f"munged did not create {self.socket} in {timeout:g} s")
            time.sleep(0.05)
        self._spawn("slurmctld", ["-D", "-f", str(self.conf)], self.controller.enter)
        for node in self.nodes:
            self.start_slurmd(node)
        names = ",".join(n.name for n in self.nodes)
        while True:
            self._check_alive()
            try:
                res = self.run([self._binary("sinfo"), "-h", "-N", "-n", names, "-o", "%N %T"], timeout=10)
                states = dict(line.split(None, 1) for line in res.stdout.splitlines() if " " in line)
                state = ", ".join(f"{k}: {v}" for k, v in states.items()) or res.stderr.strip()
            except subprocess.TimeoutExpired:
                states, state = {}, "sinfo timed out"
            if len(states) == len(self.nodes) and all(v.strip() == "idle" for v in states.values()):
                return
            if time.monotonic() > deadline:
                raise SlurmUnavailable(
                    f"node(s) {names} not idle {timeout:g} s after start (sinfo: {state!r}); slurmctld: "
                    f"{_tail(self.log('slurmctld'), 2)}; slurmd: {_tail(self.log('slurmd'), 2)}")
            time.sleep(0.2)

    def start_slurmd(self, node: SlurmNode) -> None:
        """Start (or start again, after it was killed) the slurmd of ``node``."""
        self._spawn("slurmd", ["-D", "-f", str(self.conf), "-N", node.name], node.enter,
                    key="slurmd" if len(self.nodes) == 1 else f"slurmd@{node.name}")

    def _start_with_sudo(self, timeout: float) -> None:
        sudo = shutil.which("sudo")
        if not sudo or subprocess.run([sudo, "-n", "true"], capture_output=True).returncode:
            raise SlurmUnavailable("Slurm's daemons must run as root (slurmd starts job steps as "
                                   "their users): not root, and `sudo -n` is " +
                                   ("not installed" if not sudo else "not allowed without a password"))
        args = [*_as_root_cli(sudo), "up", "--root", str(self.root), "--cpus", str(self.cpus),
                "--mpi-default", self.mpi_default, "--timeout", str(timeout),
                "--cluster", self.cluster, *(["--remove"] if self._tmp else []),
                *(f"--binary={k}={v}" for k, v in self.binaries.items())]
        self._helper = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, start_new_session=True)
        for line in self._helper.stdout:
            if line.startswith("export SLURM_CONF="):
                return
        err = [line for line in self._helper.stderr.read().splitlines() if line.strip()]
        self._helper.wait()
        raise SlurmUnavailable(err[-1].split("SlurmUnavailable: ", 1)[-1] if err else
                               f"`sudo -n ... up` exited with code {self._helper.returncode}")

    def _stop_daemons(self) -> None:
        ctld = self._procs.get("slurmctld")
        try:                        # cancel the jobs left, wait (15 s at most) until they are gone
            deadline = time.monotonic() + 15
            if ctld is not None and ctld.poll() is None:
                self.run([self._binary("scancel"), "--partition=debug"], timeout=10)
                while time.monotonic() < deadline and self.run(
                        [self._binary("squeue"), "-h", "-o", "%i"], timeout=10).stdout.strip():
                    time.sleep(0.2)
        except (SlurmUnavailable, subprocess.TimeoutExpired, OSError):
            pass
        for name in [k for k in self._procs if k.startswith("slurmd")] + ["slurmctld", "munged"]:
            proc = self._procs.pop(name, None)
            if proc is not None:
                stop_processes([proc.pid], grace=10.0, kill_wait=5.0)
                proc.wait()
        stop_processes(leftover_pids(self.root, self.cluster), grace=2, kill_wait=5.0)

    def stop(self) -> None:
        """Cancel the jobs left, stop the daemons and anything else of this instance (its
        slurmstepds, its jobs' tasks), remove a temporary root. Safe to call twice."""
        if self._helper is not None:
            helper, self._helper = self._helper, None
            subprocess.run([*_as_root_cli(shutil.which("sudo") or "sudo"), "down", "--root",
                            str(self.root)], capture_output=True, timeout=90)
            with contextlib.suppress(subprocess.TimeoutExpired):
                helper.wait(timeout=30)
        elif self._procs:
            self._stop_daemons()
        if self._tmp:
            shutil.rmtree(self.root, ignore_errors=True)


if __name__ == "__main__":  # the old name of the command (`make slurm-up` runs slurm_cli)
    import runpy
    runpy.run_module("workbench.runtime.launch.slurm_cli", run_name="__main__", alter_sys=True)
