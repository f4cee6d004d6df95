"""The Spectrum-X multiplane testbed (seed 002, Figure 16): planes build, carry traffic, stay apart."""

import subprocess

import pytest

from fabriclab.measure import telemetry
from fabriclab.lab.lab import Lab
from fabriclab.topologies.spec import load_spec
from fabriclab.traffic.allpairs import all_pairs_plan
from fabriclab.traffic.launcher import run_traffic

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def lab():
    with Lab(load_spec("spectrumx_fig16"), routing="ecmp") as running:
        yield running


def test_every_port_reaches_its_plane_from_every_host(lab):
    h1 = lab.fabric.hosts["h1"]
    failed = []
    for port in h1.ports:
        for other in lab.fabric.hosts.values():
            if other.name == "h1":
                continue
            peer = next(p for p in other.ports if p.plane == port.plane and p.nic == port.nic)
            if not lab.ping(port, peer):
                failed.append((port.intf, peer.intf))
    assert not failed, failed


def test_planes_are_isolated(lab):
    h1, h12 = lab.fabric.hosts["h1"], lab.fabric.hosts["h12"]
    # A host never routes a plane's address out of another plane's port ...
    for src in h1.ports:
        for dst in h12.ports:
            if dst.plane != src.plane:
                assert not lab.ping(src, dst), f"{src.intf} reached {dst.intf} in another plane"
    # ... and a packet forced into the wrong plane (static route and neighbour entry, so no ARP
    # is needed) dies in that plane's fabric: no switch routes another plane's prefix.
    src = next(p for p in h1.ports if p.plane == 1)
    dst = next(p for p in h12.ports if p.plane == 2)
    node = lab.host("h1")
    node.cmd(f"ip route add {dst.ip}/32 dev {src.intf} table 100 && "
             f"ip neigh replace {dst.ip} lladdr {dst.mac} dev {src.intf}")
    try:
        assert not lab.ping(src, dst), "plane 1's fabric delivered to plane 2"
    finally:
        node.cmd(f"ip route del {dst.ip}/32 dev {src.intf} table 100; ip neigh del {dst.ip} dev {src.intf}")
    # No OVS bridge has a port cabled to another plane's switch.
    for link in lab.fabric.fabric_links:
        a, b = lab.fabric.switches[link.a], lab.fabric.switches[link.b]
        assert a.plane == b.plane
        ports = subprocess.run(["ovs-vsctl", "list-ports", link.a], capture_output=True, text=True,
                               check=True).stdout.split()
        assert link.a_intf in ports


def test_every_plane_carries_its_own_share(lab, figure):
    run = run_traffic(lab, all_pairs_plan(lab.fabric, load=0.3), duration_s=3.0)
    rows = telemetry.link_utilization(lab.fabric, *run.window)
    per_plane = {}
    for row in rows:
        plane = lab.fabric.switches[row["from"]].plane
        per_plane[plane] = per_plane.get(plane, 0.0) + row["mbps"]
    assert sorted(per_plane) == [1, 2, 3, 4]
    low, high = min(per_plane.values()), max(per_plane.values())
    # The same traffic matrix runs in each plane, so each plane's fabric carries about the same.
    assert figure("least / most loaded plane, fabric Mbit/s", low / high) > 0.6, per_plane
    assert figure("all-pairs loss", run.totals()["loss"]) < 0.02, run.totals()


def test_a_collective_spreads_each_connection_over_every_plane(lab):
    """A rank is a NIC with one port per plane: its QPs go out on all four, the per-plane packets
    stay in their plane, and the AllReduce is still exact."""
    from fabriclab.traffic.collective import CollectiveSpec, run_collective

    run = run_collective(lab, CollectiveSpec("allreduce", sizes=(96 * 1024,), qps=1,
                                             iterations=1, warmup=0, verify=True))
    row = run.sizes[0]
    assert row["verify"]["ok"] and row["ranks"] == 12
    assert row["nic_rate_mbps"] == 4 * lab.fabric.spec.host_rate_mbps
    planes = {q["plane"] for f in run.finals.values() for q in f["qps"] if q["tx_packets"]}
    assert planes == {1, 2, 3, 4}
    assert row["counters"]["out_of_sequence"] == 0
