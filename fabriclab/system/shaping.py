"""Link shaping with the kernel's tc: an htb class at the link rate over a byte-limited fifo.

The htb class makes a port transmit at its configured rate; the bfifo under it is the port's
egress buffer (tail drop when full), sized by the spec. Both exist on the lab's minimal kernel.
Open vSwitch's userspace datapath transmits through each port's qdisc, so this shapes switch ports
as well as host NICs. The queueing model (ECN, PFC) builds on this same tree.

A link's propagation delay (the spec's `delay:`, where the kernel has netem) is a netem qdisc at the
root of each end's port, with the shaping tree as its child: a packet waits out the delay, then
queues for the link. Every qdisc enqueues at arrival, so no place in a port's tree can hold a packet
*after* its serialisation; but a constant delay in front of a FIFO at a constant rate gives the far
end the same arrival times as the same delay on the wire behind it, and the buffer (the fifo under
htb) still holds only the queue. docs/queues.md says what this means for the queue model's counts.
"""

ETH_HEADER = 14
NETEM_HANDLE = "5:"
# netem's limit counts packets (its delay line and, on some kernels, its child's queue too): far
# above anything the buffers under it hold (the pause gate's 64 MiB backstop in minimum frames),
# so only those buffers ever drop.
NETEM_LIMIT_PACKETS = 1 << 21


def burst_bytes(rate_mbps, mtu=1500):
    """An htb burst smaller than one full frame would stall the class; at lab rates 1 ms of
    traffic is often less than that, so the burst is at least two frames."""
    return max(2 * (mtu + ETH_HEADER), int(rate_mbps * 1e6 / 8 * 0.001))


def delay_usec(delay_ms):
    """A lab delay as netem's whole microseconds (at least 1 for any delay at all)."""
    if not delay_ms > 0:
        return 0
    return max(1, round(delay_ms * 1000))


def delay_command(intf, delay_ms):
    """The root netem that delays everything `intf` sends by delay_ms (the htb tree goes under it)."""
    usec = delay_usec(delay_ms)
    if not usec:
        raise ValueError(f"{intf}: delay must be > 0 ms, got {delay_ms!r}")
    return ["tc", "qdisc", "replace", "dev", intf, "root", "handle", NETEM_HANDLE, "netem",
            "delay", f"{usec}us", "limit", str(NETEM_LIMIT_PACKETS)]


def delay_change_command(intf, delay_ms):
    """The same root netem with another delay, changed in place (a latency fault): its child, the
    shaping tree with what it queues, stays as it is."""
    return ["tc", "qdisc", "change", *delay_command(intf, delay_ms)[3:]]


def _root(intf, delay_ms):
    """Where the htb tree hangs: the port's root, or under the netem that delays the port."""
    if not delay_usec(delay_ms):
        return [], ["root"]
    return [delay_command(intf, delay_ms)], ["parent", f"{NETEM_HANDLE}1"]


def shaping_commands(intf, rate_mbps, buffer_bytes, mtu=1500, delay_ms=0.0):
    """tc commands (argument lists) that shape `intf` to rate_mbps with a buffer of buffer_bytes,
    behind a netem delay of delay_ms when it is > 0."""
    if rate_mbps <= 0:
        raise ValueError(f"{intf}: rate must be > 0 Mbit/s, got {rate_mbps}")
    frame = mtu + ETH_HEADER
    if buffer_bytes < frame:
        raise ValueError(f"{intf}: buffer must hold at least one frame ({frame} bytes), got {buffer_bytes}")
    rate = f"{rate_mbps * 1000:.0f}kbit"
    burst = str(burst_bytes(rate_mbps, mtu))
    delay, root = _root(intf, delay_ms)
    return delay + [
        ["tc", "qdisc", "replace", "dev", intf, *root, "handle", "1:", "htb", "default", "1"],
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


# -- the queue model's tree ---------------------------------------------------------------------
# htb classes (minor numbers are what the eBPF classifier writes into skb->priority):
#   1:1  the link rate
#   1:20 control   prio 0: strict priority for CNP/CTS/ACK
#   1:10 lossless  prio 1, behind a tbf pause gate (10:)
#   1:30 lossy     prio 1, shares with lossless by DRR; htb's default for what is not IPv4
# The classes' ceilings sit above the link so that changing 1:1 (rate_command) is enough.
# Each class is guaranteed 1% of the link and borrows the rest in priority order. The fifos are
# backstops sized above what the model admits: the eBPF program does the tail drop and PFC.
GATE_LIMIT_BYTES = 64 * 2**20


def gate_settings(rate_mbps, mtu=1500):
    """(open rate in bytes/s, open burst, closed burst, fifo limit) of a port's pause gate. Open, the
    gate is far faster than the link so htb alone shapes; closed, it lets one frame finish."""
    frame = mtu + ETH_HEADER
    return int(rate_mbps * 1e6 / 8 * 10), max(64 * 1024, 8 * frame), frame, GATE_LIMIT_BYTES


def queued_commands(intf, rate_mbps, buffer_bytes, mtu=1500, delay_ms=0.0):
    """tc commands building the queue model's per-port tree on `intf` (see above), behind a netem
    delay of delay_ms when it is > 0. On switch ports where the kernel has RED, the queue model
    grafts RED qdiscs into the lossless and lossy classes when it starts (queues/red.py)."""
    base = shaping_commands(intf, rate_mbps, buffer_bytes, mtu, delay_ms)[:-1]
    base[-2][-1] = "30"                                  # htb default: the lossy class
    frame = mtu + ETH_HEADER
    burst = str(burst_bytes(rate_mbps, mtu))
    floor = f"{max(8, rate_mbps * 10):.0f}kbit"           # 1% of the link, in kbit
    ceil = f"{rate_mbps * 10000:.0f}kbit"                 
    open_rate, open_burst, _, limit = gate_settings(rate_mbps, mtu)
    cmds = list(base)
    for minor, prio in (("20", "0"), ("10", "1"), ("30", "1")):
        cmds.append(["tc", "class", "replace", "dev", intf, "parent", "1:1", "classid", f"1:{minor}", "htb",
                     "rate", floor, "ceil", ceil, "burst", burst, "cburst", burst, "prio", prio,
                     "quantum", str(frame)])
    cmds += [
        ["tc", "qdisc", "replace", "dev", intf, "parent", "1:10", "handle", "10:", "tbf",
         "rate", f"{open_rate * 8}bit", "burst", str(open_burst), "limit", str(limit)],
        ["tc", "qdisc", "replace", "dev", intf, "parent", "1:20", "handle", "20:", "bfifo",
         "limit", str(buffer_bytes + 2 * frame)],
        ["tc", "qdisc", "replace", "dev", intf, "parent", "1:30", "handle", "30:", "bfifo",
         "limit", str(buffer_bytes + 2 * frame)],
    ]
    return cmds
