"""Link shaping with the kernel's tc: an htb class at the link rate over a byte-limited fifo.

The htb class makes a port transmit at its configured rate; the bfifo under it is the port's
egress buffer (tail drop when full), sized by the spec. Both exist on the lab's minimal kernel.
Open vSwitch's userspace datapath transmits through each port's qdisc, so this shapes switch ports
as well as host NICs. The queueing model (ECN, PFC) builds on this same tree.
"""

# An htb burst smaller than one full frame would stall the class; at lab rates 1 ms of
# traffic is often less than that, so the burst is at least two frames.
MIN_BURST_BYTES = 2 * 1514


def burst_bytes(rate_mbps):
    return max(MIN_BURST_BYTES, int(rate_mbps * 1e6 / 8 * 0.001))


def shaping_commands(intf, rate_mbps, buffer_bytes):
    """tc commands (argument lists) that shape `intf` to rate_mbps with a buffer of buffer_bytes."""
    if rate_mbps <= 0:
        raise ValueError(f"{intf}: rate must be > 0 Mbit/s, got {rate_mbps}")
    if buffer_bytes < 1514:
        raise ValueError(f"{intf}: buffer must hold at least one frame (1514 bytes), got {buffer_bytes}")
    rate = f"{rate_mbps * 1000:.0f}kbit"
    return [
        ["tc", "qdisc", "replace", "dev", intf, "root", "handle", "1:", "htb", "default", "1"],
        ["tc", "class", "replace", "dev", intf, "parent", "1:", "classid", "1:1", "htb",
         "rate", rate, "ceil", rate, "burst", str(burst_bytes(rate_mbps)),
         "cburst", str(burst_bytes(rate_mbps))],
        ["tc", "qdisc", "replace", "dev", intf, "parent", "1:1", "handle", "10:", "bfifo",
         "limit", str(buffer_bytes)],
    ]


def as_script(commands):
    """One shell line per command, for running many in a single round trip to a node's shell."""
    return "\n".join(" ".join(cmd) for cmd in commands)
