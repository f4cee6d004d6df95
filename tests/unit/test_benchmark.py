"""`fabriclab benchmark` without a network: fabric sizes, and the crossing-machines benchmark's
fabric, its choice of host pairs, ping's summary and the table it prints."""

import pytest

from fabriclab.cli import benchmark as cli_benchmark
from fabriclab.cli.main import main
from fabriclab.errors import LabError
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.split import SplitSpec
from fabriclab.workflows import benchmark

PING_OK = """PING 10.1.2.1 (10.1.2.1) from 10.1.1.1 : 56(84) bytes of data.

--- 10.1.2.1 ping statistics ---
20 packets transmitted, 20 received, 0% packet loss, time 3812ms
rtt min/avg/max/mdev = 0.413/0.650/1.030/0.141 ms
"""
PING_LOST = """--- 10.1.2.1 ping statistics ---
20 packets transmitted, 0 received, 100% packet loss, time 3900ms
"""


def test_fabric_sizes_parse_and_bad_ones_are_refused():
    assert benchmark.parse_fabric_sizes("2x2x1, 4x2x2") == [(2, 2, 1), (4, 2, 2)]
    for bad in ("2x2", "0x2x2", "ax2x2"):
        with pytest.raises(LabError, match="LEAVESxSPINESxHOSTS_PER_LEAF"):
            benchmark.parse_fabric_sizes(bad)


@pytest.mark.parametrize("machines, leaves", [(2, 2), (3, 3)])
def test_the_crossing_fabric_has_a_leaf_per_machine_and_a_pair_on_each_side(machines, leaves):
    spec = benchmark.crossing_spec(machines)
    assert (spec.leaves, spec.spines, spec.hosts_per_leaf) == (leaves, 2, 2)
    fabric = Fabric(spec)
    local, across = benchmark.crossing_pairs(fabric, SplitSpec("leaf", machines))
    leaf = {h: fabric.hosts[h].ports[0].leaf for h in fabric.hosts}
    assert local == ("h1", "h2") and leaf["h1"] == leaf["h2"]
    assert across == ("h1", "h3") and leaf["h1"] != leaf["h3"]


def test_a_split_without_a_pair_across_is_refused():
    fabric = Fabric(benchmark.crossing_spec(2))
    everything_on_one = {name: 1 for name in list(fabric.switches) + list(fabric.hosts)}
    everything_on_one["s2"] = 2                    # the split needs a switch on each machine
    with pytest.raises(LabError, match="no pair of hosts across machines"):
        benchmark.crossing_pairs(fabric, SplitSpec("explicit", 2, everything_on_one))


def test_ping_summaries_are_read_and_a_missing_one_is_one_line():
    assert benchmark.parse_ping(PING_OK) == {"sent": 20, "received": 20, "min_ms": 0.413,
                                             "avg_ms": 0.65, "max_ms": 1.03}
    assert benchmark.parse_ping(PING_LOST) == {"sent": 20, "received": 0, "min_ms": None,
                                               "avg_ms": None, "max_ms": None}
    with pytest.raises(LabError, match="ping gave no summary: ping: connect: Network is unreachable"):
        benchmark.parse_ping("ping: connect: Network is unreachable\n")


def test_the_crossing_table_shows_each_placement_and_an_unanswered_pair():
    result = {"spec": "bench-crossing-2x2x2", "rate_mbps": 10.0, "pings": 20, "allreduce_bytes": 262144,
              "local_pair": ["h1", "h2"], "across_pair": ["h1", "h3"],
              "rows": [{"placement": "one machine", "bringup_s": 0.6, "teardown_s": 0.3,
                        "local_received": 20, "local_min_ms": 0.2, "local_avg_ms": 0.3, "local_max_ms": 0.5,
                        "across_received": 20, "across_min_ms": 0.4, "across_avg_ms": 0.65,
                        "across_max_ms": 1.03, "busbw_mbps": 10.1},
                       {"placement": "split by leaf over 2 machines", "bringup_s": 72.0, "teardown_s": 5.0,
                        "local_received": 20, "local_min_ms": 0.2, "local_avg_ms": 0.3, "local_max_ms": 0.5,
                        "across_received": 0, "across_min_ms": None, "across_avg_ms": None,
                        "across_max_ms": None, "busbw_mbps": 2.8}]}
    columns = cli_benchmark.crossing_columns(result)
    assert columns[3] == "RTT h1-h2 ms (same machine)" and columns[4] == "RTT h1-h3 ms (across)"
    rows = cli_benchmark.crossing_rows(result)
    assert rows[0][4] == "0.65 (0.40-1.03)" and rows[1][4] == "no reply (0 of 20)"


def test_crossing_needs_two_machines_and_builds_nothing_with_fewer():
    with pytest.raises(LabError, match="at least 2 machines; it has 1"):
        benchmark.bench_crossing([object()])


def test_a_missing_inventory_is_one_line(tmp_path, capsys):
    assert main(["benchmark", "--inventory", str(tmp_path / "none.ini")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fabriclab: error: no inventory file") and err.count("\n") == 1


def test_forwarded_packets_are_every_datapaths_lookups_hit_or_missed():
    # as ovs-appctl dpctl/show prints them (OVS 3.1, the userspace datapath, and a kernel one)
    text = ("netdev@ovs-netdev:\n  lookups: hit:2649 missed:83 lost:1\n  flows: 83\n"
            "  port 0: ovs-netdev (tap)\n  port 1: l1-eth8\n"
            "system@ovs-system:\n  lookups: hit:10 missed:5 lost:0\n  flows: 2\n")
    assert benchmark.lookups(text) == 2649 + 83 + 10 + 5
    assert benchmark.lookups("") is None
