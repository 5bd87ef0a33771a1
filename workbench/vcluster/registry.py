"""Where virtual clusters are recorded, and choosing what a new one may use.

Each cluster has a folder (its record ``cluster.json``, the files that keep its nodes' namespaces,
the hosts file, the launcher stand-in and Slurm wrappers): under ``/run/workbench-vcluster`` for root
(and inside a rootless cluster's own ``/run``), else a per-user folder. ``up`` and ``down`` hold a
lock on the registry while they choose names and subnets.
"""
from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
from pathlib import Path

from ..files import atomic_write
from ..paths import own_folder
from .plan import RANGE, SLOTS
from .tools import VirtualClusterError, run, tool

#: root's folder of every virtual cluster: their records, kept namespaces, hosts files, scripts
ROOT_REGISTRY = Path("/run/workbench-vcluster")
#: the same inside a rootless cluster's user namespace
USERNS_REGISTRY = Path("/run/workbench-vcluster-userns")


def registry(create: bool = False) -> Path:
    """Where cluster records live: ``/run/workbench-vcluster`` for root (and inside a rootless
    cluster's user namespace, where ``/run`` is its own); for other users
    ``$XDG_RUNTIME_DIR/workbench-vcluster`` or ``<tmp>/workbench-vcluster-<uid>``.

    A record names processes that ``down`` kills, so the folder must be this user's alone: when it
    is there (or ``create``: made exclusively) it is checked (:func:`workbench.paths.own_folder`),
    and one that another user made or may write is :class:`~workbench.paths.UnsafeFolder`."""
    path = _where()
    if create or os.path.lexists(path):
        own_folder(path, mode=0o755 if os.geteuid() == 0 else 0o700,
                   instead=f"set {REGISTRY_ENV} to a folder of your own")
    return path


#: environment variable that moves the registry
REGISTRY_ENV = "WORKBENCH_VCLUSTER_REGISTRY"


def _where() -> Path:
    if os.environ.get(REGISTRY_ENV):
        return Path(os.environ[REGISTRY_ENV])
    if os.geteuid() == 0 and os.environ.get("WORKBENCH_VCLUSTER_INSIDE"):
        # root inside a rootless cluster's user namespace, in its own /run: not root's path, under which
        # the host's registry is mounted (a namespace kept below a copy of that mount fails with EINVAL)
        return USERNS_REGISTRY
    if os.geteuid() == 0:
        return ROOT_REGISTRY
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.access(runtime, os.W_OK):
        return Path(runtime) / "workbench-vcluster"
    import tempfile
    return Path(tempfile.gettempdir()) / f"workbench-vcluster-{os.getuid()}"


def folder(name: str) -> Path:
    return registry() / name


def record_path(name: str) -> Path:
    return folder(name) / "cluster.json"


def read_record(name: str) -> dict | None:
    try:
        return json.loads(record_path(name).read_text())
    except (OSError, ValueError):
        return None


def write_record(name: str, record: dict) -> None:
    atomic_write(record_path(name), json.dumps(record, indent=1))


@contextlib.contextmanager
def locked():
    """One ``up`` or ``down`` at a time on this machine (they choose subnets and names)."""
    reg = registry(create=True)
    with open(reg / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# -- choosing a subnet ------------------------------------------------------------------------
def used_slots() -> set[int]:
    """/24 slots of 198.18.0.0/15 in use: by a recorded cluster or by any address on this host."""
    used = set()
    reg = registry()
    for path in reg.glob("*/cluster.json") if reg.exists() else []:
        with contextlib.suppress(OSError, ValueError, KeyError):
            used.add(int(json.loads(path.read_text())["slot"]))
    proc = run([tool("ip"), "-j", "-4", "addr"], "list this host's addresses", check=False)
    with contextlib.suppress(ValueError):
        for link in json.loads(proc.stdout or "[]"):
            for addr in link.get("addr_info", []):
                a = ipaddress.ip_address(addr.get("local", "0.0.0.0"))
                if a in RANGE:
                    used.add((int(a) - int(RANGE.network_address)) // 256)
    return used


def free_slot() -> int:
    used = used_slots()
    for slot in range(SLOTS):
        if slot not in used:
            return slot
    raise VirtualClusterError(f"every /24 of {RANGE} is in use by a virtual cluster or this host's addresses")




def stale_names() -> list[str]:
    """Clusters whose ``up`` died half-way or whose owning process (a ``with VirtualCluster``) is gone."""
    stale = []
    reg = registry()
    for path in reg.glob("*/cluster.json") if reg.exists() else []:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            stale.append(path.parent.name)
            continue
        if owner_gone(record):
            stale.append(record["name"])
    return stale


def owner_gone(record: dict) -> bool:
    """The cluster belonged to a process (a ``with VirtualCluster`` block, a kernel's ``up()``) that is gone."""
    owner = record.get("owner")
    return bool(owner) and not same_process(owner["pid"], owner["started"])


def same_process(pid: int, started: float) -> bool:
    try:
        import psutil
        return abs(psutil.Process(pid).create_time() - started) < 0.01
    except Exception:  # noqa: BLE001 - gone, or not ours to see
        return False
