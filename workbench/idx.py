"""IDX files, the format of MNIST and its kin (Fashion-MNIST, KMNIST, EMNIST): a magic number, the
shape, then the values; raw or gzipped. The reader of :mod:`workbench.data`'s ``fashion-mnist`` and
``idx:FOLDER`` data sets. Pure (numpy and the standard library).
"""
from __future__ import annotations

import gzip
import os
import zlib

import numpy as np


def read_idx(path: str | os.PathLike, header_only: bool = False, rows: int | None = None
             ) -> np.ndarray | tuple[int, ...]:
    """An IDX file (``.gz`` or raw) of unsigned bytes as a numpy array, or with ``header_only`` its
    shape; ``rows=N`` reads (and decompresses) only the first N rows. ValueError naming the file
    when it is not one, cannot be read (no permission, a damaged or cut ``.gz``), or, raw, holds
    fewer bytes than its header says (checked with ``header_only`` too: the ranks read them all)."""
    compressed = str(path).endswith(".gz")
    opener = gzip.open if compressed else open
    try:
        with opener(path, "rb") as f:
            head = f.read(4)
            if len(head) != 4 or head[:2] != b"\0\0" or head[2] != 0x08 or not 1 <= head[3] <= 4:
                raise ValueError(f"{os.fspath(path)!r} is not an IDX file of unsigned bytes (magic {head.hex()!r})")
            shape = tuple(int.from_bytes(f.read(4), "big") for _ in range(head[3]))
            if header_only:
                held = os.fstat(f.fileno()).st_size - 4 * (1 + len(shape))
                if not compressed and held < int(np.prod(shape)):
                    raise ValueError(f"{os.fspath(path)!r}: {max(held, 0)} bytes of data for shape {shape} "
                                     f"(cut short?)")
                return shape
            if rows is not None:
                shape = (min(rows, shape[0]), *shape[1:])
            data = np.frombuffer(f.read(int(np.prod(shape)) if rows is not None else -1), dtype=np.uint8)
    except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
        raise ValueError(f"cannot read {os.fspath(path)!r}: {type(exc).__name__}: {exc}") from None
    if data.size != int(np.prod(shape)):
        raise ValueError(f"{os.fspath(path)!r}: {data.size} bytes of data for shape {shape}")
    return data.reshape(shape)
