"""The default fabric on real Mininet + OVS + os-ken: reachability, ECMP spread, shaping, the wire.

One fabric for the module (bring-up is about a second); every test sends real packets.
"""

import subprocess
import time

import pytest
from scapy.contrib.roce import BTH
from scapy.layers.inet import IP, UDP
from scapy.utils import rdpcap

from fabriclab.apps.hashing import ovs_group_hash, ovs_hash_bucket, switch_basis
from fabriclab.measure import telemetry
from fabriclab.lab.lab import Lab
from fabriclab.topologies.spec import load_spec
from fabriclab.traffic import roce
from fabriclab.traffic.allpairs import all_pairs_plan
from fabriclab.traffic.launcher import run_traffic

from tests.lab import labutil

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def lab():
    with Lab(load_spec("default"), routing="ecmp") as running:
        yield running


def test_every_nic_reaches_every_other(lab):
    tried, failed = labutil.unreachable(lab)
    assert not failed, f"{len(failed)} of {tried} pairs unreachable: {failed[:5]}"


def test_leaves_hold_one_select_group_per_remote_leaf_over_every_spine(lab):
    out = subprocess.run(["ovs-ofctl", "--names", "-O", "OpenFlow15", "dump-groups", "l1"],
                         capture_output=True, text=True, check=True).stdout
    groups = [line for line in out.splitlines() if "group_id=" in line]
    assert len(groups) == lab.fabric.spec.leaves - 1
    uplinks = [link.a_intf for link in lab.fabric.fabric_links if link.a == "l1"]
    for group in groups:
        assert "type=select" in group
        # The hash covers the 5-tuple, UDP ports included (OVS's default would skip them), from
        # l1's own basis (apps/hashing.py: one basis everywhere would polarize a second tier)
        basis = switch_basis(lab.fabric.switches["l1"].dpid)
        assert (f"selection_method=hash,selection_method_param={basis},"
                "fields(ip_src,ip_dst,nw_proto,tcp_src,tcp_dst,udp_src,udp_dst)") in group, group
        assert sorted(u for u in uplinks if f'output:"{u}"' in group) == sorted(uplinks)


def test_open_vswitch_picks_the_bucket_the_lab_and_its_flow_model_compute(lab):
    """The lab's Python twin of Open vSwitch's `hash` select method (apps/hashing.py, which the
    flow model hashes with) against the switch itself: for flows from l1's hosts to the other
    leaves, ofproto/trace's output port is the bucket the twin scores highest from l1's basis."""
    import random
    import re

    rng = random.Random(7)
    basis = switch_basis(lab.fabric.switches["l1"].dpid)
    uplinks = sorted((link.a_port, link.a_intf) for link in lab.fabric.fabric_links if link.a == "l1")
    sources = [p for h in lab.fabric.hosts.values() for p in h.ports if p.leaf == "l1"]
    targets = [p for h in lab.fabric.hosts.values() for p in h.ports if p.leaf != "l1"]
    for _ in range(48):
        src, dst, sport = rng.choice(sources), rng.choice(targets), rng.randrange(49152, 65536)
        out = subprocess.run(["ovs-appctl", "ofproto/trace", "l1",
                              f"in_port={src.leaf_port},dl_type=0x0800,nw_proto=17,nw_src={src.ip},nw_dst={dst.ip},"
                              f"udp_src={sport},udp_dst=4791"], capture_output=True, text=True, check=True).stdout
        (port,) = {int(n) for n in re.findall(r"^\s*output:(\d+)", out, re.M)}
        bucket = ovs_hash_bucket(ovs_group_hash(src.ip, dst.ip, 17, sport, 4791, basis),
                                 [(i, 1) for i in range(len(uplinks))])
        assert port == uplinks[bucket][0], (src.ip, dst.ip, sport, out[-400:])


def test_distinct_flows_spread_over_spines_without_reordering(lab, figure):
    plan = all_pairs_plan(lab.fabric, load=0.3, flows_per_pair=2)
    run = run_traffic(lab, plan, duration_s=3.0)
    rows = telemetry.link_utilization(lab.fabric, *run.window)
    per_spine = {}
    for row in rows:
        if row["direction"] == "up":
            per_spine[row["to"]] = per_spine.get(row["to"], 0.0) + row["mbps"]
    busy = [spine for spine, mbps in per_spine.items() if mbps > 0.5]
    assert figure("spines carrying over 0.5 Mbit/s up", len(busy)) >= 3, f"ECMP used only {busy}: {per_spine}"
    totals = run.totals()
    assert figure("all-pairs loss", totals["loss"]) < 0.02, totals
    # Hashing is per flow, so a flow never takes two paths: nothing arrives behind a later packet
    # (OOS also counts the gaps a lost packet leaves, so reordering is `late`).
    assert totals["late"] == 0, totals
    # Cross-leaf traffic is 6/7 of what hosts send; the uplinks must have carried about that.
    offered = sum(f["rate_mbps"] for flows in plan.values() for f in flows)
    carried = figure("uplink Mbit/s / planned cross-leaf Mbit/s", sum(per_spine.values()) / (offered * 6 / 7))
    assert carried == pytest.approx(1, rel=0.25)


def _spines_used(lab, sport_mode):
    """Spines carrying 16 QPs from h1 to h3 (leaf l1 to l2) in a given source-port mode."""
    src, dst = lab.fabric.hosts["h1"].ports[0], lab.fabric.hosts["h3"].ports[0]
    plan = {"h1": [{"id": f"qp{i}", "src": src.ip, "dst": dst.ip, "src_qpn": 0x100 + i,
                    "dst_qpn": 0x200 + i, "sport": None, "rate_mbps": 0.5} for i in range(16)]}
    run = run_traffic(lab, plan, duration_s=2.0, sport_mode=sport_mode)
    rows = telemetry.link_utilization(lab.fabric, *run.window)
    return {r["to"] for r in rows if r["from"] == "l1" and r["mbps"] > 0.2}


def test_ecmp_hash_spreads_the_qps_of_one_host_pair_by_udp_source_port(lab, figure):
    # 16 QPs between one pair of NICs differ only in their UDP source port (derived from the QP).
    assert figure("spines used by 16 QPs of one host pair", len(_spines_used(lab, "qp"))) >= 3
    # With one shared source port (seed 000's low-entropy case) they are one 5-tuple: one path.
    assert len(_spines_used(lab, "shared")) == 1


def test_switch_port_shaping_limits_an_incast_to_the_link_rate(lab, figure):
    """h1 and h2 (leaf l1) each send 0.9 x rate to h3: l2's port to h3 caps it and its buffer drops."""
    rate = lab.fabric.spec.host_rate_mbps
    dst = lab.fabric.hosts["h3"].ports[0]
    plan = {name: [{"id": f"{name}-h3", "src": lab.fabric.hosts[name].ports[0].ip, "dst": dst.ip,
                    "src_qpn": 0x20, "dst_qpn": 0x30 + i, "sport": None, "rate_mbps": 0.9 * rate}]
            for i, name in enumerate(("h1", "h2"))}
    run = run_traffic(lab, plan, duration_s=3.0)
    rows = telemetry.link_utilization(lab.fabric, *run.window)
    before, after = run.window
    port = f"l2-eth{dst.leaf_port}"
    mbps = (after["counters"][port]["tx_bytes"] - before["counters"][port]["tx_bytes"]) * 8 / \
        (after["time"] - before["time"]) / 1e6
    assert figure("shaped port Mbit/s under a 1.8x incast", mbps) == pytest.approx(rate, rel=0.12), \
        f"{port} sent {mbps:.2f} Mbit/s, link is {rate}"
    assert after["drops"][port] - before["drops"][port] > 0, "an overloaded port's buffer must drop"
    assert figure("incast loss", run.totals()["loss"]) > 0.3
    assert rows   # the fabric links were measured too


def test_packets_on_the_spine_are_rocev2_with_a_valid_icrc(lab, tmp_path):
    src, dst = lab.fabric.hosts["h1"].ports[0], lab.fabric.hosts["h8"].ports[0]
    pcaps = []
    procs = []
    for spine in ("s1", "s2", "s3", "s4"):
        pcap = tmp_path / f"{spine}.pcap"
        pcaps.append(pcap)
        procs.append(subprocess.Popen(["tcpdump", "-i", f"{spine}-eth1", "-U", "-w", str(pcap),
                                       "-c", "50", "udp", "port", "4791"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    time.sleep(1.0)
    plan = {"h1": [{"id": "wire", "src": src.ip, "dst": dst.ip, "src_qpn": 0x77, "dst_qpn": 0x99,
                    "sport": None, "rate_mbps": 2.0}]}
    try:
        run_traffic(lab, plan, duration_s=1.0)
    finally:
        time.sleep(0.5)
        for proc in procs:
            proc.terminate()
            proc.wait(5)
    packets = [p for pcap in pcaps if pcap.exists() and pcap.stat().st_size > 24 for p in rdpcap(str(pcap))]
    assert packets, "no RoCEv2 packet crossed any spine towards l4"
    for pkt in packets:
        assert pkt[UDP].dport == 4791
        assert pkt[UDP].sport == roce.udp_source_port(0x77, 0x99)
        assert pkt[BTH].dqpn == 0x99
        assert pkt[IP].tos >> 2 == roce.DEFAULT_DSCP
        assert roce.icrc_ok(bytes(pkt[IP])), "ICRC on the wire does not match the packet"
