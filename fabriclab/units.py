"""Byte sizes as people type and read them: 64K, 1M, 1G (powers of two, as nccl-tests prints)."""

from __future__ import annotations

import re

from fabriclab.errors import LabError

_SIZE = re.compile(r"^\s*([0-9]+)\s*([KMG]?)B?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def parse_size(text):
    m = _SIZE.match(text)
    if not m or int(m.group(1)) <= 0:
        raise LabError(f"bad size {text.strip()!r}: expected e.g. 4096, 64K, 1M, 1G (powers of 2)")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def parse_sizes(text):
    """'64K,1M' -> [65536, 1048576]."""
    return [parse_size(item) for item in text.split(",")]


def human_size(size):
    """1048576 -> '1M'; sizes that are not whole units print in bytes."""
    for unit, scale in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return f"{size}B" if size < 1024 else f"{size / 1024:.1f}K"
