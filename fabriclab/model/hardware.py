"""Hardware profiles (YAML files) and the data-path chain from GPU memory to the wire.

A profile describes one node: ranks (GPUs, or GPU tiles) per node, the scale-up fabric between
them, the NICs, and the chain of hops data crosses from GPU memory to the network (PCIe, NIC,
wire), each with its bandwidth and the share of it that is achievable. The scale-out bandwidth a
rank really gets is the slowest hop of that chain, divided among the ranks sharing the NICs, and
reduced further by any staging copies through host memory (they cross PCIe again, serially).

Staging is charged one of two ways (`staging_mode`):
- `per-byte` (the default): every byte a rank sends through the fabric is also copied through host
  memory, so the copies lower the rank's scale-out bandwidth; the cost grows with what it sends.
- `whole-buffer`: each rank copies its whole buffer to host memory and back once per phase of the
  collective, as projections of non-GPUDirect scale-out often assume: a fixed term per phase, the
  same for 2 nodes or 2,000, on top of a scale-out bandwidth the copies do not lower.
"""

from __future__ import annotations

import pathlib
import re
from dataclasses import dataclass


from fabriclab.errors import LabError
from fabriclab.model.collectives import Tier
from fabriclab.loading import clip, excerpt, fields, is_file, load_yaml, number, whole

PROFILE_DIR = pathlib.Path(__file__).resolve().parent / "profiles"

# Bytes are 'B/s' ('450GB/s'); bits are 'bit' or 'bit/s' ('400Gbit'). 'bps' and 'b/s' are refused:
# which one they mean depends on who wrote them, and a factor of 8 is not a rounding error.
_BW = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kKMGT]?)(B/s|bit/s|bit)\s*$")
MAX_BANDWIDTH = 8e14               # bits/s before the /8: 100 TB/s, beyond any link built
_SCALE = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def parse_bandwidth(value, where):
    """'450GB/s' (bytes) or '400Gbit' (bits) -> bytes per second."""
    m = _BW.match(value) if isinstance(value, str) else None
    if not m:
        raise LabError(f"{where}: bandwidth must look like '450GB/s' (bytes) or '400Gbit' (bits), "
                       f"got {excerpt(value)}")
    number = float(m.group(1)) * _SCALE[m.group(2)]
    if not 0 < number <= MAX_BANDWIDTH:
        raise LabError(f"{where}: bandwidth must be > 0 and at most 100 TB/s, got {excerpt(value)}")
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
    staging_mode: str = "per-byte"   # how they are charged: per-byte | whole-buffer (see above)

    def scale_out_bandwidth(self, staging_mode=None):
        """Bytes/s one rank moves through the fabric: slowest hop, shared NICs, and per-byte
        staging copies (`staging_mode`: this profile's unless given)."""
        nic_share = self.nic.achievable * self.nics_per_node / self.ranks_per_node
        hops = [h.achievable for h in self.datapath] + [nic_share]
        pipelined = min(hops)
        if (staging_mode or self.staging_mode) == "per-byte" and self.staging_copies and self.datapath:
            # Each staging copy crosses the first hop again, not overlapped with the rest.
            return 1 / (1 / pipelined + self.staging_copies / self.datapath[0].achievable)
        return pipelined

    def bottleneck(self):
        nic_share = self.nic.achievable * self.nics_per_node / self.ranks_per_node
        hops = [(h.achievable, h.name) for h in self.datapath] + [(nic_share, self.nic.name)]
        return min(hops)[1]

    def tiers(self, staging_mode=None):
        return (Tier(self.scale_up_latency, self.scale_up.achievable),
                Tier(self.scale_out_latency, self.scale_out_bandwidth(staging_mode)))

    def staging_seconds(self, buffer_bytes, phases, staging_mode=None):
        """Whole-buffer staging: each copy takes the buffer to host memory and back over the
        first hop, once per phase; 0 in per-byte mode (charged in the bandwidth instead)."""
        if (staging_mode or self.staging_mode) != "whole-buffer" or not (self.staging_copies and self.datapath):
            return 0.0
        return phases * self.staging_copies * 2 * buffer_bytes / self.datapath[0].achievable


HOP_KEYS = ("name", "bandwidth", "efficiency")
PROFILE_KEYS = ("name", "description", "ranks_per_node", "scale_up", "scale_out", "datapath",
                "staging_copies", "staging_mode", "notes")
STAGING_MODES = ("per-byte", "whole-buffer")


def _hop(data, where, extra=()):
    fields(data, where, HOP_KEYS + extra, required=("name", "bandwidth"))
    eff = number(data.get("efficiency", 1.0), f"{where}: efficiency", 0, 1, low_open=True)
    if not isinstance(data["name"], str):
        raise LabError(f"{where}: name must be a string, got {excerpt(data['name'])}")
    return Hop(data["name"], parse_bandwidth(data["bandwidth"], f"{where}.bandwidth"), float(eff))


def _latency_s(data, where):
    """A hop's latency: microseconds, more than 0 and at most one second."""
    return number(data.get("latency_us"), f"{where}: latency_us", 0, 1e6, low_open=True) * 1e-6


def load_profile(name_or_path):
    path = pathlib.Path(name_or_path)
    if not is_file(path):
        path = PROFILE_DIR / f"{name_or_path}.yaml"
        if "/" in str(name_or_path) or not is_file(path):
            raise LabError(f"no hardware profile {excerpt(str(name_or_path))} (shipped: "
                           f"{', '.join(shipped_profiles())})")
    where = f"profile {clip(path.stem, 40)}"
    data = fields(load_yaml(path, "profile"), where, PROFILE_KEYS)
    ranks = whole(data.get("ranks_per_node"), f"{where}: ranks_per_node", 1, 1024)
    up = fields(data.get("scale_up"), f"{where}: scale_up", HOP_KEYS + ("latency_us",))
    out = fields(data.get("scale_out"), f"{where}: scale_out", HOP_KEYS + ("latency_us", "nics_per_node"))
    datapath = data.get("datapath") or []
    if not isinstance(datapath, list) or len(datapath) > 16:
        raise LabError(f"{where}: datapath must be a list of at most 16 hops, got {excerpt(datapath)}")
    for key in ("name", "description", "notes"):
        if key in data and not isinstance(data[key], str):
            raise LabError(f"{where}: {key} must be a string, got {excerpt(data[key])}")
    return Profile(
        name=data.get("name", path.stem),
        description=data.get("description", ""),
        ranks_per_node=ranks,
        scale_up=_hop(up, f"{where}: scale_up", ("latency_us",)),
        scale_up_latency=_latency_s(up, f"{where}: scale_up"),
        nics_per_node=whole(out.get("nics_per_node"), f"{where}: scale_out: nics_per_node", 1, 64),
        nic=_hop(out, f"{where}: scale_out", ("latency_us", "nics_per_node")),
        scale_out_latency=_latency_s(out, f"{where}: scale_out"),
        datapath=tuple(_hop(h, f"{where}: datapath[{i}]") for i, h in enumerate(datapath)),
        staging_copies=whole(data.get("staging_copies", 0), f"{where}: staging_copies", 0, 8),
        staging_mode=_staging_mode(data.get("staging_mode", "per-byte"), where),
    )


def _staging_mode(value, where):
    if value not in STAGING_MODES:
        raise LabError(f"{where}: staging_mode must be {' or '.join(STAGING_MODES)}, got {excerpt(value)}")
    return value


def shipped_profiles():
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))
