"""Byte sizes as people write them (``4096``, ``64K``, ``1.5M``): parsed by the CLI, the dashboard and
the virtual cluster, printed by the benchmarks, the simulator's tables and the pictures. Pure
(standard library only). The one home of the grammar below; nothing else parses a size.

The grammar (case-insensitive; spaces around a size and between its number and unit allowed)::

    size   = number [unit]
    number = digits ["." digits]               a fraction only where the bytes come out whole (1.5M, 0.5K)
    unit   = [("K" | "M" | "G" | "T") ["i"]] ["B"]   nothing or "B" alone: bytes

Units are binary in every spelling: ``64K`` = ``64k`` = ``64KB`` = ``64KiB`` = 65536 bytes (K = 1024,
M = 1024 K, ...). ``1e6``, ``-4``, ``64KK`` and ``1.5`` (not whole bytes) are not sizes.
"""
from __future__ import annotations

import re

#: bytes per unit (binary, whatever the spelling)
UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}

_SIZE = re.compile(r"(\d+)(?:\.(\d+))?\s*(?:([KMGT])I?)?B?", re.IGNORECASE | re.ASCII)

#: what a size looks like, for messages
SIZE_EXAMPLES = "4096, 64K, 1.5M or 1GiB (K = 1024)"


def _bytes(text: str) -> int | None:
    """The bytes ``text`` writes (0 included), or None when it is no size of the grammar."""
    match = _SIZE.fullmatch(text.strip()) if isinstance(text, str) else None
    if match is None:
        return None
    whole, fraction, unit = match.group(1), match.group(2) or "", (match.group(3) or "").upper()
    numerator, denominator = int(whole + fraction) * UNITS[unit], 10 ** len(fraction)
    if numerator % denominator:
        return None   # not whole bytes (1.5, 0.1K)
    return numerator // denominator


def parse_size(text: str) -> int:
    """A size of the module's grammar, in bytes (> 0): ``"4096"`` -> 4096, ``"64K"`` -> 65536,
    ``"1.5M"`` -> 1572864, ``"1GiB"`` -> 1073741824. Raises a one-line ValueError otherwise."""
    value = _bytes(text)
    if not value:
        raise ValueError(f"{text!r} is not a size: write bytes > 0 like {SIZE_EXAMPLES}")
    return value


def parse_fusion_bytes(text: str) -> int | None:
    """The fusion threshold (``--fusion-bytes``, ``fusion_bytes``): ``inf`` or ``none`` -> None (one
    message per step), ``0`` -> 0 (one message per tensor), else a size (:func:`parse_size`).
    Raises a one-line ValueError naming what is allowed."""
    if isinstance(text, str) and text.strip().lower() in ("inf", "none"):
        return None
    value = _bytes(text)
    if value is None:
        raise ValueError(f"must be 0 (one message per tensor), inf or none (one message per step), or a size "
                         f"like 4096, 64K, 1.5M; got {text!r}")
    return value


def format_size(nbytes: int) -> str:
    """4096 -> '4K', 1048576 -> '1M' (what :func:`parse_size` reads back)."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return str(nbytes)


def format_bytes(nbytes: float) -> str:
    """A byte count for people: 950 -> '950 B', 28860 -> '28.2 KiB', 3.4e6 -> '3.2 MiB'."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes:.0f} B"
