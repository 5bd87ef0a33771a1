"""Run folders: where they go, their ids, how they are created and the names of their files;
shared by the ranks, the notebook and the CLI.

Pure (no torch, no MPI): the notebook kernel and the CLI use these too.
"""
from __future__ import annotations

import os
import uuid
from datetime import datetime
from pathlib import Path

from ..config import RunConfig

#: written by ``Run.cancel()`` / an interrupted CLI; the ranks stop at their next look
CANCEL_FILE = "CANCEL"


def runs_root() -> Path:
    """``$WORKBENCH_RUNS`` or ``data/runs`` under the current directory."""
    return Path(os.environ.get("WORKBENCH_RUNS", "data/runs"))


def new_run_id(cfg: RunConfig) -> str:
    """``20261122-143501-sync-easgd-3fa2``: sortable, readable, unique."""
    return f"{datetime.now():%Y%m%d-%H%M%S}-{cfg.algorithm}-{uuid.uuid4().hex[:4]}"


def run_id_for(run_dir: str | os.PathLike | None, cfg: RunConfig, store=None, name: str | None = None) -> str:
    """The id under which a run writing into ``run_dir`` is stored: unique in ``store``.

    It is ``name`` (default: the directory's name, or :func:`new_run_id` without a directory)
    when ``store`` (a :class:`~workbench.store.Store`, or None: no store to collide with) holds
    no run of that id, else that name with ``-`` and 4 random hex digits: ``--out a/myrun`` and
    then ``--out b/myrun`` are two runs, ``myrun`` and ``myrun-3fa2``.
    """
    base = name or (Path(run_dir).resolve().name if run_dir is not None else new_run_id(cfg))
    run_id = base
    while store is not None and run_id in store:
        run_id = f"{base}-{uuid.uuid4().hex[:4]}"
    return run_id


def make_run_dir(run_dir: str | os.PathLike, option: str = "run_dir") -> Path:
    """Create ``run_dir`` for a new run and return it; ConfigError if it is a file, already holds
    a run (``config.json``: a finished run's files are never overwritten; a resumed run writes
    into a new directory), or cannot be created or written (a parent that is a file, /proc, a
    read-only file system, no permission: :func:`~workbench.checks.writable_folder`). The
    directory is created ``0700`` (owner only) unless ``WORKBENCH_SHARED=1``; ``option`` names the
    argument in the message (``--out``)."""
    from ..checks import writable_folder
    from ..config import ConfigError, shared_files
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"{option}: {str(run_dir)!r} is a file, not a directory")
    if (run_dir / "config.json").exists():
        raise ConfigError(f"{option}: {str(run_dir)!r} already holds a run ({run_dir / 'config.json'}); give a "
                          f"new directory (to continue that run: --resume {run_dir} --out NEW_DIR)")
    writable_folder(option, run_dir, ConfigError)
    try:
        mode = 0o777 if shared_files() else 0o700  # the runs' folder too: others do not list run ids
        run_dir.parent.mkdir(parents=True, exist_ok=True, mode=mode)
        run_dir.mkdir(mode=mode, exist_ok=True)
    except OSError as exc:  # changed since the check (another process)
        raise ConfigError(f"{option}: cannot create {str(run_dir)!r} ({exc.strerror or exc}); give a folder "
                          f"you can write") from None
    return run_dir
