"""A rail-optimized fabric on real Mininet + OVS + os-ken: NIC i of every host reaches NIC i of
the others (one leaf inside a rail group, the spines between groups), a rail-placed ring
AllReduce is correct and keeps to its rails, and a rank-per-NIC AlltoAll with PXN is correct and
sends nothing across rails on the fabric."""

import pytest

from fabriclab.lab.lab import Lab
from fabriclab.measure import telemetry
from fabriclab.topologies.spec import load_spec
from fabriclab.traffic.collective import CollectiveSpec, run_collective

from tests.lab import labutil

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def lab():
    with Lab(load_spec("rail_optimized"), routing="ecmp") as running:
        yield running


def spine_bytes(row):
    """Bytes the leaves sent up to the spines over the measured window."""
    return sum(link["mbps"] for link in row["links"] if link["direction"] == "up") * 1e6 / 8 * row["window_s"]


def test_every_nic_reaches_its_rail_peers_one_leaf_or_the_spines_away(lab):
    tried, failed = labutil.unreachable(lab, same_nic=True)
    assert not failed, f"{len(failed)} of {tried} rail pairs unreachable: {failed[:5]}"
    h1, h2, h5 = (lab.fabric.hosts[h] for h in ("h1", "h2", "h5"))
    assert lab.paths(h1.ports[1].intf, h2.ports[1].intf) == [[]]          # one rail leaf, l2
    assert {len(p) for p in lab.paths(h1.ports[1].intf, h5.ports[1].intf)} == {2}   # l2-s-l4


def test_a_rail_placed_ring_allreduce_is_correct_and_keeps_to_its_rails(lab, figure):
    spec = CollectiveSpec("allreduce", sizes=(256 * 1024,), placement="rail", iterations=2,
                          warmup=1, verify=True)
    (row,) = run_collective(lab, spec).sizes
    assert row["verify"]["ok"] and row["verify"]["checked_outputs"] == 2 * 16, row["verify"]
    rails = row["rails"]
    edge = 2 * 15 * 256 * 1024 // 16            # bytes per ring edge per iteration
    assert rails == {"scale_up_bytes": 2 * edge, "pxn_bytes": 0, "pxn_hops": 0,
                     "rail_local_bytes": 12 * edge, "cross_group_bytes": 2 * edge,
                     "cross_rail_bytes": 0}
    # Only the two group-crossing edges reach the spines: what the uplinks carried is their
    # bytes, plus headers and ACKs, not the 14 inter-host edges'.
    carried = spine_bytes(row) / (rails["cross_group_bytes"] * row["iterations"])
    assert 0.95 < figure("ring: uplink bytes / cross-group schedule bytes", carried) < 1.3, carried
    # The NICs sent the bytes between hosts; the rail changes went by the scale-up senders.
    nic = sum(row["planes"]["tx_bytes"]) / ((rails["rail_local_bytes"] + rails["cross_group_bytes"])
                                           * row["iterations"])
    assert 1.0 <= figure("ring: NIC tx bytes / schedule bytes between hosts", nic) < 1.1, nic


def test_alltoall_with_pxn_is_correct_and_crosses_no_rail_on_the_fabric(lab, figure):
    spec = CollectiveSpec("alltoall", sizes=(16 * 8192,), iterations=2, warmup=1, verify=True)
    run = run_collective(lab, spec)
    (row,) = run.sizes
    assert run.pxn and row["verify"]["ok"], row["verify"]
    rails = row["rails"]
    assert rails["cross_rail_bytes"] == 0 and rails["pxn_hops"] == 16 * 7
    assert rails["pxn_bytes"] == 16 * 7 * 8192
    carried = spine_bytes(row) / (rails["cross_group_bytes"] * row["iterations"])
    assert 0.95 < figure("AlltoAll with PXN: uplink bytes / cross-group schedule bytes", carried) < 1.3, carried
