"""Virtual clusters for users who are not root: the same cluster inside a user namespace.

Root builds a cluster in the host's own namespaces (the head is the host). Another user cannot;
where the kernel lets unprivileged users make user namespaces, ``up`` starts a small *holder*
process in a new user, network and mount namespace, where the user is root::

    unshare --user --map-root-user --net --mount python -m workbench.vcluster.holder ...

The holder mounts its own ``/run``, builds the cluster there exactly as root does (its network
namespace is the head: the bridge, the head's address) and then sleeps; the cluster lives as long
as it does. Every later command of that user (``workbench vcluster status|exec|mpiexec|down``,
``workbench train|compare --vcluster``) runs itself again inside the holder's namespaces
(``nsenter -t HOLDER --user --net --mount``), where the head is. ``down`` removes the cluster
from inside, then ends the holder.

What needs the host itself stays root's: Slurm (its daemons run as root and start job steps as
their users) and ``wb.Cluster(vcluster=...)`` from a notebook kernel (the kernel would have to run
inside the holder's namespaces: a process that already runs threads cannot enter a user namespace).
Where the kernel forbids user namespaces, ``up`` is a one-line error naming the setting.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from . import registry
from .tools import VirtualClusterError

#: set in the environment of a command that runs inside a holder's namespaces
INSIDE = "WORKBENCH_VCLUSTER_INSIDE"
#: the sysctls that forbid unprivileged user namespaces, with the value that forbids them
FORBIDDING = (("/proc/sys/kernel/unprivileged_userns_clone", "0"), ("/proc/sys/user/max_user_namespaces", "0"),
              ("/proc/sys/kernel/apparmor_restrict_unprivileged_userns", "1"))


def is_root() -> bool:
    """Root on the host, or root inside a holder's user namespace (a re-entered command)."""
    return os.geteuid() == 0


def outer_registry() -> Path:
    """Where a user's rootless clusters are recorded on the host (found without entering anything)."""
    return registry.registry()


def require_root(what: str) -> None:
    if not is_root():
        raise VirtualClusterError(
            f"vcluster {what}: not root; as another user a virtual cluster lives in a user namespace: use the CLI "
            "(`workbench vcluster up NAME --nodes N`, then `workbench vcluster exec|mpiexec|down` and "
            "`workbench train --vcluster NAME`)")


def read_any(name: str) -> dict | None:
    """The record of cluster ``name``: root's own, or (another user) the holder's."""
    return registry.read_record(name)


def held(name: str) -> bool:
    """Whether ``name`` is a rootless cluster seen from outside its holder."""
    record = registry.read_record(name) if not is_root() else None
    return bool(record and record.get("holder"))


def records() -> list[dict]:
    reg = registry.registry()
    out = []
    for path in sorted(reg.glob("*/cluster.json")) if reg.exists() else []:
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return out


def why_no_user_namespaces() -> str | None:
    """None where this user can make a user namespace with its own network; else the reason, one line."""
    for path, value in FORBIDDING:
        try:
            if Path(path).read_text().strip() == value:
                name = path.removeprefix("/proc/sys/").replace("/", ".")
                return f"the kernel forbids unprivileged user namespaces (sysctl {name} = {value})"
        except OSError:
            continue
    proc = subprocess.run(["unshare", "--user", "--map-root-user", "--net", "--mount", "true"],
                          capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        said = " ".join(proc.stderr.split()) or f"exit code {proc.returncode}"
        return f"`unshare --user --map-root-user --net --mount` failed: {said}"
    return None


def up(vc, timeout: float = 60.0) -> None:
    """Build ``vc`` for a user who is not root: start its holder and wait until the cluster is up."""
    name = vc.plan.name
    if vc.plan.slurm:
        raise VirtualClusterError("slurm: Slurm's daemons run as root (slurmd starts job steps as their users); "
                                  "run `workbench vcluster up --slurm` as root")
    reason = why_no_user_namespaces()
    if reason:
        raise VirtualClusterError(f"vcluster up as uid {os.getuid()}: {reason}; run it as root instead")
    reg = registry.registry(create=True)
    existing = registry.read_record(name)
    if existing is not None:
        if existing.get("holder") and _holder_alive(existing):
            raise VirtualClusterError(f"vcluster {name!r} is already up ({existing['nodes']} nodes): "
                                      f"`workbench vcluster down {name}` first")
        teardown_any(name)
    Path(vc.plan.shared).mkdir(parents=True, exist_ok=True, mode=0o755)
    t0 = time.monotonic()
    ready = reg / f".{name}.ready"
    ready.unlink(missing_ok=True)
    log = reg / f".{name}.log"
    with open(log, "w") as out:
        holder = subprocess.Popen(
            ["unshare", "--user", "--map-root-user", "--net", "--mount", "--propagation", "private",
             sys.executable, "-m", "workbench.vcluster.holder", json.dumps(vc.plan.to_dict()), str(ready)],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, INSIDE: "1"}, cwd="/", preexec_fn=_one_cpu)
    deadline = time.monotonic() + timeout
    while not ready.exists():
        if holder.poll() is not None or time.monotonic() > deadline:
            holder.kill()
            said = " | ".join(line.strip() for line in log.read_text(errors="replace").splitlines()
                              if line.strip())[-600:]
            log.unlink(missing_ok=True)
            raise VirtualClusterError(f"vcluster {name}: the user namespace's holder "
                                      f"{'exited' if holder.poll() is not None else 'did not answer in time'}: "
                                      f"{said or 'no output'}")
        time.sleep(0.02)
    inner = json.loads(ready.read_text())
    ready.unlink(missing_ok=True)
    log.unlink(missing_ok=True)
    import psutil
    record = {**inner, "holder": {"pid": holder.pid, "started": psutil.Process(holder.pid).create_time()}}
    (reg / name).mkdir(exist_ok=True, mode=0o700)
    registry.write_record(name, record)
    vc.record, vc.keep = record, True
    vc.plan.slot = inner["slot"]
    vc.up_seconds = time.monotonic() - t0


def _holder_alive(record: dict) -> bool:
    holder = record.get("holder") or {}
    return registry.same_process(holder.get("pid", -1), holder.get("started", 0))


def enter_prefix(record: dict, cwd: str | None = None) -> list[str]:
    """The argv prefix that runs a command inside a holder's user, network and mount namespaces."""
    holder = record["holder"]["pid"]
    return ["nsenter", "-t", str(holder), "--user", "--preserve-credentials", "--net", "--mount",
            f"--wd={cwd or os.getcwd()}", "--",
            "env", f"{INSIDE}=1"]


def reenter(args) -> int | None:
    """For a CLI command about a rootless cluster, from outside its holder: run the same command
    inside and return its exit code. None where this process goes on itself (root, or inside)."""
    if is_root() or os.environ.get(INSIDE):
        return None
    name = getattr(args, "vcluster", None) or getattr(args, "name", None)
    record = registry.read_record(name) if name else None
    if not record or not record.get("holder") or not _holder_alive(record):
        raise VirtualClusterError(f"vcluster {name!r} is not up (`workbench vcluster up {name} --nodes N`)")
    argv = getattr(args, "argv_given", None) or sys.argv[1:]
    proc = subprocess.run([*enter_prefix(record), sys.executable, "-m", "workbench.cli", *argv])
    return proc.returncode


def down(name: str) -> list[str]:
    """Remove a rootless cluster from outside: its nodes' processes and namespaces from inside, then its holder."""
    record = registry.read_record(name)
    removed = []
    if record and record.get("holder") and _holder_alive(record):
        proc = subprocess.run([*enter_prefix(record, "/"), sys.executable, "-m", "workbench.cli", "vcluster", "down",
                               name], capture_output=True, text=True, timeout=120)
        removed.append(proc.stdout.strip().split("removed ", 1)[-1] or "its nodes")
    removed += teardown_any(name)
    return removed


def teardown_any(name: str) -> list[str]:
    """End a rootless cluster's holder (whatever state it is in) and forget its record."""
    record = registry.read_record(name) or {}
    removed = []
    if record.get("holder") and _holder_alive(record):
        os.kill(record["holder"]["pid"], signal.SIGKILL)
        removed.append(f"its user namespace (holder pid {record['holder']['pid']})")
    import shutil
    shutil.rmtree(registry.folder(name), ignore_errors=True)
    return removed


def _one_cpu() -> None:
    """Pin the holder, and so the namespaces it makes, to one CPU. The kernel keeps a mount namespace
    bound to a file only in a namespace older than it (by its id); on this machine's 6.18 kernel,
    binding a node's namespace inside the holder's failed with EINVAL in about half the holders
    (every node of a failing holder failed, retries included) and in none once the holder and
    its children ran on one CPU: the ids seem to come in per-CPU batches, so a namespace made later
    on the other CPU can have the lower id. The nodes' own processes are not the holder's children
    (they enter with nsenter) and keep every CPU."""
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
