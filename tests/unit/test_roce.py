"""Unit tests of the RoCEv2 wire format and the traffic agent's pure parts (no root, no network).

Scapy's `scapy.contrib.roce` is the independent reference: our bytes must decode there with the
same field values, and scapy's ICRC computation must agree with ours.
"""

import json
import random
import struct
import threading

import pytest
from scapy.compat import raw
from scapy.contrib.roce import BTH
from scapy.layers.inet import IP, UDP

from fabriclab.errors import LabError
from fabriclab.traffic import generator, roce, roce_receiver

# -- BTH ------------------------------------------------------------------------------------------

BTH_CASES = [
    dict(opcode=roce.OP_RC_RDMA_WRITE_FIRST, dest_qp=0, psn=0),
    dict(opcode=roce.OP_RC_RDMA_WRITE_MIDDLE, dest_qp=0xFFFFFF, psn=0xFFFFFF),
    dict(opcode=roce.OP_RC_RDMA_WRITE_LAST, dest_qp=0x123456, psn=0xABCDEF, ack_req=True,
         pad_count=3),
    dict(opcode=roce.OP_RC_SEND_ONLY, dest_qp=1, psn=1, solicited=True, migreq=True, tver=0xF,
         pkey=0x8001),
    dict(opcode=roce.OP_CNP, dest_qp=0xD2, psn=0, becn=True),
    dict(opcode=roce.OP_RC_ACKNOWLEDGE, dest_qp=77, psn=5, fecn=True, becn=True),
]


@pytest.mark.parametrize("fields", BTH_CASES)
def test_bth_round_trip(fields):
    data = roce.build_bth(**fields)
    assert len(data) == roce.BTH_LEN
    parsed = roce.parse_bth(data)
    expected = dict(solicited=False, migreq=False, pad_count=0, tver=0, pkey=0xFFFF, fecn=False,
                    becn=False, ack_req=False, resv6=0, resv7=0)
    expected.update(fields)
    assert parsed._asdict() == expected


@pytest.mark.parametrize("fields", BTH_CASES)
def test_bth_fields_match_scapy(fields):
    ours = roce.build_bth(**fields)
    theirs = BTH(ours + b"\x00" * 4)     # scapy's BTH takes the trailing 4 bytes as the ICRC
    assert theirs.opcode == fields["opcode"]
    assert theirs.dqpn == fields["dest_qp"]
    assert theirs.psn == fields["psn"]
    assert theirs.ackreq == int(fields.get("ack_req", False))
    assert theirs.padcount == fields.get("pad_count", 0)
    assert theirs.solicited == int(fields.get("solicited", False))
    assert theirs.migreq == int(fields.get("migreq", False))
    assert theirs.version == fields.get("tver", 0)
    assert theirs.pkey == fields.get("pkey", 0xFFFF)
    assert theirs.fecn == int(fields.get("fecn", False))
    assert theirs.becn == int(fields.get("becn", False))
    assert theirs.resv6 == 0 and theirs.resv7 == 0


def test_parse_bth_reads_scapy_bytes():
    built = raw(BTH(opcode=0x0A, dqpn=0xFEDCBA, psn=0x7FFFFF, ackreq=1, becn=1, padcount=2,
                    icrc=0))
    parsed = roce.parse_bth(built)
    assert (parsed.opcode, parsed.dest_qp, parsed.psn) == (0x0A, 0xFEDCBA, 0x7FFFFF)
    assert parsed.ack_req and parsed.becn and not parsed.fecn and parsed.pad_count == 2


@pytest.mark.parametrize("name,value", [
    ("dest_qp", 1 << 24), ("dest_qp", -1), ("psn", 1 << 24), ("psn", -1),
    ("pad_count", 4), ("opcode", 256), ("pkey", 1 << 16), ("tver", 16), ("psn", True),
    ("dest_qp", 1.0),
])
def test_bth_rejects_out_of_range_fields(name, value):
    fields = dict(opcode=roce.OP_RC_RDMA_WRITE_MIDDLE, dest_qp=1, psn=1)
    fields[name] = value
    with pytest.raises(ValueError, match=name):
        roce.build_bth(**fields)


def test_24_bit_fields_do_not_spill_into_neighbours():
    data = roce.build_bth(roce.OP_RC_RDMA_WRITE_MIDDLE, 0xFFFFFF, 0xFFFFFF)
    assert data[4] == 0 and data[8] == 0        # FECN/BECN/resv6 and A/resv7 stay clear
    assert data[5:8] == b"\xff\xff\xff" and data[9:12] == b"\xff\xff\xff"


def test_parse_bth_needs_12_bytes():
    with pytest.raises(ValueError):
        roce.parse_bth(b"\x00" * 11)


def test_psn_arithmetic_wraps_at_24_bits():
    assert roce.psn_add(0xFFFFFF) == 0
    assert roce.psn_add(0xFFFFFE, 3) == 1
    assert roce.psn_behind(0xFFFFFF, 0)             # just before the wrap
    assert roce.psn_behind(5, 6)
    assert not roce.psn_behind(6, 6)
    assert not roce.psn_behind(7, 6)                # ahead
    assert not roce.psn_behind(0, 0xFFFFFF)         # ahead across the wrap


# -- RETH and segmentation ------------------------------------------------------------------------

def test_reth_round_trip():
    data = roce.build_bth(roce.OP_RC_RDMA_WRITE_FIRST, 9, 9) + roce.build_reth(
        0x0000_7F00_DEAD_B000, 0x1234_5678, 65536)
    assert roce.parse_reth(data) == roce.Reth(0x0000_7F00_DEAD_B000, 0x1234_5678, 65536)
    assert data[12:] == struct.pack("!QII", 0x0000_7F00_DEAD_B000, 0x1234_5678, 65536)


@pytest.mark.parametrize("message,payload,expected", [
    (1000, 1024, [(roce.OP_RC_RDMA_WRITE_ONLY, 1000)]),
    (1024, 1024, [(roce.OP_RC_RDMA_WRITE_ONLY, 1024)]),
    (1025, 1024, [(roce.OP_RC_RDMA_WRITE_FIRST, 1024), (roce.OP_RC_RDMA_WRITE_LAST, 1)]),
    (2048, 1024, [(roce.OP_RC_RDMA_WRITE_FIRST, 1024), (roce.OP_RC_RDMA_WRITE_LAST, 1024)]),
    (4096, 1024, [(roce.OP_RC_RDMA_WRITE_FIRST, 1024), (roce.OP_RC_RDMA_WRITE_MIDDLE, 1024),
                  (roce.OP_RC_RDMA_WRITE_MIDDLE, 1024), (roce.OP_RC_RDMA_WRITE_LAST, 1024)]),
    (3000, 1024, [(roce.OP_RC_RDMA_WRITE_FIRST, 1024), (roce.OP_RC_RDMA_WRITE_MIDDLE, 1024),
                  (roce.OP_RC_RDMA_WRITE_LAST, 952)]),
])
def test_write_message_segments(message, payload, expected):
    segments = roce.write_message_segments(message, payload)
    assert segments == expected
    assert sum(size for _, size in segments) == message


def test_write_opcode_puts_the_immediate_on_the_last_packet():
    with_imm = [roce.write_opcode(i, 3, immediate=True) for i in range(3)]
    assert with_imm == [roce.OP_RC_RDMA_WRITE_FIRST, roce.OP_RC_RDMA_WRITE_MIDDLE,
                        roce.OP_RC_RDMA_WRITE_LAST_WITH_IMMEDIATE]
    assert roce.write_opcode(0, 1, immediate=True) == roce.OP_RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE
    assert roce.write_opcode(0, 1) == roce.OP_RC_RDMA_WRITE_ONLY
    assert [opcode in roce.IMMDT_OPCODES for opcode in with_imm] == [False, False, True]


def test_sender_walks_the_opcode_sequence_and_24_bit_psn():
    config = generator.parse_config({
        "flows": [_flow()], "duration_s": 1, "payload_bytes": 1024, "message_bytes": 3000})
    flow = generator.WriteStream(config.flows[0], config, random.Random(1))
    flow.psn = 0xFFFFFE
    flow.ip_ids.next_id = 0xFFFF
    opcodes, psns, ids, reths = [], [], [], []
    for _ in range(6):
        packet = flow.next_packet()
        ip = IP(packet)
        bth = ip[BTH]
        opcodes.append(bth.opcode)
        psns.append(bth.psn)
        ids.append(ip.id)
        if bth.opcode == roce.OP_RC_RDMA_WRITE_FIRST:
            reths.append(roce.parse_reth(packet[roce.IPV4_HEADER_LEN + roce.UDP_HEADER_LEN:]))
        assert bth.ackreq == (bth.opcode == roce.OP_RC_RDMA_WRITE_LAST)
        assert roce.icrc_ok(packet)
        flow.sent(len(packet) + roce.ETH_HEADER_LEN, 0.0)
    first, middle, last = (roce.OP_RC_RDMA_WRITE_FIRST, roce.OP_RC_RDMA_WRITE_MIDDLE,
                           roce.OP_RC_RDMA_WRITE_LAST)
    assert opcodes == [first, middle, last] * 2
    assert psns == [0xFFFFFE, 0xFFFFFF, 0, 1, 2, 3]
    assert ids == [0xFFFF, 1, 2, 3, 4, 5]            # 0 is skipped: Linux would rewrite it
    assert [r.dma_len for r in reths] == [3000, 3000]
    assert reths[1].vaddr == reths[0].vaddr + 3000
    assert flow.packets == 6 and flow.bytes == 6000


# -- whole packets and the ICRC -------------------------------------------------------------------

PACKET_CASES = [
    dict(opcode=roce.OP_RC_RDMA_WRITE_FIRST, payload=b"\x11" * 1024, reth=(0x1000, 0x55, 4096)),
    dict(opcode=roce.OP_RC_RDMA_WRITE_MIDDLE, payload=bytes(range(256)) * 4, psn=0xFFFFFF),
    dict(opcode=roce.OP_RC_RDMA_WRITE_LAST, payload=b"\xab" * 1021, ack_req=True),
    dict(opcode=roce.OP_RC_RDMA_WRITE_ONLY, payload=b"x" * 7, reth=(0, 1, 7), ack_req=True,
         dscp=0, ecn=roce.ECN_CE, ttl=1, ip_id=0xFFFF),
    dict(opcode=roce.OP_RC_SEND_ONLY, payload=b"", fecn=True, becn=True, dscp=46, ecn=1),
]


def _build(case):
    case = dict(case)
    return roce.build_ipv4_udp_roce_packet(
        "10.0.1.1", "10.0.2.1", 0xC123, case.pop("opcode"), 0x00ABCD, case.pop("psn", 4242),
        case.pop("payload"), **case)


def _scapy_equivalent(case):
    """The same packet built field by field with scapy, ICRC computed by scapy."""
    payload = case["payload"]
    pad = -len(payload) % 4
    ext = roce.build_reth(*case["reth"]) if "reth" in case else b""
    return (IP(src="10.0.1.1", dst="10.0.2.1", id=case.get("ip_id", 1), flags="DF",
               tos=(case.get("dscp", 26) << 2) | case.get("ecn", 2), ttl=case.get("ttl", 64))
            / UDP(sport=0xC123, dport=4791, chksum=0)
            / BTH(opcode=case["opcode"], dqpn=0x00ABCD, psn=case.get("psn", 4242), padcount=pad,
                  ackreq=int(case.get("ack_req", False)), fecn=int(case.get("fecn", False)),
                  becn=int(case.get("becn", False)))
            / (ext + payload + b"\x00" * pad))


@pytest.mark.parametrize("case", PACKET_CASES)
def test_packet_is_byte_identical_to_scapy_build(case):
    assert _build(case) == raw(_scapy_equivalent(case))


@pytest.mark.parametrize("case", PACKET_CASES)
def test_scapy_decodes_packet_and_agrees_on_icrc(case):
    data = _build(case)
    ip = IP(data)
    assert ip.len == len(data) and ip.flags == "DF" and ip.proto == 17
    assert ip.tos == (case.get("dscp", 26) << 2) | case.get("ecn", 2)
    assert ip[UDP].dport == 4791 and ip[UDP].chksum == 0 and ip[UDP].len == len(data) - 20
    bth = ip[BTH]
    assert bth.dqpn == 0x00ABCD and bth.opcode == case["opcode"]
    assert bth.padcount == -len(case["payload"]) % 4
    assert struct.pack("!I", bth.icrc) == data[-4:]
    assert bth.compute_icrc(None) == data[-4:]


def test_ip_header_checksum_is_valid():
    data = _build(PACKET_CASES[0])
    assert roce.ipv4_checksum(data[:20]) == 0           # a correct header sums to 0xFFFF
    rebuilt = IP(data)
    del rebuilt.chksum
    assert raw(rebuilt)[10:12] == data[10:12]


def test_icrc_ignores_fields_routers_rewrite():
    data = bytearray(_build(PACKET_CASES[1]))
    data[1] = (26 << 2) | roce.ECN_CE      # ECN marked CE on the way
    data[8] -= 3                           # three routed hops
    data[10:12] = b"\x12\x34"              # header checksum rewritten accordingly
    data[26:28] = b"\xbe\xef"              # UDP checksum (masked too)
    data[28 + 4] |= 0xC0                   # FECN and BECN set
    assert roce.icrc_ok(bytes(data))


@pytest.mark.parametrize("offset", [4, 12, 20, 28 + 5, 28 + 11, 60, -5])
def test_icrc_covers_everything_else(offset):
    """IP ID (4), source address (12), UDP source port (20), dest QP, PSN, payload."""
    data = bytearray(_build(PACKET_CASES[1]))
    data[offset] ^= 0x01
    assert not roce.icrc_ok(bytes(data))


def test_icrc_of_a_connectx4_capture():
    """A CNP captured from a Mellanox ConnectX-4 Lx (the sample in scapy's RoCE test suite).

    Real hardware computed this ICRC, so it checks our byte order and masking independently of
    scapy's implementation.
    """
    dump = """
        e41d 2dab 2bc2 7cfe 9064 3b32 0800 45c2
        003c 718c 4000 4011 9161 0a00 1101 0a00
        1201 0000 12b7 0028 0000 8100 ffff 4000
        0118 0000 0000 0000 0000 0000 0000 0000
        0000 0000 0000 82fd 002a
    """
    frame = bytes.fromhex("".join(dump.split()))
    datagram = frame[14:]
    assert len(datagram) == 60
    assert roce.compute_icrc(datagram) == bytes.fromhex("82fd002a")
    bth = roce.parse_bth(datagram[28:])
    assert bth.opcode == roce.OP_CNP and bth.becn and bth.dest_qp == 0x118


def test_icrc_rejects_non_ipv4():
    with pytest.raises(ValueError):
        roce.compute_icrc(b"\x60" + b"\x00" * 60)


@pytest.mark.parametrize("opcode,ext", [
    (roce.OP_RC_RDMA_WRITE_FIRST, 16), (roce.OP_RC_RDMA_WRITE_MIDDLE, 0),
    (roce.OP_RC_RDMA_WRITE_LAST, 0), (roce.OP_RC_RDMA_WRITE_ONLY, 16),
])
def test_roce_payload_length(opcode, ext):
    payload = b"p" * 1001
    reth = (1, 2, 3) if ext else None
    data = roce.build_ipv4_udp_roce_packet("10.0.0.1", "10.0.0.2", 0xC000, opcode, 5, 6, payload,
                                           reth=reth)
    udp_payload = data[28:]
    assert roce.roce_payload_length(len(udp_payload), roce.parse_bth(udp_payload)) == 1001
    assert roce.roce_payload_length(10, roce.parse_bth(udp_payload)) == -1


# -- UDP source ports -----------------------------------------------------------------------------

def test_udp_source_port_matches_the_linux_formula_by_hand():
    # 100 * 200 = 20000 (no bits above 20 to fold); low 14 bits 3616, bits 14..19 = 1;
    # 3616 ^ 1 = 3617; 0xC000 | 3617 = 52769.
    assert roce.calc_flow_label(100, 200) == 20000
    assert roce.udp_source_port(100, 200) == 52769
    # A product with high bits: 0xFFFFFF * 0xFFFFFF, folded by >>20 and >>40.
    v = 0xFFFFFF * 0xFFFFFF
    v ^= v >> 20
    v ^= v >> 40
    assert roce.calc_flow_label(0xFFFFFF, 0xFFFFFF) == v & 0xFFFFF


def test_udp_source_port_range_determinism_and_symmetry():
    rng = random.Random(7)
    for _ in range(5000):
        a, b = rng.randrange(1, 1 << 24), rng.randrange(1, 1 << 24)
        port = roce.udp_source_port(a, b)
        assert 0xC000 <= port <= 0xFFFF
        assert port == roce.udp_source_port(a, b)
        assert port == roce.udp_source_port(b, a)     # both ends agree, as Linux intends


def test_distinct_qps_spread_over_source_ports():
    """QP scaling: 16 QPs between one NIC pair should mostly land on different ports."""
    ports = {roce.udp_source_port(0x200 + i, 0x300 + i) for i in range(16)}
    assert len(ports) >= 15
    rng = random.Random(3)
    many = {roce.udp_source_port(rng.randrange(2, 1 << 24), rng.randrange(2, 1 << 24))
            for _ in range(4000)}
    assert len(many) > 3500            # 4000 draws from 16384 ports: ~3560 distinct expected


def test_shared_mode_gives_one_port_per_nic_pair():
    ports = {roce.udp_source_port(q, q + 1000, shared=True, src="10.0.1.1", dst="10.0.2.1")
             for q in range(1, 65)}
    assert len(ports) == 1
    port = ports.pop()
    assert 0xC000 <= port <= 0xFFFF
    assert port == roce.udp_source_port(7, 8, shared=True, src="10.0.2.1", dst="10.0.1.1")
    others = {roce.udp_source_port(1, 2, shared=True, src="10.0.1.1", dst=f"10.0.{i}.1")
              for i in range(2, 40)}
    assert len(others) > 30            # different NIC pairs still differ


def test_explicit_flow_label_overrides_qps():
    assert roce.udp_source_port(1, 2, flow_label=0x12345) == roce.udp_source_port(
        99, 98, flow_label=0x12345) == roce.flow_label_to_udp_sport(0x12345)
    with pytest.raises(ValueError):
        roce.udp_source_port(1, 2, shared=True)
    with pytest.raises(ValueError):
        roce.udp_source_port(1 << 24, 2)


# -- agent config validation ----------------------------------------------------------------------

def _flow(**overrides):
    flow = {"id": "f1", "src": "10.0.1.1", "dst": "10.0.2.1", "src_qpn": 100, "dst_qpn": 200,
            "sport": None, "rate_mbps": 5.0}
    flow.update(overrides)
    return flow


def _config(**overrides):
    config = {"flows": [_flow()], "duration_s": 2.0}
    config.update(overrides)
    return config


def test_valid_config_defaults_and_derived_port():
    config = generator.parse_config(_config())
    assert config.payload_bytes == 1024 and config.dscp == 26 and config.ecn == 2
    assert config.flows[0].sport == roce.udp_source_port(100, 200)
    assert config.flows[0].sport_derived
    explicit = generator.parse_config(_config(flows=[_flow(sport=4791)]))
    assert explicit.flows[0].sport == 4791 and not explicit.flows[0].sport_derived


def test_shared_sport_mode_in_config():
    flows = [_flow(id=f"q{i}", src_qpn=100 + i, dst_qpn=200 + i) for i in range(8)]
    per_qp = generator.parse_config(_config(flows=flows))
    shared = generator.parse_config(_config(flows=flows, sport_mode="shared"))
    assert len({f.sport for f in per_qp.flows}) == 8
    assert len({f.sport for f in shared.flows}) == 1


@pytest.mark.parametrize("overrides,message", [
    (dict(flows=[_flow(rate_mbps=0)]), r"flow 'f1': rate_mbps must be > 0"),
    (dict(flows=[_flow(rate_mbps=-3)]), r"flow 'f1': rate_mbps must be > 0"),
    (dict(flows=[_flow(rate_mbps="fast")]), r"flow 'f1': rate_mbps must be a number"),
    (dict(flows=[_flow(dst="10.0.2.300")]), r"flow 'f1': dst is not an IPv4 address"),
    (dict(flows=[_flow(src="fe80::1")]), r"flow 'f1': src is not an IPv4 address"),
    (dict(flows=[_flow(dst="224.0.0.1")]), r"flow 'f1': dst must be a unicast host address"),
    (dict(flows=[_flow(dst="10.0.1.1")]), r"flow 'f1': src and dst are the same"),
    (dict(flows=[_flow(dst_qpn=1 << 24)]), r"flow 'f1': dst_qpn must be an integer in 1\.\."),
    (dict(flows=[_flow(src_qpn=0)]), r"flow 'f1': src_qpn must be an integer"),
    (dict(flows=[_flow(src_qpn=True)]), r"flow 'f1': src_qpn must be an integer"),
    (dict(flows=[_flow(sport=70000)]), r"flow 'f1': sport must be an integer in 1\.\.65535"),
    (dict(flows=[_flow(colour="red")]), r"flow 'f1': unknown key 'colour'"),
    (dict(flows=[{"id": "f9", "src": "10.0.1.1"}]), r"flow 'f9': missing key 'dst'"),
    (dict(flows=[_flow(), _flow()]), r"flow 'f1': duplicate flow id"),
    (dict(flows=["f1"]), r"flows\[0\]: must be an object"),
    (dict(durration_s=3), r"config: unknown key 'durration_s'"),
    (dict(duration_s=0), r"config: duration_s must be > 0"),
    (dict(duration_s=float("nan")), r"config: duration_s must be a number"),
    (dict(linger_s=-1), r"config: linger_s must be >= 0"),
    (dict(linger_s=1e9), r"config: linger_s must be <= 600 s"),
    (dict(quiet_s=0), r"config: quiet_s must be > 0"),
    (dict(quiet_s="soon"), r"config: quiet_s must be a number"),
    (dict(quiet_s=float("inf")), r"config: quiet_s must be a number"),
    (dict(quiet_s=700), r"config: quiet_s must be <= 600 s"),
    (dict(payload_bytes=1022), r"config: payload_bytes must be a multiple of 4"),
    (dict(payload_bytes=0), r"config: payload_bytes must be an integer in 4\.\."),
    (dict(message_bytes=0), r"config: message_bytes must be an integer"),
    (dict(dscp=64), r"config: dscp must be an integer in 0\.\.63"),
    (dict(ecn=4), r"config: ecn must be an integer in 0\.\.3"),
    (dict(listen="yes"), r"config: listen must be true or false"),
    (dict(sport_mode="random"), r"config: sport_mode must be one of qp, shared"),
    (dict(flows=[], listen=False), r"config: nothing to do"),
    (dict(flows={}), r"config: flows must be a list"),
    (dict(start_at=10_000.0 + 3600), r"config: start_at is 3600 s in the future"),
])
def test_config_errors_name_the_field(overrides, message):
    with pytest.raises(LabError, match=message) as info:
        generator.parse_config(_config(**overrides), now=10_000.0)
    assert "\n" not in str(info.value)


def test_config_requires_duration():
    with pytest.raises(LabError, match="config: missing key 'duration_s'"):
        generator.parse_config({"listen": True})


def test_load_config_reports_bad_json_and_missing_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"listen": true,,}')
    with pytest.raises(LabError, match=r"not valid JSON: .* line 1"):
        generator.load_config(str(bad))
    with pytest.raises(LabError, match="cannot read config"):
        generator.load_config(str(tmp_path / "missing.json"))
    good = tmp_path / "good.json"
    good.write_text(json.dumps(_config()))
    assert generator.load_config(str(good)).flows[0].id == "f1"


def test_cli_exits_2_with_one_line_on_bad_config(tmp_path, capsys):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(_config(flows=[_flow(rate_mbps=0)])))
    assert generator.main(["--config", str(path), "--out", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "rate_mbps must be > 0" in err
    assert not (tmp_path / "r.json").exists()


# -- receive-side accounting ----------------------------------------------------------------------

def _udp_payload(psn, opcode=roce.OP_RC_RDMA_WRITE_MIDDLE, qpn=200, payload=1024):
    reth = (0, 0, payload) if opcode in roce.RETH_OPCODES else None
    return roce.build_ipv4_udp_roce_packet("10.0.1.1", "10.0.2.1", 50000, opcode, qpn, psn,
                                           bytes(payload), reth=reth)[28:]


def _feed(counters, psns, tos=0x6A, **kwargs):
    for i, psn in enumerate(psns):
        data = _udp_payload(psn, **kwargs)
        counters.add(data, len(data), "10.0.1.1", 50000, "10.0.2.1", tos, 100.0 + i)


def test_counters_in_order_across_psn_wrap():
    counters = roce_receiver.ReceiveCounters()
    _feed(counters, [0xFFFFFE, 0xFFFFFF, 0, 1])
    (flow,) = counters.result()
    assert flow["packets"] == 4 and flow["oos"] == 0 and flow["late"] == 0
    assert flow["bytes"] == 4096
    assert flow["wire_bytes"] == 4 * (1024 + roce.ROCE_OVERHEAD + roce.ETH_HEADER_LEN)
    assert (flow["first"], flow["last"]) == (100.0, 103.0)
    assert (flow["src"], flow["sport"], flow["dst"], flow["dst_qpn"]) == (
        "10.0.1.1", 50000, "10.0.2.1", 200)


def test_counters_gap_swap_and_duplicate():
    counters = roce_receiver.ReceiveCounters()
    _feed(counters, [10, 11, 13, 14])          # 12 lost: one oos, resync on 13
    _feed(counters, [16, 15, 17])              # swapped pair: 16 ahead, 15 late
    _feed(counters, [17])                      # duplicate
    (flow,) = counters.result()
    assert flow["packets"] == 8
    assert flow["oos"] == 4 and flow["late"] == 2


def test_counters_reth_bytes_ce_and_separate_keys():
    counters = roce_receiver.ReceiveCounters()
    _feed(counters, [1], opcode=roce.OP_RC_RDMA_WRITE_FIRST, payload=512, tos=0x6B)
    _feed(counters, [1], qpn=201, tos=0x6A)
    first, second = counters.result()
    assert first["bytes"] == 512 and first["ce"] == 1 and first["dst_qpn"] == 200
    assert second["ce"] == 0 and second["dst_qpn"] == 201
    counters.add(b"\x00" * 10, 10, "10.0.1.1", 1, "10.0.2.1", 0, 0.0)
    assert counters.malformed == 1


def test_sender_result_without_sockets_is_empty_but_well_formed():
    config = generator.parse_config(_config())
    sender = generator.HostSender(config, threading.Event(), seed=1)
    result = sender.result()
    assert result["f1"]["packets"] == 0 and result["f1"]["start"] is None
    assert result["f1"]["sport"] == roce.udp_source_port(100, 200)
