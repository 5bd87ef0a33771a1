"""What the subcommands share: argument types, messages, the results store, signals."""
from __future__ import annotations

import argparse
import sys

from ..checks import integer_argument

#: ``type=`` for options that take a count (``--ranks``, ``--limit``, ``--k``)
positive_int = integer_argument(1)


def parse_sizes(text: str) -> list[int]:
    """``--sizes``: comma-separated sizes (:func:`workbench.sizes.parse_size`: ``4K,64K,1.5M``)."""
    from ..sizes import parse_size
    try:
        return [parse_size(s) for s in text.split(",")]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def fusion_bytes_argument(text: str) -> int | None:
    """``--fusion-bytes`` (train, compare, predict): :func:`workbench.sizes.parse_fusion_bytes`
    (``inf``/``none``: None, one message per step; ``0``: one per tensor; else a size like 64M)."""
    from ..sizes import parse_fusion_bytes
    try:
        return parse_fusion_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_seconds(text: str) -> float:
    """A finite number of seconds > 0 (``--timeout``)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value > 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0, got {text!r}")
    return value


def open_store(args, command: str):
    """The results store named by ``--store`` (default ``$WORKBENCH_STORE`` or
    ``data/workbench.sqlite``), or None after printing why it cannot be opened."""
    import sqlite3

    from ..store import Store, default_path
    try:
        return Store(args.store)
    except (OSError, sqlite3.Error, RuntimeError) as exc:
        print(f"workbench {command}: error: --store: cannot open the results store {args.store or default_path()}: "
              f"{exc}", file=sys.stderr)
        return None


def say(text: str) -> None:
    """Print to stderr; a terminal that is gone (SIGHUP) or a closed pipe is not an error."""
    try:
        print(text, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def interrupt_code(exc: BaseException) -> tuple[int, str]:
    """The exit code (128 + signal) and the signal's name of an interruption."""
    import signal

    from ..runtime.launch.signals import signal_name
    signum = getattr(exc, "signum", signal.SIGINT)
    return 128 + signum, signal_name(signum)


def percent(value) -> str:
    return "" if value is None or value != value else f"{100 * value:.1f}%"  # None or NaN: blank
