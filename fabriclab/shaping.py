"""Link shaping with the kernel's tc: an htb class at the link rate over a byte-limited fifo.

The htb class makes a port transmit at its configured rate; the bfifo under it is the port's
egress buffer (tail drop when full), sized by the spec. Both exist on the lab's minimal kernel.
Open vSwitch's userspace datapath transmits through each port's qdisc, so this shapes switch ports
as well as host NICs. The queueing model (ECN, PFC) builds on this same tree.
"""

ETH_HEADER = 14


def burst_bytes(rate_mbps, mtu=1500):
    """An htb burst smaller than one full frame would stall the class; at lab rates 1 ms of
    traffic is often less than that, so the burst is at least two frames."""
    return max(2 * (mtu + ETH_HEADER), int(rate_mbps * 1e6 / 8 * 0.001))


def shaping_commands(intf, rate_mbps, buffer_bytes, mtu=1500):
    """tc commands (argument lists) that shape `intf` to rate_mbps with a buffer of buffer_bytes."""
    if rate_mbps <= 0:
        raise ValueError(f"{intf}: rate must be > 0 Mbit/s, got {rate_mbps}")
    frame = mtu + ETH_HEADER
    if buffer_bytes < frame:
        raise ValueError(f"{intf}: buffer must hold at least one frame ({frame} bytes), got {buffer_bytes}")
    rate = f"{rate_mbps * 1000:.0f}kbit"
    burst = str(burst_bytes(rate_mbps, mtu))
    return [
        ["tc", "qdisc", "replace", "dev", intf, "root", "handle", "1:", "htb", "default", "1"],
        ["tc", "class", "replace", "dev", intf, "parent", "1:", "classid", "1:1", "htb",
         "rate", rate, "ceil", rate, "burst", burst, "cburst", burst],
        ["tc", "qdisc", "replace", "dev", intf, "parent", "1:1", "handle", "10:", "bfifo",
         "limit", str(buffer_bytes)],
    ]


def rate_command(intf, rate_mbps, mtu=1500):
    """The tc command that changes a shaped port's rate in place (a degraded link), buffer kept."""
    if not rate_mbps > 0:
        raise ValueError(f"{intf}: rate must be > 0 Mbit/s, got {rate_mbps}")
    rate = f"{rate_mbps * 1000:.0f}kbit"
    burst = str(burst_bytes(rate_mbps, mtu))
    return ["tc", "class", "change", "dev", intf, "parent", "1:", "classid", "1:1", "htb",
            "rate", rate, "ceil", rate, "burst", burst, "cburst", burst]


def as_script(commands):
    """One shell line per command, for running many in a single round trip to a node's shell."""
    return "\n".join(" ".join(cmd) for cmd in commands)
