"""Argument checks shared by every layer: one wording for one mistake.

Pure (no imports beyond the standard library): the notebook kernel, the CLI, the ranks and the
pure packages use it alike. Each check returns the value, or raises ``error`` (default
``ValueError``) with a one-line message that names the argument and what is allowed.
"""
from __future__ import annotations

import argparse
import math
import os
from pathlib import Path


def finite_number(value) -> bool:
    """An int or float (not a bool) that is neither inf nor NaN."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def integer(name: str, value, minimum: int = 1, error: type[Exception] = ValueError) -> int:
    """``value`` if it is an integer (not a bool) ``>= minimum``, else ``error``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise error(f"{name} must be an integer >= {minimum}; got {value!r}")
    return value


def integer_argument(minimum: int = 1):
    """An argparse ``type=`` that parses text into an integer ``>= minimum``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}; got {text!r}")
        return value
    parse.__name__ = f"integer >= {minimum}"
    return parse


def _nearest_existing(path: Path) -> Path:
    """``path`` itself or its nearest ancestor that exists (a dangling link counts as existing)."""
    while not os.path.lexists(path) and path.parent != path:
        path = path.parent
    return path


def _can_write_in(name: str, path, folder: Path, error: type[Exception], fix: str) -> None:
    """Raise ``error`` unless ``folder`` (an existing directory) takes a new entry: a hidden folder is
    made there and removed at once. Tried rather than asked (``os.access``): root passes every
    permission check, yet cannot create anything in /proc, /sys or on a read-only file system."""
    import tempfile
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".workbench-probe-", dir=folder))
    except OSError as exc:
        why = exc.strerror or str(exc)
        if folder == Path(path).absolute():
            raise error(f"{name}: cannot write in {str(path)!r} ({why}); {fix}") from None
        raise error(f"{name}: cannot create {str(path)!r}: nothing can be created in {str(folder)!r} ({why}); "
                    f"{fix}") from None


def writable_folder(name: str, path, error: type[Exception] = ValueError,
                    fix: str = "give a folder you can write") -> Path:
    """``path`` as a Path if it is a directory this process can write in, or one it can create
    (with its missing parents: the nearest existing ancestor is a directory it can write in);
    else ``error`` naming ``name`` (``--out``) and ending with ``fix``. Nothing is created (a
    probe in the directory is made and removed), so a refused option leaves no trace."""
    given = Path(path)
    absolute = given.absolute()
    existing = _nearest_existing(absolute)
    if existing == absolute:
        if not absolute.is_dir():
            raise error(f"{name}: {str(path)!r} is {_kind(absolute)}, not a directory; {fix}")
        _can_write_in(name, path, absolute, error, fix)
        return given
    if not existing.is_dir():
        raise error(f"{name}: cannot create {str(path)!r}: {str(existing)!r} is {_kind(existing)}, not a "
                    f"directory; {fix}")
    _can_write_in(name, path, existing, error, fix)
    return given


def writable_file(name: str, path, error: type[Exception] = ValueError,
                  fix: str = "give a file path you can write") -> Path:
    """``path`` as a Path if this process can write the file: an existing file it may write, or a
    new one in a directory that is writable or can be created (:func:`writable_folder`); else
    ``error`` naming ``name`` (``--json``). Nothing is created or changed."""
    given = Path(path)
    absolute = given.absolute()
    if absolute.is_dir():
        raise error(f"{name}: {str(path)!r} is a directory; {fix}")
    if os.path.lexists(absolute):
        if not absolute.is_file():
            raise error(f"{name}: {str(path)!r} is {_kind(absolute)}, not a file; {fix}")
        if not os.access(absolute, os.W_OK):
            raise error(f"{name}: {str(path)!r} is not writable (read-only file or file system); {fix}")
        return given
    existing = _nearest_existing(absolute.parent)
    if not existing.is_dir():
        raise error(f"{name}: cannot create {str(path)!r}: {str(existing)!r} is {_kind(existing)}, not a "
                    f"directory; {fix}")
    _can_write_in(name, path, existing, error, fix)
    return given


def _kind(path: Path) -> str:
    """What an existing path that is not a directory is, for a message."""
    if path.is_symlink() and not path.exists():
        return "a link to nothing"
    return "a file" if path.is_file() else "not a regular file"
