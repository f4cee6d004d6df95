"""The one counter reader, on a temporary directory laid out like /sys/class/net and a fake tc:
no root, no network. Its users (snapshot, the port sampler, top) are run against the same files."""

import io
import json
import os
import re
import shutil
import types

import pytest

from fabriclab.cli import top
from fabriclab.errors import LabError
from fabriclab.measure import telemetry
from fabriclab.measure.counters import COUNTERS, PortCounters, parse_qdisc_drops, qdisc_drops, read_counters
from fabriclab.measure.portsampler import ColumnReader, PortSampler, columns
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import load_spec


def set_counter(sys_net, intf, counter, value):
    stats = sys_net / intf / "statistics"
    stats.mkdir(parents=True, exist_ok=True)
    # Rewritten in place (an open fd sees it) and never empty: sysfs reads are atomic, and a
    # sampler thread reading between a truncate and the write would see no number at all.
    # Write, then cut to length: the tests only ever raise a counter.
    data = f"{value}\n".encode()
    fd = os.open(stats / counter, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


def set_port(sys_net, intf, base=0):
    """Every snapshot counter of `intf`, each a different number so a mix-up shows."""
    for i, counter in enumerate(COUNTERS):
        set_counter(sys_net, intf, counter, base + i)


def unreadable(sys_net, intf, counter):
    """A counter that opens but cannot be read: a directory here, as a sysfs file answers ENODEV
    once its veth is deleted."""
    (sys_net / intf / "statistics" / counter).mkdir(parents=True)


def open_fds():
    return len(os.listdir("/proc/self/fd"))


def fake_tc(tmp_path, qdiscs):
    """A tc command whose output is `qdiscs` (a list is written as JSON, a string as is)."""
    out = tmp_path / "tc.json"
    out.write_text(qdiscs if isinstance(qdiscs, str) else json.dumps(qdiscs))
    return ("cat", str(out))


# -- PortCounters ---------------------------------------------------------------------------------

def test_reads_pairs_in_order_and_rereads_changed_values(tmp_path):
    set_counter(tmp_path, "l1-eth2", "tx_bytes", 1000)
    set_counter(tmp_path, "l1-eth1", "rx_bytes", 7)
    with PortCounters([("l1-eth2", "tx_bytes"), ("l1-eth1", "rx_bytes")], tmp_path) as counters:
        assert counters.missing == []
        assert counters.read() == [1000, 7]
        set_counter(tmp_path, "l1-eth2", "tx_bytes", 18_446_744_073_709_551_615)     # 2**64 - 1
        assert counters.read() == [18_446_744_073_709_551_615, 7]


def test_missing_and_unreadable_counters_read_as_none(tmp_path):
    set_port(tmp_path, "l1-eth1", 100)
    unreadable(tmp_path, "l1-eth3", "tx_bytes")
    set_counter(tmp_path, "l1-eth3", "rx_bytes", 5)
    pairs = [("l1-eth1", "tx_bytes"), ("gone-eth1", "tx_bytes"), ("l1-eth3", "tx_bytes"),
             ("l1-eth3", "rx_bytes"), ("l1-eth1", "no_such_counter")]
    with PortCounters(pairs, tmp_path) as counters:
        assert counters.missing == ["gone-eth1", "l1-eth1"]
        assert counters.read() == [100, None, None, 5, None]


def test_by_interface_leaves_out_ports_with_a_counter_unread(tmp_path):
    set_port(tmp_path, "l1-eth1", 100)
    set_port(tmp_path, "l1-eth2", 200)
    unreadable(tmp_path, "l1-eth3", "rx_bytes")
    set_counter(tmp_path, "l1-eth3", "tx_bytes", 9)
    pairs = [(intf, c) for intf in ("l1-eth1", "l1-eth2", "l1-eth3", "gone") for c in ("tx_bytes", "rx_bytes")]
    with PortCounters(pairs, tmp_path) as counters:
        assert counters.by_interface() == {"l1-eth1": {"tx_bytes": 100, "rx_bytes": 101},
                                           "l1-eth2": {"tx_bytes": 200, "rx_bytes": 201}}


def test_close_releases_every_descriptor_and_refuses_reads(tmp_path):
    for i in range(20):
        set_port(tmp_path, f"s1-eth{i}")
    pairs = [(f"s1-eth{i}", c) for i in range(25) for c in COUNTERS]       # 5 ports missing
    before = open_fds()
    counters = PortCounters(pairs, tmp_path)
    assert open_fds() == before + 20 * len(COUNTERS)
    counters.close()
    counters.close()                                   # twice is harmless
    assert open_fds() == before
    with pytest.raises(ValueError):
        counters.read()


def test_read_counters_reads_once_and_skips_missing(tmp_path):
    set_port(tmp_path, "l1-eth2", 1000)
    before = open_fds()
    assert read_counters(["l1-eth2", "gone-eth1"], sys_net=tmp_path) == {
        "l1-eth2": {name: 1000 + i for i, name in enumerate(COUNTERS)}}
    assert read_counters(["l1-eth2"], ("rx_packets",), tmp_path) == {"l1-eth2": {"rx_packets": 1003}}
    assert open_fds() == before


# -- tc's drop counters ---------------------------------------------------------------------------

QDISCS = [
    {"kind": "htb", "handle": "1:", "dev": "l1-eth2", "drops": 99},
    {"kind": "bfifo", "handle": "10:", "parent": "1:1", "dev": "l1-eth2", "drops": 5},
    {"kind": "bfifo", "handle": "10:", "parent": "1:1", "dev": "s1-eth1", "drops": 0},
    {"kind": "bfifo", "handle": "10:", "parent": "1:1", "dev": "eth0", "drops": 7},
]


def test_qdisc_drops_counts_only_the_bfifo_of_wanted_ports(tmp_path):
    wanted = ["l1-eth2", "s1-eth1", "s2-eth1"]
    assert parse_qdisc_drops(json.dumps(QDISCS), wanted) == {"l1-eth2": 5, "s1-eth1": 0}
    assert qdisc_drops(wanted, fake_tc(tmp_path, QDISCS)) == {"l1-eth2": 5, "s1-eth1": 0}


@pytest.mark.parametrize("stdout", ["", "not json"])
def test_qdisc_drops_without_readable_output_is_empty(tmp_path, stdout):
    assert qdisc_drops(["l1-eth2"], fake_tc(tmp_path, stdout)) == {}


# -- snapshot -------------------------------------------------------------------------------------

def test_snapshot_of_a_fabric_reads_every_switch_port(tmp_path):
    fabric = Fabric(load_spec("tiny"))
    ports = [intf for s in fabric.switches for intf in fabric.switch_ports(s).values()]
    for i, intf in enumerate(ports[1:]):              # the first port is missing
        set_port(tmp_path, intf, 1000 * i)
    tc = fake_tc(tmp_path, [{"kind": "bfifo", "dev": ports[1], "drops": 3}])
    snap = telemetry.snapshot(fabric, sys_net=tmp_path, tc=tc)
    assert set(snap) == {"time", "counters", "drops", "cpu"}
    assert set(snap["counters"]) == set(ports[1:])
    assert snap["counters"][ports[2]] == {name: 1000 + i for i, name in enumerate(COUNTERS)}
    assert snap["drops"] == {ports[1]: 3}


# -- the port sampler -----------------------------------------------------------------------------

def tiny_sysfs(sys_net):
    fabric = Fabric(load_spec("tiny"))
    for c in columns(fabric):
        set_counter(sys_net, c.intf, c.counter, 0)
    return fabric


def test_port_sampler_reads_the_columns_until_stopped(tmp_path):
    fabric = tiny_sysfs(tmp_path)
    set_counter(tmp_path, "l1-eth1", "rx_bytes", 500)              # what h1's NIC sent
    before = open_fds()
    sampler = PortSampler(fabric, interval_s=0.001, sys_net=tmp_path).start()
    set_counter(tmp_path, "l1-eth2", "tx_bytes", 1250)             # l1 sent up to s1
    series = sampler.stop()
    assert open_fds() == before
    assert len(series.times) >= 2 and series.data.shape == (len(series.times), len(series.columns))
    first, last = series.data[0], series.data[-1]
    assert first[series.index["h1-n0>l1"]] == 500 and last[series.index["h1-n0>l1"]] == 500
    assert first[series.index["l1>s1"]] == 0 and last[series.index["l1>s1"]] == 1250
    assert last.sum() == 1750


def test_port_sampler_refuses_missing_ports(tmp_path):
    fabric = tiny_sysfs(tmp_path)
    (tmp_path / "l2-eth1" / "statistics" / "tx_bytes").unlink()
    before = open_fds()
    with pytest.raises(LabError, match="port.s. l2-eth1: is the fabric up"):
        PortSampler(fabric, sys_net=tmp_path).start()
    assert open_fds() == before


def test_port_sampler_fails_on_a_port_it_cannot_read(tmp_path):
    fabric = tiny_sysfs(tmp_path)
    (tmp_path / "l2-eth3" / "statistics" / "tx_bytes").unlink()
    unreadable(tmp_path, "l2-eth3", "tx_bytes")
    before = open_fds()
    with pytest.raises(LabError, match="port l2-eth3 disappeared during sampling"):
        PortSampler(fabric, sys_net=tmp_path).start()
    assert open_fds() == before


# -- top ------------------------------------------------------------------------------------------

def test_top_shows_what_moved_and_reads_a_missing_port_as_zero(tmp_path):
    """Every refresh asks the lab for links down; here that also makes h1's NIC send 125,000 bytes
    and h2's receive 250,000, so every frame after the first shows both moving. l2's port to s2
    is missing and reads as 0."""
    fabric = tiny_sysfs(tmp_path)
    shutil.rmtree(tmp_path / "l2-eth3")
    sent = {"l1-eth1": 0, "l2-eth1": 0}

    def injected():
        sent["l1-eth1"] += 125_000
        sent["l2-eth1"] += 250_000
        set_counter(tmp_path, "l1-eth1", "rx_bytes", sent["l1-eth1"])
        set_counter(tmp_path, "l2-eth1", "tx_bytes", sent["l2-eth1"])
        return {"links_down": ["l2-s2"]}

    lab = types.SimpleNamespace(fabric=fabric, routing="ecmp", injected=injected, events=[], queues=None)
    stream = io.StringIO()
    before = open_fds()
    top.watch(lab, seconds=0.35, refresh_s=0.1, stream=stream, sys_net=tmp_path)
    assert open_fds() == before
    frames = stream.getvalue().strip().split("\n\n")
    assert len(frames) >= 2
    assert "links down: l2-s2" in frames[0] and "NICs sent 0.0 Mbit/s, received 0.0 Mbit/s" in frames[0]
    for text in frames[1:]:
        h1_sent, h1_got = nic_mbps(text, "h1-n0")
        h2_sent, h2_got = nic_mbps(text, "h2-n0")
        assert h1_sent > 0 and h2_got == pytest.approx(2 * h1_sent, abs=0.15)
        assert h1_got == h2_sent == 0


def nic_mbps(frame, nic):
    """(sent, received) Mbit/s of one NIC in a top frame."""
    sent, got = re.search(rf"{nic}\s+([\d.]+)/\s*([\d.]+)", frame).groups()
    return float(sent), float(got)


def test_a_column_reader_maps_columns_and_zeroes_missing(tmp_path):
    fabric = tiny_sysfs(tmp_path)
    cols = columns(fabric)
    set_counter(tmp_path, "l1-eth2", "tx_bytes", 42)
    (tmp_path / "s2-eth2" / "statistics" / "tx_bytes").unlink()
    with ColumnReader(fabric, cols, sys_net=tmp_path) as reader:
        reading = reader.read()
    assert list(reading) == [c.name for c in cols]
    assert reading["l1>s1"] == 42 and reading["s2>l2"] == 0


def test_top_reads_the_ports_of_a_switch_on_another_machine_there(tmp_path):
    """l2 and s2 run on machine m2, whose counter reader reads the test's statistics tree: h2's
    NIC (read at l2's port) moves in the view, read there, and nothing of l1 is asked there."""
    from fabriclab.cluster import remotecounters

    fabric = tiny_sysfs(tmp_path)
    asked = []

    class Reader:
        def read(self, pairs, drops=False, states=False):
            asked.append(pairs)
            with PortCounters(pairs, tmp_path) as counters:
                return remotecounters.Reading(pairs, counters.read(), 0.0, 0.001)

    m2 = types.SimpleNamespace(name="m2", local=False)
    here = types.SimpleNamespace(name="here", local=True)
    cluster = types.SimpleNamespace(machine_of_name=lambda name: m2 if name in ("l2", "s2") else here,
                                    helper=lambda machine, key, start: Reader())
    # what Cluster.read_counters_all does: each machine's reader, all at once
    cluster.read_counters_all = lambda by_machine, drops=False: remotecounters.read_all(cluster, by_machine, drops)
    sent = {"l2-eth1": 0}

    def injected():
        sent["l2-eth1"] += 250_000
        set_counter(tmp_path, "l2-eth1", "tx_bytes", sent["l2-eth1"])
        return {"links_down": []}

    lab = types.SimpleNamespace(fabric=fabric, routing="ecmp", injected=injected, events=[], queues=None,
                                cluster=cluster)
    stream = io.StringIO()
    top.watch(lab, seconds=0.35, refresh_s=0.1, stream=stream, sys_net=tmp_path / "not-here")
    frames = stream.getvalue().strip().split("\n\n")
    assert len(frames) >= 2 and all(nic_mbps(text, "h2-n0")[1] > 0 for text in frames[1:])
    assert asked and all(("l2-eth1", "tx_bytes") in pairs and not any(i.startswith("l1-") for i, _c in pairs)
                         for pairs in asked)
