"""Files written whole or not at all: the one atomic write (checkpoints and their manifest, the
rank guards' records, the virtual clusters' registry).

Pure, and imports nothing but ``os``: the rank guard, which imports no package (it must start in
milliseconds), loads this file by path. The new content goes to a temporary file beside the target
(same folder, so the same file system), which then replaces the target in one ``os.replace``: a
reader sees the old file or the new one, never half of one, and a writer that dies leaves the
target as it was (and at most a hidden ``.NAME.PID.XXXXXXXX.tmp`` beside it). Not flushed to disk
(no ``fsync``): safe against a process dying, not against the machine losing power.
"""
from __future__ import annotations

import os


class atomic_path:  # noqa: N801 - used like a function: ``with atomic_path(path) as tmp``
    """``with atomic_path(path) as tmp:`` the block writes ``tmp`` (a str: a temporary path beside
    ``path``, e.g. ``torch.save(state, tmp)``); when the block ends, ``tmp`` replaces ``path``. On an
    exception ``tmp`` is removed and ``path`` is left as it was."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        folder, name = os.path.split(self.path)
        self.tmp = os.path.join(folder, f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")  # one per writer

    def __enter__(self) -> str:
        return self.tmp

    def __exit__(self, kind, value, traceback) -> None:
        try:
            if kind is None:
                os.replace(self.tmp, self.path)
                return
        except BaseException:
            self._remove()
            raise
        self._remove()

    def _remove(self) -> None:
        try:
            os.unlink(self.tmp)
        except OSError:  # never written
            pass


def atomic_write(path: str | os.PathLike, data: bytes | str) -> None:
    """Write ``data`` (bytes, or text as UTF-8) to ``path`` atomically (see the module)."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data if isinstance(data, bytes) else data.encode("utf-8"))
