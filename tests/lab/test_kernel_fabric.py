"""The small fabric of the full-kernel tier, brought up once for both of its checks (under
software emulation a bring-up costs the guest about 17 s):

- the OVS datapath it runs on: the kernel's (openvswitch module) where doctor finds it, as in the
  full-kernel tier and the Vagrant VM, else the userspace one. Either way the bridges, the
  datapath's own flow table and the RoCE traffic must agree on which one carried the packets;
- collectives over soft-RoCE: where doctor finds rdma_rxe a ring AllReduce runs over real RDMA
  verbs on rxe devices attached to the hosts' NIC ports, checked against numpy; elsewhere the same
  test runs the udp backend and says so. Either way the results name the backend that ran, and
  nothing of the job is left behind."""

import json
import subprocess

import pytest

from fabriclab.system import doctor
from fabriclab.errors import LabError
from fabriclab.lab.lab import Lab
from fabriclab.topologies.spec import FabricSpec
from fabriclab.traffic import softroce
from fabriclab.traffic.collective import CollectiveSpec, Launcher, place_ranks, run_collective

from . import labutil
from .tier import check_mechanism

pytestmark = [pytest.mark.lab, pytest.mark.fullkernel]

# Two hosts on different leaves: the ring crosses a spine both ways. 10 Mbit/s standing for 400G.
SPEC = FabricSpec(name="t-kernel", leaves=2, spines=2, hosts_per_leaf=1,
                  host_rate_mbps=10, fabric_rate_mbps=10, real_host_rate_mbps=400_000)


@pytest.fixture(scope="module")
def lab():
    before = labutil.resources()
    with Lab(SPEC) as running:
        yield running
    assert not labutil.leaked(before, labutil.resources())


def _roce_here():
    return doctor.mechanisms(doctor.probe())["roce"].mechanism


def _rdma_devices():
    out = subprocess.run(["rdma", "-j", "link", "show"], capture_output=True, text=True)
    try:
        return {link["ifname"] for link in json.loads(out.stdout or "[]")}
    except ValueError:
        return set()


def _our_rules():
    out = subprocess.run(["ip", "rule", "list"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if f"proto {softroce.RULE_PROTOCOL}" in line]


# OVS names the datapath after its type: the kernel module's is "system@ovs-system".
DATAPATH_NAMES = {"kernel": "system@ovs-system", "userspace": "netdev@ovs-netdev"}


def _ovs(*argv):
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout


def test_fabric_runs_on_the_chosen_datapath_and_carries_a_collective(lab, record_property):
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


def test_ring_allreduce_completes_and_verifies_on_the_chosen_backend(lab, record_property):
    spec = CollectiveSpec("allreduce", sizes=(256 * 1024,), iterations=2, warmup=1, verify=True,
                          backend="auto")
    run = run_collective(lab, spec)
    check_mechanism(record_property, "roce", run.backend, "rdma_rxe")
    (row,) = run.sizes
    c = row["counters"]
    print(f"{run.backend}: busbw {row['busbw_mbps']:.2f} Mbit/s ({100 * row['busbw_fraction_of_nic']:.0f}% "
          f"of the NIC), CCT mean {row['time_s']['mean'] * 1e3:.0f} ms (ideal "
          f"{row['ideal_time_s'] * 1e3:.0f} ms), counters {c}")
    assert row["verify"]["ok"], row["verify"]
    assert row["verify"]["checked_outputs"] == 2 * 2
    assert c["rx_bytes"] >= sum(row["bytes_sent_per_rank"]) * 2, c
    assert row["busbw_mbps"] > 0
    if run.backend == "rdma_rxe":
        # The devices' own counters saw at least a packet per path MTU of payload.
        assert c["tx_packets"] >= sum(row["bytes_sent_per_rank"]) * 2 // run.payload_bytes, c
        ports = [port for final in run.finals.values() for port in final["ports"]]
        devices = {port["device"] for port in ports}
        assert len(devices) == 2 and all(d.startswith(softroce.DEVICE_PREFIX) for d in devices)
        assert all(port["hw_counters"]["sent_pkts"] > 0 for port in ports)
        # The job's devices, veths and rules went with it.
        assert not devices & _rdma_devices()
        assert not _our_rules()


def test_clean_removes_what_a_killed_job_left(lab, record_property):
    """A job's devices, veths and rules as a SIGKILL would leave them: `clean`'s sweep removes
    them once no live run owns the interfaces."""
    check_mechanism(record_property, "roce", _roce_here(), "rdma_rxe")
    if _roce_here() != softroce.RXE:
        pytest.skip("no rdma_rxe on this kernel: the udp backend creates no devices to leave behind")
    job = softroce.SoftRoce(lab, place_ranks(lab.fabric, CollectiveSpec()), name="killed")
    atts = job.attach()
    assert {a.device for a in atts} <= _rdma_devices() and len(_our_rules()) == 2 * len(atts)
    job.made = []                              # the process died: nothing detaches
    report = softroce.remove_leftovers(live_interfaces=())
    assert any("soft-RoCE device" in line for line in report), report
    assert not {a.device for a in atts} & _rdma_devices()
    assert not _our_rules()
    # (A killed launcher takes its fabric with it; here the fabric lives on, so the hosts' redirect
    # filters, which now point nowhere, go as a normal detach removes them.)
    job.made = atts
    job.detach()


def test_asking_for_rxe_where_it_cannot_run_fails_in_one_line():
    lab = Lab(SPEC)                    # not started: the check comes before anything is built
    if _roce_here() == softroce.RXE:
        # soft-RoCE is here, but clear-to-send admission is the udp backend's alone
        with pytest.raises(LabError, match="collective: cts needs the udp backend") as err:
            Launcher(lab, CollectiveSpec(backend="rxe", cts=True))
    else:
        with pytest.raises(LabError, match="collective: backend rxe needs soft-RoCE") as err:
            Launcher(lab, CollectiveSpec(backend="rxe"))
    assert "\n" not in str(err.value)
