"""Where the workbench keeps what it makes once per machine or user: allreduce tuning decisions
(:mod:`workbench.comm.tuning`), the generated data sets (:mod:`workbench.generated_sets`), the clusters'
records (:mod:`workbench.runtime.client.records`). Each has an environment variable that moves it;
by default all live under ``~/.cache/workbench``. Pure (the standard library only).
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

#: the words that turn a cache off (``WORKBENCH_TUNING_CACHE=none``): nothing is kept
OFF = ("", "none", "off")


def cache_home() -> Path:
    """``~/.cache/workbench``: the default home of everything below."""
    return Path.home() / ".cache" / "workbench"


def from_env(variable: str, default: str, *, may_be_off: bool = True) -> Path | None:
    """The path in the environment variable ``variable``, else ``cache_home() / default``. With
    ``may_be_off``, the variable set to ``none``, ``off`` or nothing means keep nothing (None)."""
    value = os.environ.get(variable)
    if value is None:
        return cache_home() / default
    if may_be_off and value.strip().lower() in OFF:
        return None
    return Path(value)


def state_dir() -> Path:
    """Where clusters (notebook clusters, virtual clusters) are recorded, with their connection files,
    keys and logs: ``$WORKBENCH_STATE_DIR`` or ``~/.cache/workbench``, this user's alone (made 0700, or
    :class:`UnsafeFolder` if another user owns it or may write it: :func:`own_folder`). One of this user's
    that others may read or enter is made 0700, unless ``WORKBENCH_SHARED=1``."""
    path = own_folder(from_env("WORKBENCH_STATE_DIR", "", may_be_off=False),
                      instead="set WORKBENCH_STATE_DIR to a folder of your own")
    if not shared_files() and path.stat().st_mode & 0o077:  # one an older workbench made 0755: its logs were readable
        path.chmod(0o700)
    return path


def shared_files() -> bool:
    """Whether results are meant for other users too: ``WORKBENCH_SHARED=1`` (or true/yes).

    By default the results store is created ``0600`` (its ``-wal``/``-shm`` files follow it), run
    directories and the state folder ``0700``, so other users of a shared login node cannot read runs;
    with ``WORKBENCH_SHARED=1`` run directories and the store get the usual umask-derived modes."""
    return os.environ.get("WORKBENCH_SHARED", "").strip().lower() in ("1", "true", "yes")


class UnsafeFolder(RuntimeError):
    """A folder workbench would use that another user made or may write: one line naming the path,
    why, and the fix (as OpenSSH refuses a key file others can read)."""


def own_folder(path: str | os.PathLike, *, mode: int = 0o700, instead: str = "use another folder") -> Path:
    """``path``, a folder of this user's that no one else may write: created (parents too) with
    ``mode`` if it is not there, else checked as it is. On a shared machine a folder in ``/tmp`` or
    ``/dev/shm`` may have been made first by another user, to read or steer what is put in it; so a
    link, a folder another user owns, or one that group or others may write (beyond what ``mode``
    allows) is :class:`UnsafeFolder`, naming the fix or what to do ``instead``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(path, mode)  # exclusive: either we made it now, or it was there and is checked below
    except FileExistsError:
        pass
    st = os.lstat(path)
    why = _not_yours(st, "another user made it; remove it if it is not yours")
    if why is None and not stat.S_ISDIR(st.st_mode):
        why = "is not a folder; remove it"
    if why is None and st.st_mode & 0o022 & ~mode:
        who = "group and others" if st.st_mode & 0o002 else "its group"
        why = f"may be written by {who} (mode {st.st_mode & 0o777:o}); chmod go-w {path}"
    if why is None:
        return path
    raise UnsafeFolder(f"{path} {why}, or {instead}")


def _not_yours(st: os.stat_result, fix: str) -> str | None:
    """Why a path whose ``lstat`` is ``st`` is not safely this user's (a link, or another user's, then
    ``fix``), or None: what :func:`own_folder` and :func:`private_file` both check first."""
    if stat.S_ISLNK(st.st_mode):
        return "is a link; remove it"
    if st.st_uid != os.geteuid():
        return f"belongs to uid {st.st_uid}, not to you (uid {os.geteuid()}): {fix}"
    return None


def private_file(path: str | os.PathLike) -> Path:
    """``path``, a file that holds a secret (a connection file: the key to a cluster), checked: yours,
    not a link, and readable by no one else; else :class:`UnsafeFolder` naming it and the fix."""
    path = Path(path)
    st = os.lstat(path)
    why = _not_yours(st, "remove it")
    if why is None and st.st_mode & 0o077:
        why = f"may be read or written by others (mode {st.st_mode & 0o777:o}); chmod 600 {path}, or remove it"
    if why is None:
        return path
    raise UnsafeFolder(f"{path} holds a secret and {why}")
