"""The capture's two formats: tcpdump's pcap stream read (either byte order, micro- or nanosecond
stamps, refused when it is not one) and pcapng written, read back by scapy's own pcapng reader."""

import io
import struct

import pytest
from scapy.utils import PcapNgReader

from fabriclab.measure import pcapng


def pcap_stream(packets, order="<", nano=True, linktype=1):
    magic = pcapng.PCAP_MAGIC_NS if nano else pcapng.PCAP_MAGIC_US
    out = struct.pack(order + "IHHiIII", magic, 2, 4, 0, 0, 65535, linktype)
    for sec, frac, data, length in packets:
        out += struct.pack(order + "IIII", sec, frac, len(data), length) + data
    return out


@pytest.mark.parametrize("order", ["<", ">"])
@pytest.mark.parametrize("nano", [True, False])
def test_pcap_stream_is_read_in_either_order_and_resolution(order, nano):
    stream = io.BytesIO(pcap_stream([(1700000000, 123, b"\x01" * 60, 60), (1700000001, 0, b"\x02" * 10, 1500)],
                                    order, nano))
    reader = pcapng.PcapReader(stream)
    assert reader.linktype == 1 and reader.snaplen == 65535 and reader.nanoseconds == nano
    got = list(reader.packets())
    assert got == [(1700000000 * 10**9 + 123 * (1 if nano else 1000), 60, b"\x01" * 60),
                   (1700000001 * 10**9, 1500, b"\x02" * 10)]


@pytest.mark.parametrize("data, said", [
    (b"", "empty stream"),
    (b"\x00" * 24, "not a pcap stream"),
    (pcap_stream([(1, 0, b"abc", 3)])[:-1], "ended"),
    (pcap_stream([])[:24] + struct.pack("<IIII", 1, 0, 10**6, 10**6), "over any snap length"),
])
def test_what_is_not_a_pcap_stream_is_refused(data, said):
    with pytest.raises(pcapng.FormatError, match=said):
        list(pcapng.PcapReader(io.BytesIO(data)).packets())


def test_pcapng_is_read_back_by_scapy_with_each_ports_name():
    frames = [bytes(range(60)), bytes(range(61)), b"\xff" * 1514]
    blob = (pcapng.section_header("fabriclab test") + pcapng.interface_description("l1-eth2", "a switch port")
            + pcapng.interface_description("h1-n0") + pcapng.enhanced_packet(0, 1_700_000_000_123_456_789, 60, frames[0])
            + pcapng.enhanced_packet(1, 1_700_000_000_200_000_000, 100, frames[1])
            + pcapng.enhanced_packet(0, 1_700_000_001_000_000_000, 1514, frames[2]))
    assert len(blob) % 4 == 0
    packets = list(PcapNgReader(io.BytesIO(blob)))
    assert [bytes(p) for p in packets] == frames
    assert [p.sniffed_on for p in packets] == ["l1-eth2", "h1-n0", "l1-eth2"]
    assert [p.wirelen for p in packets] == [60, 100, 1514]
    assert float(packets[0].time) == pytest.approx(1_700_000_000.123456789, abs=1e-6)
    assert str(packets[0].time).startswith("1700000000.123456789")
