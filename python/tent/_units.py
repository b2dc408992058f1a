"""Byte sizes on the command line (``64M``, ``4KiB``) and in output
(``64 MiB``): shared by ``python -m tent`` (tent._cli) and ``tent-bench``
(tent._bench). It imports nothing that loads libtent.so."""

from __future__ import annotations

import argparse
import math

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
          "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}


def parse_size(text: str) -> int:
    t = text.strip().lower()
    num = t.rstrip("kmgib")
    unit = t[len(num):]
    if unit not in _UNITS:
        raise argparse.ArgumentTypeError(f"bad size {text!r}")
    try:
        value = int(float(num) * _UNITS[unit])
    except (ValueError, OverflowError):  # "nan", "inf"
        raise argparse.ArgumentTypeError(f"bad size {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"size must be positive: {text!r}")
    return value


def parse_seconds(text: str) -> float:
    """A finite, non-negative number of seconds (argparse type): "nan" or
    "inf" would make a loop run forever or a deadline meaningless."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad number of seconds {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"seconds must be finite and >= 0: {text!r}")
    return value


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.4g} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover
