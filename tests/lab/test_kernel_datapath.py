"""The OVS datapath the fabric runs on: the kernel's (openvswitch module) where doctor finds it,
as in the full-kernel tier and the Vagrant VM, else the userspace one. Either way the bridges, the
datapath's own flow table and the RoCE traffic must agree on which one carried the packets."""

import subprocess

import pytest

from fabriclab.lab.lab import Lab
from fabriclab.topologies.spec import FabricSpec
from fabriclab.traffic.collective import CollectiveSpec, run_collective

from .tier import check_mechanism

pytestmark = [pytest.mark.lab, pytest.mark.fullkernel]

SPEC = FabricSpec(name="t-kdp", leaves=2, spines=2, hosts_per_leaf=1,
                  host_rate_mbps=10, fabric_rate_mbps=10, real_host_rate_mbps=400_000)

# OVS names the datapath after its type: the kernel module's is "system@ovs-system".
DATAPATH_NAMES = {"kernel": "system@ovs-system", "userspace": "netdev@ovs-netdev"}


def _ovs(*argv):
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout


def test_fabric_runs_on_the_chosen_datapath_and_carries_a_collective(record_property):
    with Lab(SPEC) as lab:
        ran = "kernel" if lab.datapath == "kernel" else "userspace"
        check_mechanism(record_property, "ovs_datapath", ran, "kernel")
        # An empty datapath_type is OVS's default, the kernel's "system".
        types = {br: _ovs("ovs-vsctl", "get", "bridge", br, "datapath_type").strip().strip('"') or "system"
                 for br in lab.fabric.switches}
        assert set(types.values()) == {"system" if ran == "kernel" else "netdev"}, types

        run = run_collective(lab, CollectiveSpec("allreduce", sizes=(64 * 1024,), iterations=2,
                                                 warmup=0, verify=True))
        (row,) = run.sizes
        assert row["verify"]["ok"], row["verify"]
        assert row["counters"]["rx_bytes"] > 0

        # The datapath that carried the collective holds its RoCEv2 flows (UDP 4791): right after
        # the run they have not yet expired (idle timeout 10 s).
        flows = _ovs("ovs-appctl", "dpctl/dump-flows", DATAPATH_NAMES[ran])
        roce = [f for f in flows.splitlines() if "dst=4791" in f]
        assert roce, f"no RoCEv2 flows in {DATAPATH_NAMES[ran]}:\n{flows[:2000]}"
