"""Message sizes as people write them (``4K``, ``1M``): parsed by the CLI, printed by the
benchmarks, the simulator's tables and the pictures. Pure: no imports."""
from __future__ import annotations


def parse_size(text: str) -> int:
    """``"4K"`` -> 4096, ``"1M"`` -> 1048576, ``"1G"``, or plain bytes. Raises ValueError."""
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    number = text[:-1] if scale > 1 else text
    if not number.isdigit() or int(number) <= 0:
        raise ValueError(f"--sizes: {text!r} is not a size like 4K, 64K, 1M, 8M or 4096")
    return int(number) * scale


def format_size(nbytes: int) -> str:
    """4096 -> '4K', 1048576 -> '1M'."""
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
