"""MPICH's shared-memory segments (``/dev/shm/mpich_shm_*``): which are in use, and removing the
ones a killed job left behind (never another running job's)."""
from __future__ import annotations

import os
from pathlib import Path


def mapped_shm(pids=None) -> set[str]:
    """Names of the MPICH shared-memory segments (``mpich_shm_*``) that the processes ``pids``
    (default: every process we may read) have mapped: those belong to a running job."""
    maps = [Path(f"/proc/{pid}/maps") for pid in pids] if pids is not None else Path("/proc").glob("[0-9]*/maps")
    names = set()
    for path in maps:
        try:
            text = path.read_text()
        except OSError:  # the process ended, or is not ours to read
            continue
        names.update(name for name in (word.rsplit("/", 1)[-1] for word in text.split())
                     if name.startswith("mpich_shm_"))
    return names


def remove_orphaned_shm(shm_dir: str | os.PathLike = "/dev/shm") -> list[str]:
    """Delete MPICH shared-memory segments that no live process has mapped; return their names.

    A job that aborts or is killed leaves its ``mpich_shm_*`` files behind (about 4 MB each,
    held in RAM). A segment still mapped by any process belongs to a running job and is kept.
    """
    shm_dir = Path(shm_dir)
    candidates = {p.name: p for p in shm_dir.glob("mpich_shm_*")}
    if not candidates:
        return []
    in_use = mapped_shm()
    removed = []
    for name, path in candidates.items():
        if name not in in_use:
            path.unlink(missing_ok=True)
            removed.append(name)
    return removed
