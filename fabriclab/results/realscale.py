"""The factor from a results document's lab time to the real hardware's its spec stands for, and
the `#` line that says which the numbers are: what the text formats that other tools' parsers read
(nccl-tests', perftest's) print above their rows."""

from __future__ import annotations


def real_scale(doc):
    """(factor from the lab's time to the printed one, [the `#` line that says so])."""
    scale = doc["scale"]
    rate = f"lab links {scale['host_rate_mbps']:g} Mbit/s"
    time_scale = scale.get("time_scale")
    if not time_scale:
        return 1.0, [f"# fabriclab: {rate}, no time scale: times and bandwidths below are the lab's own"]
    real = scale.get("real_host_rate_mbps") or scale["host_rate_mbps"] * time_scale
    return time_scale, [f"# fabriclab: {rate} at time scale x{time_scale:g}: times and bandwidths "
                        f"below are the real {_rate(real)} hardware's"]


def _rate(mbps):
    return f"{mbps / 1000:g} Gbit/s" if mbps >= 1000 else f"{mbps:g} Mbit/s"
