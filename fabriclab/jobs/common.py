"""What several job kinds share: a record's hosts and invalid reasons, a scenario entry's fields
turned into a workload dataclass, and the cells their tables print."""

from __future__ import annotations

import dataclasses

from fabriclab.errors import LabError
from fabriclab.loading import excerpt
from fabriclab.units import human_size, parse_size, parse_sizes

# Every kind's scenario entry also takes these; the scenario loader reads them before the kind's fields.
COMMON_FIELDS = ("name", "role", "kind")
CPU_SATURATED = "CPU saturated: the software switches, not the fabric, may have set the numbers"


def hosts_record(names):
    """A job's hosts in the order people count them: h2 before h10."""
    return sorted(names, key=lambda h: (len(h), h))


def invalid_reasons(cpu_valid, verify=None):
    """Why a record's numbers are not to be trusted ([] when they are)."""
    reasons = [] if cpu_valid else [CPU_SATURATED]
    if verify is not None and not verify.get("ok", True):
        reasons.append("verification failed: an output differs from the expected values")
    return reasons


def refuse_unknown(entry, fields, kind):
    """LabError naming the first field of `entry` outside `fields`."""
    unknown = sorted(set(entry) - set(fields))
    if unknown:
        raise LabError(f"unknown field {excerpt(unknown[0])} (a {kind} job takes {', '.join(COMMON_FIELDS)} and: "
                       f"{', '.join(sorted(fields))})")


def host_list(value, key):
    """`h1,h2` or [h1, h2] as a tuple of host names; None stays None."""
    if value is None:
        return None
    if isinstance(value, str):
        return tuple(h.strip() for h in value.split(",") if h.strip())
    if isinstance(value, (list, tuple)) and all(isinstance(h, str) for h in value):
        return tuple(value)
    raise LabError(f"{key} must be a list of host names or \"h1,h2\", got {excerpt(value)}")


def dataclass_workload(cls, kind, entry, texts=(), check=None):
    """`cls(**entry)` for a scenario job, then `check(spec)`: unknown fields refused, sizes and byte
    counts given as text (`1M`, `64K,1M`) parsed, host lists given as `h1,h2` split. `texts` are the
    fields that are text by nature (a wrong type is blamed on another one)."""
    fields = {f.name for f in dataclasses.fields(cls)}
    refuse_unknown(entry, fields, kind)
    entry = dict(entry)
    if "sizes" in entry:
        sizes = entry["sizes"]
        sizes = parse_sizes(sizes) if isinstance(sizes, str) else \
            [parse_size(s) if isinstance(s, str) else s for s in (sizes if isinstance(sizes, list) else [sizes])]
        entry["sizes"] = tuple(sizes)
    for key in ("chunk_bytes", "piece_bytes"):
        if isinstance(entry.get(key), str):
            entry[key] = parse_size(entry[key])
    for key in ("hosts", "workers", "aggregators"):
        if key in entry:
            entry[key] = host_list(entry[key], key)
    try:
        spec = cls(**entry)
        if check is not None:
            check(spec)
        return spec
    except (TypeError, ValueError):
        bad = next((k for k, v in entry.items() if isinstance(v, str) and k not in texts), "a field")
        raise LabError(f"{bad} has the wrong type: {excerpt(entry.get(bad))}") from None


def size_cell(size):
    """A byte count as the tables show it: 64K."""
    return human_size(size) if isinstance(size, int) and size > 0 else size


def yes_no(ok):
    return "yes" if ok else "NO"
