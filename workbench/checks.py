"""Argument checks shared by every layer: one wording for one mistake.

Pure (no imports beyond the standard library): the notebook kernel, the CLI, the ranks and the
pure packages use it alike. Each check returns the value, or raises ``error`` (default
``ValueError``) with a one-line message that names the argument and what is allowed.
"""
from __future__ import annotations

import argparse
import math


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
