"""The tc commands that shape a port: htb at the link rate over a bfifo the size of the buffer,
behind a netem for the cable's delay when the spec has one.

Nothing is run; the argument lists are what Mininet's nodes and the root shell execute.
"""

import pytest

from fabriclab.system.shaping import (ETH_HEADER, GATE_LIMIT_BYTES, NETEM_LIMIT_PACKETS, burst_bytes,
                               delay_command, delay_usec, queued_commands, shaping_commands)


def option(cmd, name):
    """The value that follows `name` in a tc argument list."""
    return cmd[cmd.index(name) + 1]


def test_three_commands_root_htb_class_and_bfifo():
    root, cls, fifo = shaping_commands("l1-eth3", 10, 65536)
    assert root == ["tc", "qdisc", "replace", "dev", "l1-eth3", "root", "handle", "1:", "htb",
                    "default", "1"]
    assert cls[:9] == ["tc", "class", "replace", "dev", "l1-eth3", "parent", "1:", "classid", "1:1"]
    assert cls[9] == "htb"
    assert fifo[:9] == ["tc", "qdisc", "replace", "dev", "l1-eth3", "parent", "1:1", "handle", "10:"]
    assert fifo[9] == "bfifo"


@pytest.mark.parametrize("mbps, kbit", [
    (10, "10000kbit"),
    (2.5, "2500kbit"),
    (0.1, "100kbit"),
    (400_000, "400000000kbit"),
])
def test_htb_rate_and_ceil_in_kbit(mbps, kbit):
    cls = shaping_commands("x", mbps, 65536)[1]
    assert option(cls, "rate") == kbit
    assert option(cls, "ceil") == kbit


def test_bfifo_limit_is_the_buffer_in_bytes():
    fifo = shaping_commands("x", 10, 262144)[2]
    assert option(fifo, "limit") == "262144"


@pytest.mark.parametrize("mbps, mtu, expected", [
    (10, 1500, 2 * 1514),          # 1 ms at 10 Mbit/s is 1250 bytes: two frames win
    (10, 9000, 2 * 9014),          # jumbo frames: two of those
    (100, 1500, 12_500),           # 1 ms of 100 Mbit/s
    (1000, 1500, 125_000),
    (1000, 9000, 125_000),
    (400_000, 9000, 50_000_000),   # 1 ms of 400 Gbit/s
])
def test_burst_is_two_frames_or_one_millisecond(mbps, mtu, expected):
    assert burst_bytes(mbps, mtu) == expected


def test_burst_default_mtu_is_1500():
    assert burst_bytes(1) == 2 * (1500 + ETH_HEADER)


@pytest.mark.parametrize("mbps, mtu", [(0.5, 1500), (10, 9000), (24, 1500), (25, 1500), (200, 9216)])
def test_burst_holds_two_full_frames_and_a_millisecond(mbps, mtu):
    burst = burst_bytes(mbps, mtu)
    assert burst >= 2 * (mtu + ETH_HEADER)
    assert burst >= int(mbps * 1e6 / 8 / 1000)


def test_commands_size_burst_for_the_mtu_they_are_given():
    cls = shaping_commands("x", 10, 65536, mtu=9000)[1]
    assert option(cls, "burst") == str(2 * 9014)
    assert option(cls, "cburst") == str(2 * 9014)
    cls = shaping_commands("x", 10, 65536)[1]
    assert option(cls, "burst") == option(cls, "cburst") == str(2 * 1514)


@pytest.mark.parametrize("mbps", [0, -1, -0.001])
def test_rate_must_be_positive(mbps):
    with pytest.raises(ValueError, match=r"^l1-eth3: rate must be > 0"):
        shaping_commands("l1-eth3", mbps, 65536)


@pytest.mark.parametrize("mtu, smallest", [(1500, 1514), (9000, 9014)])
def test_buffer_must_hold_one_frame(mtu, smallest):
    expected = rf"^h1-n0: buffer must hold at least one frame \({smallest} bytes\), got {smallest - 1}$"
    with pytest.raises(ValueError, match=expected):
        shaping_commands("h1-n0", 10, smallest - 1, mtu=mtu)
    fifo = shaping_commands("h1-n0", 10, smallest, mtu=mtu)[2]
    assert option(fifo, "limit") == str(smallest)


# -- link delay: netem at the root, the shaping tree under it ---------------------------------------
def test_a_delayed_port_has_netem_at_the_root_and_the_htb_tree_under_it():
    netem, root, cls, fifo = shaping_commands("l1-eth3", 10, 65536, delay_ms=5)
    assert netem == ["tc", "qdisc", "replace", "dev", "l1-eth3", "root", "handle", "5:", "netem",
                     "delay", "5000us", "limit", str(NETEM_LIMIT_PACKETS)]
    assert root == ["tc", "qdisc", "replace", "dev", "l1-eth3", "parent", "5:1", "handle", "1:", "htb",
                    "default", "1"]
    # The class and the buffer are as without delay: the buffer holds only the queue.
    assert (cls, fifo) == tuple(shaping_commands("l1-eth3", 10, 65536)[1:])


def test_no_delay_means_no_netem():
    for delay in (0, 0.0):
        cmds = shaping_commands("x", 10, 65536, delay_ms=delay)
        assert len(cmds) == 3 and not any("netem" in c for c in cmds)


@pytest.mark.parametrize("delay_ms, usec", [(5, 5000), (0.25, 250), (1.2345, 1234), (0.0001, 1), (40, 40000)])
def test_netem_delay_is_whole_microseconds_and_never_rounds_to_nothing(delay_ms, usec):
    assert delay_usec(delay_ms) == usec
    assert option(delay_command("x", delay_ms), "delay") == f"{usec}us"


def test_netem_limit_never_drops_before_the_buffers_do():
    # Every packet a port can hold behind the delay: its largest buffer (the pause gate's backstop)
    # in minimum-size frames.
    assert NETEM_LIMIT_PACKETS > GATE_LIMIT_BYTES // 64


def test_delay_command_refuses_no_delay():
    with pytest.raises(ValueError, match="delay must be > 0"):
        delay_command("x", 0)


def test_the_queue_models_tree_hangs_under_netem_too():
    cmds = queued_commands("s1-eth1", 20, 65536, 9000, delay_ms=2.5)
    assert cmds[0][5:10] == ["root", "handle", "5:", "netem", "delay"] and option(cmds[0], "delay") == "2500us"
    assert cmds[1][5:11] == ["parent", "5:1", "handle", "1:", "htb", "default"] and cmds[1][-1] == "30"
    # Everything below the htb root is the same tree as without delay (the gate at 1:10 included).
    assert cmds[2:] == queued_commands("s1-eth1", 20, 65536, 9000)[1:]
    assert any(c[5:10] == ["parent", "1:10", "handle", "10:", "tbf"] for c in cmds)
