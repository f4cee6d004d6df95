"""Byte sizes as people type and read them: 64K, 1M, 1G (powers of two, as nccl-tests prints)."""

from __future__ import annotations

import re

from fabriclab.errors import LabError, SpecError
from fabriclab.loading import excerpt

_SIZE = re.compile(r"^\s*([0-9]+)\s*([KMG]?)B?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}
# Buffer sizes in specs: bytes, or decimal (kb, mb) and binary (kib, mib) units.
_BUFFER_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(b|kb|kib|mb|mib|gb|gib)\s*$|^\s*([0-9]+)\s*$", re.IGNORECASE)
_BUFFER_UNIT_BYTES = {"": 1, "b": 1, "kb": 1000, "kib": 1024, "mb": 10**6, "mib": 2**20,
                      "gb": 10**9, "gib": 2**30}


def parse_size(text):
    m = _SIZE.match(text)
    if not m or int(m.group(1)) <= 0:
        raise LabError(f"bad size {excerpt(text.strip())}: expected e.g. 4096, 64K, 1M, 1G (powers of 2)")
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


def parse_size_bytes(value, where):
    """A buffer size: a number of bytes or a string such as '64KiB', '1MB'."""
    if isinstance(value, bool):
        raise SpecError(f"{where}: size must be bytes or a string like '64KiB', got {excerpt(value)}")
    if isinstance(value, int):
        size = value
    elif isinstance(value, float) and value.is_integer():
        size = int(value)
    elif isinstance(value, str) and (m := _BUFFER_SIZE.match(value)):
        size = int(m.group(3)) if m.group(3) else int(float(m.group(1)) * _BUFFER_UNIT_BYTES[m.group(2).lower()])
    else:
        raise SpecError(f"{where}: size must be bytes or a string like '64KiB', got {excerpt(value)}")
    if size <= 0:
        raise SpecError(f"{where}: size must be > 0, got {excerpt(value)}")
    return size
