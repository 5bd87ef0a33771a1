"""What killed MPI jobs leave on this host, and removing our own of it (never another user's, never
a running job's, never with an error that hides the run's own).

A job that aborts or is killed leaves files its library would have removed at a clean exit:
MPICH's shared-memory segments (``/dev/shm/mpich_shm_*``, about 4 MB each, held in RAM), Intel MPI's
(``/dev/shm/Intel_MPI_*``), Open MPI's (``/dev/shm/sm_segment.*``) and hydra's topology file
(``/tmp/hydra_hwloc_xmlfile_*``, one per killed job). On a login node these folders are shared with
every other user, who can also plant a file of that name there. So a file is removed only when:

- it is a regular file (not a link) owned by this user, and
- no live process of this user maps it, holds it open or names it in its environment (a running
  job's).

A file that cannot be read or removed is skipped: clean-up never raises.
"""
from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

#: (folder, pattern) of each leftover kind; the folder ``None`` is the temporary folder
KINDS = (("/dev/shm", "mpich_shm_*"), ("/dev/shm", "Intel_MPI_*"), ("/dev/shm", "sm_segment.*"),
         (None, "hydra_hwloc_xmlfile_*"))


def mapped_shm(pids=None) -> set[str]:
    """Names of the MPICH shared-memory segments (``mpich_shm_*``) that the processes ``pids``
    (default: every process we may read) have mapped: those belong to a running job."""
    return {Path(p).name for p in in_use(pids) if Path(p).name.startswith("mpich_shm_")}


def _read(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8", "replace")
    except OSError:  # the process ended, or is not ours to read
        return ""


def in_use(pids=None) -> set[str]:
    """Paths that the processes ``pids`` (default: every process we may read) map, hold open or name
    in their environment (``HWLOC_XMLFILE=...``)."""
    procs = [Path(f"/proc/{pid}") for pid in pids] if pids is not None else Path("/proc").glob("[0-9]*")
    paths: set[str] = set()
    for proc in procs:
        paths.update(word for word in _read(proc / "maps").split() if word.startswith("/"))
        paths.update(value for entry in _read(proc / "environ").split("\0")
                     for value in entry.split("=", 1)[1:] if value.startswith("/"))
        try:
            fds = list((proc / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                paths.add(os.readlink(fd))
            except OSError:
                continue
    return paths


def _ours(path: Path, uid: int) -> bool:
    try:
        st = path.lstat()
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == uid


def remove_leftovers(folders: dict[str, str | os.PathLike] | None = None) -> list[str]:
    """Remove this user's files that killed MPI jobs left (:data:`KINDS`) and no live process of ours
    uses; return their names. ``folders`` maps a kind's folder to another (tests)."""
    uid = os.geteuid()
    candidates: list[Path] = []
    for folder, pattern in KINDS:
        where = Path((folders or {}).get(folder or "tmp", folder or tempfile.gettempdir()))
        try:
            candidates += [p for p in where.glob(pattern) if _ours(p, uid)]
        except OSError:
            continue
    if not candidates:
        return []
    used = in_use()
    removed = []
    for path in candidates:
        if str(path) in used:
            continue
        try:
            path.unlink()
        except OSError:
            continue
        removed.append(path.name)
    return removed
