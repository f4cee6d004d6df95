"""The small fabric of the full-kernel tier, brought up once for both of its checks (under
software emulation a bring-up costs the guest about 17 s):

- the OVS datapath it runs on: the kernel's (openvswitch module) where doctor finds it, as in the
  full-kernel tier and the Vagrant VM, else the userspace one. Either way the bridges, the
  datapath's own flow table and the RoCE traffic must agree on which one carried the packets;
- collectives over soft-RoCE: where doctor finds rdma_rxe a ring AllReduce runs over real RDMA
  verbs on rxe devices attached to the hosts' NIC ports, checked against numpy; elsewhere the same
  test runs the udp backend and says so. Either way the results name the backend that ran, and
  nothing of the job is left behind;
- the lab's own RNIC against the kernel's (last, on the same fabric): a kernel rxe RC QP on h1 and
  the lab's raw-socket RNIC on h2 (traffic/rc_endpoint.py) exchange RDMA WRITEs and SENDs both
  ways, the data checked byte for byte, and the kernel drops a packet whose ICRC the lab corrupted.
  Only where rdma_rxe loads: elsewhere it is skipped, and in the full-kernel tier it must run."""

import json
import pathlib
import random
import subprocess
import time
from dataclasses import dataclass

import pytest

from fabriclab.system import doctor, patience
from fabriclab.errors import LabError
from fabriclab.lab.lab import Lab
from fabriclab.topologies.spec import FabricSpec
from fabriclab.traffic import softroce
from fabriclab.traffic.collective import CollectiveSpec, Launcher, place_ranks, run_collective

from . import labutil
from .rxe_interop import EndpointProcess, KernelQp
from .tier import check_mechanism, full_tier

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


# -- the lab's RNIC and the kernel's, on one connection ------------------------------------------

INTEROP_PAYLOAD = 1024          # the QPs' path MTU: a 3 KiB message is FIRST, MIDDLE, LAST
MESSAGE = 2 * INTEROP_PAYLOAD + 1021     # 3069 bytes: the LAST carries 1021 and 3 pad bytes
SMALL = 100                     # an ONLY packet
# Both QPs' local ACK timeout: far above an ACK's round trip in the emulated guest (there the
# lab's four messages, 8 packets, were all acknowledged within 0.12 s), so nothing is sent twice
# but the packet whose ICRC the lab corrupted, which waits one timeout out.
INTEROP_ACK_TIMEOUT_S = 2.0
# Where things go in the two memories (the kernel's MR and the endpoint's), 4 KiB apart.
K_WRITE, K_WRITE_IMM, K_RECV, K_SOURCE, K_CORRUPT = 0, 4096, 8192, 32768, 49152
L_WRITE, L_WRITE_IMM, L_RECV = 0, 4096, 8192


@dataclass
class Interop:
    attachment: object           # softroce.Attachment of h1's port: the kernel's device
    kernel: KernelQp
    endpoint: EndpointProcess    # the lab's RNIC on h2
    ready: dict                  # what the endpoint said of itself (QPN, PSN, vaddr, rkey)


def _pattern(seed, length):
    return random.Random(seed).randbytes(length)


def _netdev_rx_packets(netdev):
    return int(pathlib.Path(f"/sys/class/net/{netdev}/statistics/rx_packets").read_text())


def _delta(after, before, *names):
    return {name: after.get(name, 0) - before.get(name, 0) for name in names}


@pytest.fixture(scope="class")
def interop(lab):
    """h1's port with an rxe device and a kernel QP on it, h2's with the lab's RNIC (one QP),
    the two connected; everything goes when the class is done."""
    if _roce_here() != softroce.RXE:
        if full_tier():
            pytest.fail("the full-kernel tier must run the rxe interop test, and doctor finds no "
                        "rdma_rxe", pytrace=False)
        pytest.skip("no rdma_rxe on this kernel: there is no kernel RNIC to talk to")
    kernel_rank, lab_rank = place_ranks(lab.fabric, CollectiveSpec(hosts=("h1", "h2")))
    # A device on h1's port only: h2's port stays the lab's RNIC's (a neighbour, no device).
    job = softroce.SoftRoce(lab, [kernel_rank], name="interop", peers=[lab_rank])
    kernel = endpoint = None
    try:
        (attachment,) = job.attach()
        kernel = KernelQp(attachment.device, attachment.ip)
        endpoint = EndpointProcess(lab.host("h2"), lab_rank.ports[0].ip, INTEROP_PAYLOAD,
                                   INTEROP_ACK_TIMEOUT_S)
        ready = endpoint.ready
        # Out of band, as an application's own socket would carry them: QPN, PSN, address.
        endpoint.call("connect", peer_address=attachment.ip, peer_qpn=kernel.qpn, peer_psn=kernel.psn)
        kernel.connect(ready["address"], ready["qpn"], ready["psn"], INTEROP_PAYLOAD, INTEROP_ACK_TIMEOUT_S)
        yield Interop(attachment, kernel, endpoint, ready)
    finally:
        if endpoint is not None:
            endpoint.close()
        if kernel is not None:
            kernel.close()
        job.detach()
    assert not _our_rules()


class TestLabRnicAgainstKernelRxe:
    """One connection, three checks in order: the lab sends, the kernel sends, the lab corrupts."""

    def test_the_lab_rnic_writes_and_sends_to_a_kernel_qp(self, interop, record_property):
        check_mechanism(record_property, "roce", _roce_here(), "rdma_rxe")
        k, ep, device = interop.kernel, interop.endpoint, interop.attachment.device
        big, small = _pattern(1, MESSAGE), _pattern(2, SMALL)
        # A WRITE WITH IMMEDIATE consumes a receive request at the kernel, as each SEND does.
        receives = [k.post_recv(K_RECV + 4096 * i, 4096) for i in range(3)]
        before = softroce.hw_counters(device)
        ep.call("write", vaddr=k.base + K_WRITE, rkey=k.rkey, data=big.hex(), immediate=None)
        ep.call("write", vaddr=k.base + K_WRITE_IMM, rkey=k.rkey, data=small.hex(), immediate=0xC0FFEE)
        ep.call("send", data=big.hex(), immediate=None)
        ep.call("send", data=small.hex(), immediate=0x5EED)
        run = ep.call("run", timeout_s=patience.scaled(15))
        wcs = k.poll(3, patience.scaled(5))
        after = softroce.hw_counters(device)
        counted = _delta(after, before, "rcvd_pkts", "sent_pkts", "out_of_seq_request",
                         "duplicate_request", "send_rnr_err")
        print(f"lab -> kernel: {run['elapsed_s']} s, lab sent {run['opcodes_out']}, got back "
              f"{run['opcodes_in']}; kernel counters {counted}; completions {wcs}")
        record_property("lab_to_kernel", {"elapsed_s": run["elapsed_s"], "kernel": counted})
        assert run["done"] and run["completed"] == [1, 2, 3, 4], run
        # Accepted as they came: every data packet once, no NAK, no retransmission either side.
        r = run["requester"]
        assert (r["retransmitted_packets"], r["naks"], r["rnr_naks"], r["local_ack_timeout_err"]) == (0, 0, 0, 0), r
        sent = run["opcodes_out"]
        assert {op: sent.get(op, 0) for op in ("RC_RDMA_WRITE_FIRST", "RC_RDMA_WRITE_MIDDLE", "RC_RDMA_WRITE_LAST",
                                                "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", "RC_SEND_FIRST",
                                                "RC_SEND_MIDDLE", "RC_SEND_LAST",
                                                "RC_SEND_ONLY_WITH_IMMEDIATE")} == dict.fromkeys(
            ("RC_RDMA_WRITE_FIRST", "RC_RDMA_WRITE_MIDDLE", "RC_RDMA_WRITE_LAST",
             "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", "RC_SEND_FIRST", "RC_SEND_MIDDLE", "RC_SEND_LAST",
             "RC_SEND_ONLY_WITH_IMMEDIATE"), 1), sent
        assert counted["rcvd_pkts"] == 8 and counted["out_of_seq_request"] == 0, counted
        assert counted["duplicate_request"] == 0 and counted["send_rnr_err"] == 0, counted
        assert counted["sent_pkts"] == run["opcodes_in"].get("RC_ACKNOWLEDGE", 0) > 0, (counted, run)
        # The data, byte for byte, where the RETHs and the receive requests put it.
        assert k.read_local(K_WRITE, MESSAGE) == big
        assert k.read_local(K_WRITE_IMM, SMALL) == small
        assert [(wc["wr_id"], wc["status"], wc["byte_len"], wc["immediate"]) for wc in wcs] == [
            (receives[0], 0, SMALL, 0xC0FFEE), (receives[1], 0, MESSAGE, None), (receives[2], 0, SMALL, 0x5EED)]
        assert k.read_local(K_RECV + 4096, MESSAGE) == big
        assert k.read_local(K_RECV + 8192, SMALL) == small

    def test_a_kernel_qp_writes_and_sends_to_the_lab_rnic(self, interop, record_property):
        import pyverbs.enums as e

        check_mechanism(record_property, "roce", _roce_here(), "rdma_rxe")
        k, ep, ready = interop.kernel, interop.endpoint, interop.ready
        big, small = _pattern(3, MESSAGE), _pattern(4, SMALL)
        ep.call("post_recv", offset=L_RECV, length=4096)
        ep.call("post_recv", offset=L_RECV + 4096, length=4096)
        k.write_local(K_SOURCE, big)
        k.write_local(K_SOURCE + 4096, small)
        before = softroce.hw_counters(interop.attachment.device)
        start = time.monotonic()
        posted = [k.post_send(K_SOURCE, MESSAGE, remote=(ready["vaddr"] + L_WRITE, ready["rkey"])),
                  k.post_send(K_SOURCE + 4096, SMALL, remote=(ready["vaddr"] + L_WRITE_IMM, ready["rkey"]),
                              immediate=0xFEED),
                  k.post_send(K_SOURCE, MESSAGE),
                  k.post_send(K_SOURCE + 4096, SMALL, immediate=0xD00D)]
        run = ep.call("run", timeout_s=patience.scaled(15), received=4)
        wcs = k.poll(4, patience.scaled(10))
        elapsed = time.monotonic() - start
        counted = _delta(softroce.hw_counters(interop.attachment.device), before, "sent_pkts", "rcvd_pkts",
                         "completer_retry_err", "rcvd_seq_err", "retry_exceeded_err")
        c = run["counters"]
        print(f"kernel -> lab: {elapsed:.3f} s, the kernel sent {run['opcodes_in']}, every ICRC checked by the "
              f"lab ({c.get('icrc_ok', 0)} ok, {c.get('icrc_errors', 0)} bad); kernel counters {counted}; "
              f"completions {wcs}")
        record_property("kernel_to_lab", {"elapsed_s": round(elapsed, 3), "kernel": counted,
                                          "icrc_checked": c.get("icrc_ok", 0)})
        assert run["done"], run
        # Every work request completed without error at the kernel: the lab's ACKs were accepted.
        assert [(wc["wr_id"], wc["status"]) for wc in wcs] == [(wr, e.IBV_WC_SUCCESS) for wr in posted], wcs
        assert [wc["opcode"] for wc in wcs] == [e.IBV_WC_RDMA_WRITE] * 2 + [e.IBV_WC_SEND] * 2
        assert counted["rcvd_seq_err"] == 0 and counted["retry_exceeded_err"] == 0, counted
        # The lab's code checked the kernel's ICRC on every packet and agreed with it.
        assert c.get("icrc_errors", 0) == 0 and c["icrc_ok"] == c["rx_datagrams"] >= 8, c
        got = run["opcodes_in"]
        for op in ("RC_RDMA_WRITE_FIRST", "RC_RDMA_WRITE_MIDDLE", "RC_RDMA_WRITE_LAST",
                   "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", "RC_SEND_FIRST", "RC_SEND_MIDDLE",
                   "RC_SEND_LAST", "RC_SEND_ONLY_WITH_IMMEDIATE"):
            assert got.get(op, 0) >= 1, (op, got)
        assert [(m["kind"], m["immediate"], m["length"]) for m in run["received"]] == [
            ("write", None, None), ("write_with_immediate", 0xFEED, SMALL), ("send", None, MESSAGE),
            ("send", 0xD00D, SMALL)], run["received"]
        assert bytes.fromhex(ep.call("read", offset=L_WRITE, length=MESSAGE)["data"]) == big
        assert bytes.fromhex(ep.call("read", offset=L_WRITE_IMM, length=SMALL)["data"]) == small
        assert bytes.fromhex(ep.call("read", offset=L_RECV, length=MESSAGE)["data"]) == big
        assert bytes.fromhex(ep.call("read", offset=L_RECV + 4096, length=SMALL)["data"]) == small

    def test_the_kernel_drops_a_packet_whose_icrc_the_lab_corrupted(self, interop, record_property):
        check_mechanism(record_property, "roce", _roce_here(), "rdma_rxe")
        k, ep, att = interop.kernel, interop.endpoint, interop.attachment
        data = _pattern(5, 200)
        assert k.read_local(K_CORRUPT, len(data)) == bytes(len(data))
        before, rx_before = softroce.hw_counters(att.device), _netdev_rx_packets(att.netdev)
        was = ep.call("counters")["requester"]
        ep.call("write", vaddr=k.base + K_CORRUPT, rkey=k.rkey, data=data.hex(), immediate=None)
        shown = ep.call("inject", corrupt_icrc=True)
        assert shown["opcode"] == "RC_RDMA_WRITE_ONLY" and shown["icrc_ok"] is False, shown
        # The packet reached the device's interface ...
        deadline = time.monotonic() + patience.scaled(5)
        while _netdev_rx_packets(att.netdev) == rx_before and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(patience.scaled(0.2))             # rxe's receive path runs in softirq: settled
        arrived = _netdev_rx_packets(att.netdev) - rx_before
        middle = softroce.hw_counters(att.device)
        dropped = _delta(middle, before, "rcvd_pkts", "sent_pkts")
        print(f"corrupted ICRC {shown['icrc_sent']} (correct {shown['icrc_correct']}) on PSN {shown['psn']}: "
              f"{arrived} packet(s) reached {att.netdev}, the device counted {dropped}")
        assert arrived >= 1
        # ... and the device took none of it: not counted as received, nothing written, no ACK.
        assert dropped == {"rcvd_pkts": 0, "sent_pkts": 0}, dropped
        assert k.read_local(K_CORRUPT, len(data)) == bytes(len(data))
        # The same packet with its ICRC right, as the lab's ACK timer sends it again: accepted.
        run = ep.call("run", timeout_s=patience.scaled(15))
        after = softroce.hw_counters(att.device)
        r = run["requester"]
        record_property("corrupted_icrc", {"reached_netdev": arrived, "device_counted": dropped})
        assert run["done"] and run["completed"][-1] == run["posted"], run
        assert r["local_ack_timeout_err"] - was["local_ack_timeout_err"] == 1
        assert r["retransmitted_packets"] - was["retransmitted_packets"] == 1
        assert _delta(after, middle, "rcvd_pkts")["rcvd_pkts"] == 1
        assert k.read_local(K_CORRUPT, len(data)) == data
