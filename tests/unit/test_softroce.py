"""The soft-RoCE backend without an rxe device: the immediate's encoding, which backend runs (from
made-up doctor findings), the plumbing an attachment plans, and the verbs agent's bookkeeping
driven by fake completions."""

import dataclasses
import mmap
import socket
import time
from types import SimpleNamespace

import pytest

from fabriclab.system import doctor
from fabriclab.errors import LabError
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import load_spec
from fabriclab.traffic import schedules, softroce
from fabriclab.traffic.collective import CollectiveSpec, place_ranks, registered_regions
from fabriclab.traffic.engine import Memory
from fabriclab.traffic.rank_driver import PeerError, RankDriver

RXE_HERE = doctor.Mechanism("RoCE transport", True, "rdma_rxe", "soft-RoCE devices")
UDP_HERE = doctor.Mechanism("RoCE transport", True, "udp", "no rdma_rxe module: the lab's generator")


# -- the immediate ---------------------------------------------------------------------------------

def test_immediate_carries_round_and_tag():
    for round_, tag in ((0, 0), (1, 5), (255, softroce.MAX_TAG), (7, 123456)):
        assert softroce.decode_immediate(softroce.encode_immediate(round_, tag)) == (round_, tag)
    # the round wraps modulo 256, the tag sits in the low 24 bits
    assert softroce.encode_immediate(257, 3) == (1 << 24) | 3
    assert softroce.encode_immediate(1, 0x123456).to_bytes(4, "big") == b"\x01\x12\x34\x56"


def test_immediate_rejects_what_does_not_fit():
    with pytest.raises(ValueError, match="24 bits"):
        softroce.encode_immediate(0, 1 << 24)
    with pytest.raises(ValueError):
        softroce.encode_immediate(0, -1)
    with pytest.raises(ValueError):
        softroce.decode_immediate(1 << 32)


# -- which backend ----------------------------------------------------------------------------------

def test_auto_follows_doctor_and_python_defaults_to_udp():
    assert softroce.select_backend(CollectiveSpec(backend="auto"), RXE_HERE) == "rdma_rxe"
    assert softroce.select_backend(CollectiveSpec(backend="auto"), UDP_HERE) == "udp"
    assert softroce.select_backend(CollectiveSpec(), RXE_HERE) == "udp"       # counters the tests read
    assert softroce.select_backend(CollectiveSpec(backend="udp"), RXE_HERE) == "udp"
    assert softroce.select_backend(CollectiveSpec(backend="rxe"), RXE_HERE) == "rdma_rxe"


@pytest.mark.parametrize("extra, field", [
    (dict(cts=True), "cts"), (dict(dcqcn={}), "dcqcn"), (dict(spray=2), "spray"),
    (dict(sport_mode="shared"), "sport_mode"), (dict(plb="per-plane"), "plb"),
    (dict(reorder="place"), "reorder"), (dict(cc="spx"), "cc")])
def test_udp_only_options_pick_udp_under_auto_and_refuse_rxe(extra, field):
    assert softroce.select_backend(CollectiveSpec(backend="auto", **extra), RXE_HERE) == "udp"
    with pytest.raises(LabError, match=f"collective: {field} needs the udp backend") as err:
        softroce.select_backend(CollectiveSpec(backend="rxe", **extra), RXE_HERE)
    assert "\n" not in str(err.value)


def test_rxe_where_there_is_none_is_a_one_line_error():
    with pytest.raises(LabError, match=r"backend rxe needs soft-RoCE.*no rdma_rxe module") as err:
        softroce.select_backend(CollectiveSpec(backend="rxe"), UDP_HERE)
    assert "\n" not in str(err.value)


def test_backend_is_checked_with_the_spec():
    with pytest.raises(LabError, match="collective: backend must be one of auto, udp, rxe, got 'verbs'"):
        CollectiveSpec(backend="verbs").check()


def test_udp_backend_does_not_probe(monkeypatch):
    monkeypatch.setattr(doctor, "probe", lambda *a, **k: pytest.fail("probed"))
    assert softroce.backend_for(CollectiveSpec(backend="udp")) == "udp"


def test_doctor_needs_module_tool_and_pyverbs_for_rxe():
    full = doctor.Capabilities(rdma_rxe=True, rdma_tool=True, pyverbs=True)
    roce = doctor.mechanisms(full)["roce"]
    assert roce.mechanism == "rdma_rxe" and not roce.planned
    no_pyverbs = doctor.mechanisms(dataclasses.replace(full, pyverbs=False))["roce"]
    assert no_pyverbs.mechanism == "udp" and "pyverbs" in no_pyverbs.note
    no_module = doctor.mechanisms(dataclasses.replace(full, rdma_rxe=False))["roce"]
    assert no_module.mechanism == "udp" and "rdma_rxe" in no_module.note


def test_ib_timeout_covers_the_ack_timeout():
    assert softroce.ib_timeout(4.096e-6 * 2) == 1
    t = softroce.ib_timeout(0.1)
    assert 4.096e-6 * 2 ** t >= 0.1 > 4.096e-6 * 2 ** (t - 1)


# -- attachments ------------------------------------------------------------------------------------

def _attachments(spec_name="default", tag="ab12", **kw):
    fabric = Fabric(load_spec(spec_name))
    ranks = place_ranks(fabric, CollectiveSpec(**kw))
    tables = [softroce.TABLE_BASE + i for i in range(sum(len(r.ports) for r in ranks))]
    return fabric, ranks, softroce.plan_attachments(ranks, fabric, tag, tables)


def test_an_attachment_per_rank_port_with_unique_short_names():
    fabric, ranks, atts = _attachments()
    assert len(atts) == sum(len(r.ports) for r in ranks)
    for field in ("netdev", "peer", "device", "table"):
        assert len({getattr(a, field) for a in atts}) == len(atts), field
    assert all(len(a.netdev) <= 15 and len(a.peer) <= 15 for a in atts)
    assert all(a.device.startswith(softroce.DEVICE_PREFIX) for a in atts)
    by_ip = fabric.ip_owner
    for att in atts:
        # the device speaks with the port's own address and MAC, to every other rank port
        assert by_ip[att.ip].mac == att.mac and by_ip[att.ip].intf == att.nic_intf
        assert att.ip not in dict(att.neighbours)
        assert all(by_ip[ip].mac == mac and by_ip[ip].plane == att.plane for ip, mac in att.neighbours)
        assert len(att.neighbours) == len(ranks) - 1


def test_peers_are_neighbours_without_a_device_of_their_own():
    """The interop test's plan: a device on one rank's port only, the other rank's port (the
    lab's own RNIC) reached as a neighbour."""
    fabric = Fabric(load_spec("tiny"))
    first, second = place_ranks(fabric, CollectiveSpec(hosts=("h1", "h2")))
    (att,) = softroce.plan_attachments([first], fabric, "ab12", [softroce.TABLE_BASE], peers=[second])
    assert att.host == "h1" and att.neighbours == ((second.ports[0].ip, second.ports[0].mac),)
    (alone,) = softroce.plan_attachments([first], fabric, "ab12", [softroce.TABLE_BASE])
    assert alone.neighbours == ()


def test_multiplane_ports_get_their_plane_neighbours_only():
    _, ranks, atts = _attachments("spectrumx_fig16")
    planes = {a.plane for a in atts}
    assert len(planes) > 1
    for att in atts:
        assert att.subnet == f"10.{att.plane}.0.0/16"
        assert all(ip.startswith(f"10.{att.plane}.") for ip, _ in att.neighbours)


def test_the_address_is_local_only_to_its_own_device():
    _, _, atts = _attachments()
    att = atts[0]
    root = att.root_script(link_group=77)
    assert f"ip link set {att.netdev} address {att.mac} mtu {att.mtu} group 77" in root
    moved = root.index(f"ip route del local {att.ip} dev {att.netdev} table local")
    assert root.index(f"ip link set {att.netdev} up") < moved     # link-up would add it back
    assert f"ip route add local {att.ip} dev {att.netdev} table {att.table}" in root
    rules = [line for line in root if line.startswith("ip rule add")]
    assert rules == [f"ip rule add from {att.ip} iif lo lookup {att.table} pref {softroce.RULE_PREF} "
                     f"protocol {softroce.RULE_PROTOCOL}",
                     f"ip rule add iif {att.netdev} lookup {att.table} pref {softroce.RULE_PREF} "
                     f"protocol {softroce.RULE_PROTOCOL}"]
    # rules after the routes: a rule whose table is empty is a leftover to `clean`
    local_route = f"ip route add local {att.ip} dev {att.netdev} table {att.table}"
    assert root.index(rules[0]) > root.index(local_route)


def test_roce_is_redirected_both_ways_in_the_host():
    _, _, atts = _attachments()
    att = atts[0]
    host = "\n".join(att.host_script())
    assert (f"tc filter add dev {att.peer} ingress pref {softroce.FILTER_PREF} protocol ip u32 "
            f"match ip protocol 17 0xff match ip dport 4791 0xffff "
            f"action mirred egress redirect dev {att.nic_intf}") in host
    assert f"match ip dst {att.ip}/32 action mirred egress redirect dev {att.peer}" in host


def test_too_few_tables_is_refused():
    fabric = Fabric(load_spec("tiny"))
    ranks = place_ranks(fabric, CollectiveSpec())
    with pytest.raises(ValueError):
        softroce.plan_attachments(ranks, fabric, "ab12", [])


# -- registered memory -------------------------------------------------------------------------------

def test_memory_over_registered_buffers_writes_in_place():
    from fabriclab.traffic.verbs_agent import PAGE, layout

    offsets, length = layout({"output": 100, "input": 4096 + 4, "scratch": 8})
    assert all(off % PAGE == 0 for off in offsets.values())
    assert offsets["input"] + 2 * PAGE <= offsets["output"] and length % PAGE == 0
    backing = bytearray(length)
    views = {name: memoryview(backing)[off:off + 200] for name, off in offsets.items()}
    memory = Memory({"output": 8, "scratch": 8}, buffers=views)
    backing[offsets["scratch"]:offsets["scratch"] + 8] = bytes([0, 0, 128, 63]) * 2    # 1.0f, 1.0f
    memory.arrays["output"][:] = 2.0
    memory.apply(schedules.LocalOp(("output", 0), (("output", 0), ("scratch", 0)), 8))
    assert list(memory.arrays["output"]) == [3.0, 3.0]
    assert backing[offsets["output"]:offsets["output"] + 4] == bytes([0, 0, 64, 64])     # 3.0f
    assert len(memory.bytes["output"]) == 8


# -- the verbs agent's bookkeeping, with fake QPs ---------------------------------------------------------

class FakeQP:
    def __init__(self, qpn):
        self.qp_num, self.sent, self.receives = qpn, [], 0

    def post_send(self, wr, bad=None):
        self.sent.append(wr)

    def post_recv(self, wr, bad=None):
        self.receives += 1


def _verbs_agent(rank=0, n=2, size=4096, verify=False):
    """A rank driver over a VerbsRnic whose device QPs are fakes, opened as the driver opens
    it but for the device and the launcher; its memory registered for both modes, as the
    launcher registers it."""
    pytest.importorskip("pyverbs")
    from fabriclab.traffic import verbs_agent

    sched = schedules.build("allreduce", n, size)
    both = [sched, schedules.build("allreduce", n, size, in_place=True)]
    qps, fake = [], {}
    for peer in range(n):
        if peer != rank:
            qps.append({"qpn": 100 + peer, "peer": peer, "peer_qpn": 200 + rank, "channel": 0,
                        "port": 0, "index": 0, "send_psn": 1, "recv_psn": 2})
    config = {"rank": rank, "ranks": [{"rank": r, "host": f"h{r + 1}", "addresses": [f"10.1.1.{r + 1}"]}
                                      for r in range(n)],
              "qps": qps, "ports": [{"address": f"10.1.1.{rank + 1}", "rate_mbps": 10}],
              "transport": {"payload_bytes": 4096, "chunk_bytes": 1024, "qp_method": "round-robin",
                            "ack_timeout_s": 0.1, "retry_limit": 7, "dscp": 26, "ecn": 2},
              "collective": {"collective": "allreduce", "algorithm": sched.algorithm, "channels": 1,
                             "piece_bytes": 65536, "imbalance": 4.0, "seed": 1, "root": 0},
              "sizes": [size], "verify": verify, "data_seed": 1, "control": "/nonexistent",
              "rdma": {"devices": ["fake0"], "regions": registered_regions(both, rank)}}

    def fake_open(rnic):
        port = SimpleNamespace(index=0, device="fake0", address=f"10.1.1.{rank + 1}", gid="::", gid_index=0,
                               mr=SimpleNamespace(lkey=1, rkey=2))
        rnic.ports = [port]
        rnic.offsets, length = verbs_agent.layout(config["rdma"]["regions"])
        rnic.buffer = mmap.mmap(-1, length)
        rnic.base_address, rnic.landing = 0x10000, 0x90000
        for spec in qps:
            qp = verbs_agent.VerbsQP(spec, port, FakeQP(0x11 + spec["peer"]))
            qp.remote = (0x20000, 7, rnic.offsets)
            fake[qp.peer] = qp
            rnic.qps[qp.label] = qp
            rnic.by_qpn[(0, qp.qpn)] = qp
        return list(rnic.qps.values())

    driver = RankDriver(config, verbs_agent.VerbsRnic)
    driver.rnic.open = lambda: fake_open(driver.rnic)
    driver.rnic.event_driven = False
    told = []
    driver.tell = told.append
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("fabriclab.traffic.rank_driver.ControlChannel", lambda path: None)
        patch.setattr(driver.selector, "register", lambda *a, **k: None)
        driver.open()
    return driver, sched, fake, told


def _wc(opcode, qp, wr_id=0, imm=0, nbytes=0, status=0):
    return SimpleNamespace(status=status, opcode=opcode, qp_num=qp.qpn, wr_id=wr_id,
                           imm_data=socket.htonl(imm), byte_len=nbytes)


def test_verbs_agent_writes_with_immediates_and_completes_on_completions():
    import pyverbs.enums as e

    driver, sched, fake, told = _verbs_agent()
    rnic = driver.rnic
    hello = told.pop(0)
    assert hello["hello"] == 0 and hello["verbs"]["qps"] == {"101": 0x12}     # plan -> device QPN
    assert hello["verbs"]["ports"] == [{"device": "fake0", "gid": "::", "gid_index": 0, "rkey": 2}]
    driver.prepare(0)
    driver.run(0, time.time())
    # a fast peer's first write lands before this rank's round begins
    incoming = [t for t in sched.transfers if t.dst == 0]
    early = incoming[0]
    rnic.completion(rnic.ports[0], _wc(e.IBV_WC_RECV_RDMA_WITH_IMM, fake[1],
                                       imm=softroce.encode_immediate(1, early.tag),
                                       nbytes=early.nbytes), time.monotonic())
    assert driver.engine is None and driver.early == [(1, early.tag, early.nbytes)]
    driver.begin(time.monotonic())
    qp = fake[1]
    for t in incoming[1:]:                  # the engine takes arrivals for any of its steps
        rnic.completion(rnic.ports[0], _wc(e.IBV_WC_RECV_RDMA_WITH_IMM, qp,
                                           imm=softroce.encode_immediate(1, t.tag),
                                           nbytes=t.nbytes), time.monotonic())
    while driver.engine is not None:
        assert qp.qp.sent, "the engine stalled with nothing posted"
        wr = qp.qp.sent.pop(0)
        assert wr.opcode == e.IBV_WR_RDMA_WRITE_WITH_IMM
        round_, tag = softroce.decode_immediate(socket.ntohl(wr.imm_data))
        assert round_ == 1 and sched.transfers[tag].src == 0
        rnic.completion(rnic.ports[0], _wc(e.IBV_WC_RDMA_WRITE, qp, wr_id=wr.wr_id), time.monotonic())
    done = [m for m in told if "done" in m]
    assert len(done) == 1 and done[0]["counters"]["tx_bytes"] == sched.sent_bytes(0)
    assert done[0]["counters"]["messages_received"] == len(incoming)
    assert qp.qp.receives == len(incoming)                                  # each reposted


def test_registered_memory_holds_every_size_in_both_modes():
    """The verbs agent registers its memory once: in place a non-root Gather rank has a receive
    buffer (it sends from its slice of it) and AlltoAllv's one buffer is as large as the larger
    of its send and receive sides; a schedule that does not fit is refused in one line."""
    pytest.importorskip("pyverbs")
    from fabriclab.traffic import verbs_agent

    cases = [schedules.build(c, 4, size, root=1, in_place=mode, seed=3)
             for c in ("gather", "alltoallv") for size in (4096, 8192) for mode in (False, True)]
    gathers, alltoallvs = cases[:4], cases[4:]
    assert registered_regions(gathers, 0) == {"input": 2048, "output": 8192}
    biggest = max(max(s.regions[0]["input"], s.regions[0]["output"]) for s in alltoallvs if not s.in_place)
    assert registered_regions(alltoallvs, 0)["output"] == biggest
    rnic = verbs_agent.VerbsRnic({"rdma": {"regions": registered_regions(cases, 0)}, "transport": {}},
                                 SimpleNamespace(rank=0))
    for schedule in cases:
        rnic.check_schedule(schedule)
    rnic.rdma["regions"] = registered_regions([s for s in gathers if not s.in_place], 0)
    with pytest.raises(LabError, match="region output of 8192 bytes exceeds the registered 0"):
        rnic.check_schedule(gathers[3])


def test_verbs_agent_sends_in_place_from_the_registered_receive_buffer(monkeypatch):
    """In place the input is put where the device reads it, in the receive buffer's registered
    bytes: every WRITE reads from that region, and lands in the peer's receive buffer or
    scratch, at the addresses the schedule gives."""
    import pyverbs.enums as e
    import pyverbs.wr

    local, remote = [], []

    def sge(addr, length, lkey):
        local.append((addr, length))
        return real_sge(addr, length, lkey)

    class Wr(pyverbs.wr.SendWR):
        def set_wr_rdma(self, rkey, addr):
            remote.append(addr)
            super().set_wr_rdma(rkey, addr)

    real_sge = pyverbs.wr.SGE
    monkeypatch.setattr(pyverbs.wr, "SGE", sge)
    monkeypatch.setattr(pyverbs.wr, "SendWR", Wr)
    driver, _sched, fake, _told = _verbs_agent(verify=True)
    rnic = driver.rnic
    driver.prepare(0, in_place=True)
    schedule = driver.schedule
    assert schedule.buffers[0]["input"] == schedules.Buffer("output", 0, 4096)
    registered = rnic.buffer[rnic.offsets["output"]:rnic.offsets["output"] + 4096]
    assert registered == driver.input.tobytes() and any(driver.input)
    driver.run(0, time.time())
    driver.begin(time.monotonic())
    qp = fake[1]
    for t in [t for t in schedule.transfers if t.dst == 0]:
        rnic.completion(rnic.ports[0], _wc(e.IBV_WC_RECV_RDMA_WITH_IMM, qp, imm=softroce.encode_immediate(1, t.tag),
                                           nbytes=t.nbytes), time.monotonic())
    while driver.engine is not None:
        wr = qp.qp.sent.pop(0)
        rnic.completion(rnic.ports[0], _wc(e.IBV_WC_RDMA_WRITE, qp, wr_id=wr.wr_id), time.monotonic())
    chunk = 1024
    sends = [t for t in schedule.transfers if t.src == 0]
    writes = [(addr, length) for addr, length in local if addr != rnic.landing]     # not receive WRs
    assert {t.src_region for t in sends} == {"output"} and writes
    assert writes == [(rnic.base_address + rnic.offsets["output"] + t.src_off + off, chunk)
                     for t in sends for off in range(0, t.nbytes, chunk)]
    peer_base, _rkey, peer_layout = qp.remote
    assert remote == [peer_base + peer_layout[t.dst_region] + t.dst_off + off
                      for t in sends for off in range(0, t.nbytes, chunk)]


def test_verbs_agent_catches_a_write_from_another_round():
    import pyverbs.enums as e

    driver, sched, fake, _told = _verbs_agent()
    driver.prepare(0)
    driver.run(0, time.time())
    t = [t for t in sched.transfers if t.dst == 0][0]
    driver.rnic.completion(driver.rnic.ports[0],
                           _wc(e.IBV_WC_RECV_RDMA_WITH_IMM, fake[1],
                               imm=softroce.encode_immediate(5, t.tag), nbytes=t.nbytes),
                           time.monotonic())
    with pytest.raises(LabError, match="round 5 arrived before round 1 began"):
        driver.begin(time.monotonic())


def test_a_failed_completion_names_the_peer():
    import pyverbs.enums as e

    driver, _sched, fake, _told = _verbs_agent()
    with pytest.raises(PeerError, match="transport retry counter exceeded on QP 0x12") as err:
        driver.rnic.completion(driver.rnic.ports[0],
                               _wc(e.IBV_WC_RDMA_WRITE, fake[1], status=e.IBV_WC_RETRY_EXC_ERR),
                               time.monotonic())
    assert err.value.peer == 1


def test_launcher_adds_the_devices_counters(monkeypatch):
    _, ranks, atts = _attachments("tiny")
    job = softroce.SoftRoce(lab=None, ranks=ranks)
    job.attachments = atts
    raw = {att.device: {"sent_pkts": 10, "rcvd_seq_err": 1, "lifespan": 12} for att in atts}
    monkeypatch.setattr(softroce, "hw_counters", lambda device: dict(raw[device]))
    marks = job.counters()
    assert marks[0] == {**dict.fromkeys(softroce.DEVICE_COUNTERS.values(), 0),
                        "tx_packets": 10, "naks_received": 1}
    raw[atts[0].device]["sent_pkts"] = 25
    done = {0: {"counters": {"tx_bytes": 5}}, 1: {"counters": {}}}
    job.add_iteration_counters(done, marks)
    assert done[0]["counters"]["tx_packets"] == 15 and done[0]["counters"]["tx_bytes"] == 5
    assert done[1]["counters"]["tx_packets"] == 0
    finals = {0: {"totals": {}, "ports": [{"device": atts[0].device}]}}
    job.add_final_counters(finals)
    assert finals[0]["totals"]["tx_packets"] == 25
    assert finals[0]["ports"][0]["hw_counters"]["lifespan"] == 12


def test_cli_takes_a_backend():
    from fabriclab.cli import collective as collective_cmd

    args = collective_cmd.prompt_parser().parse_args(["--backend", "rxe", "--sizes", "64K"])
    assert collective_cmd.spec_from_args(args).backend == "rxe"
    assert collective_cmd.spec_from_args(collective_cmd.prompt_parser().parse_args([])).backend == "auto"
