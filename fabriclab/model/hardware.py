"""Hardware profiles (YAML files) and the data-path chain from GPU memory to the wire.

A profile describes one node: ranks (GPUs, or GPU tiles) per node, the scale-up fabric between
them, the NICs, and the chain of hops data crosses from GPU memory to the network (PCIe, NIC,
wire), each with its bandwidth and the share of it that is achievable. The scale-out bandwidth a
rank really gets is the slowest hop of that chain, divided among the ranks sharing the NICs, and
reduced further by any staging copies through host memory (they cross PCIe again, serially).
"""

from __future__ import annotations

import pathlib
import re
from dataclasses import dataclass

import yaml

from fabriclab.errors import LabError
from fabriclab.model.collectives import Tier

PROFILE_DIR = pathlib.Path(__file__).resolve().parent / "profiles"

# Bytes are 'B/s' ('450GB/s'); bits are 'bit' or 'bit/s' ('400Gbit'). 'bps' and 'b/s' are refused:
# which one they mean depends on who wrote them, and a factor of 8 is not a rounding error.
_BW = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kKMGT]?)(B/s|bit/s|bit)\s*$")
_SCALE = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def parse_bandwidth(value, where):
    """'450GB/s' (bytes) or '400Gbit' (bits) -> bytes per second."""
    m = _BW.match(value) if isinstance(value, str) else None
    if not m:
        raise LabError(f"{where}: bandwidth must look like '450GB/s' (bytes) or '400Gbit' (bits), "
                       f"got {value!r}")
    number = float(m.group(1)) * _SCALE[m.group(2)]
    if number <= 0:
        raise LabError(f"{where}: bandwidth must be > 0, got {value!r}")
    return number if m.group(3) == "B/s" else number / 8


@dataclass(frozen=True)
class Hop:
    name: str
    bandwidth: float      # bytes/s, one direction
    efficiency: float     # achievable share of it

    @property
    def achievable(self):
        return self.bandwidth * self.efficiency


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    ranks_per_node: int
    scale_up: Hop
    scale_up_latency: float          # seconds per step
    nics_per_node: int
    nic: Hop
    scale_out_latency: float
    datapath: tuple                  # Hops between GPU memory and the NIC (e.g. PCIe)
    staging_copies: int = 0          # extra copies through host memory over the first hop

    def scale_out_bandwidth(self):
        """Bytes/s one rank moves through the fabric: slowest hop, shared NICs, staging copies."""
        nic_share = self.nic.achievable * self.nics_per_node / self.ranks_per_node
        hops = [h.achievable for h in self.datapath] + [nic_share]
        pipelined = min(hops)
        if self.staging_copies and self.datapath:
            # Each staging copy crosses the first hop again, not overlapped with the rest.
            return 1 / (1 / pipelined + self.staging_copies / self.datapath[0].achievable)
        return pipelined

    def bottleneck(self):
        nic_share = self.nic.achievable * self.nics_per_node / self.ranks_per_node
        hops = [(h.achievable, h.name) for h in self.datapath] + [(nic_share, self.nic.name)]
        return min(hops)[1]

    def tiers(self):
        return (Tier(self.scale_up_latency, self.scale_up.achievable),
                Tier(self.scale_out_latency, self.scale_out_bandwidth()))


def _hop(data, where):
    if not isinstance(data, dict) or "name" not in data or "bandwidth" not in data:
        raise LabError(f"{where}: needs name and bandwidth")
    eff = data.get("efficiency", 1.0)
    if not isinstance(eff, (int, float)) or not 0 < eff <= 1:
        raise LabError(f"{where}: efficiency must be in (0, 1], got {eff!r}")
    return Hop(str(data["name"]), parse_bandwidth(data["bandwidth"], f"{where}.bandwidth"), float(eff))


def _positive(data, key, where, kind=float):
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0 \
            or (kind is int and not isinstance(value, int)):
        raise LabError(f"{where}: {key} must be a positive {'whole ' if kind is int else ''}number, "
                       f"got {value!r}")
    return kind(value)


def load_profile(name_or_path):
    path = pathlib.Path(name_or_path)
    if not path.exists():
        path = PROFILE_DIR / f"{name_or_path}.yaml"
        if not path.exists():
            raise LabError(f"no hardware profile {str(name_or_path)!r} (shipped: "
                           f"{', '.join(shipped_profiles())})")
    data = yaml.safe_load(path.read_text())
    where = f"profile {path.stem}"
    if not isinstance(data, dict):
        raise LabError(f"{where}: must be a mapping")
    known = {"name", "description", "ranks_per_node", "scale_up", "scale_out", "datapath",
             "staging_copies", "notes"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise LabError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")
    up, out = data.get("scale_up") or {}, data.get("scale_out") or {}
    staging = data.get("staging_copies", 0)
    if isinstance(staging, bool) or not isinstance(staging, int) or staging < 0:
        raise LabError(f"{where}: staging_copies must be a whole number >= 0, got {staging!r}")
    return Profile(
        name=str(data.get("name", path.stem)),
        description=str(data.get("description", "")),
        ranks_per_node=_positive(data, "ranks_per_node", where, int),
        scale_up=_hop(up, f"{where}: scale_up"),
        scale_up_latency=_positive(up, "latency_us", f"{where}: scale_up") * 1e-6,
        nics_per_node=_positive(out, "nics_per_node", f"{where}: scale_out", int),
        nic=_hop(out, f"{where}: scale_out"),
        scale_out_latency=_positive(out, "latency_us", f"{where}: scale_out") * 1e-6,
        datapath=tuple(_hop(h, f"{where}: datapath[{i}]") for i, h in enumerate(data.get("datapath") or [])),
        staging_copies=staging,
    )


def shipped_profiles():
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))
