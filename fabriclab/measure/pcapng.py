"""The two capture file formats `capture` meets: the classic pcap stream tcpdump writes (read, one
port per stream) and pcapng (written: one file for several ports, each an interface named after
its port, so Wireshark shows which port saw a packet).

Formats: pcap is the libpcap savefile (tcpdump.org/manpages/pcap-savefile.5.txt); pcapng is IETF
draft-ietf-opsawg-pcapng (Section Header, Interface Description and Enhanced Packet blocks). Both
are written here little-endian; pcap is read in either byte order.
"""

from __future__ import annotations

import struct

PCAP_MAGIC_US, PCAP_MAGIC_NS = 0xA1B2C3D4, 0xA1B23C4D
LINKTYPE_ETHERNET = 1
MAX_SNAPLEN = 262_144                  # libpcap's own ceiling: no record may claim more

SHB, IDB, EPB = 0x0A0D0D0A, 0x00000001, 0x00000006
BYTE_ORDER_MAGIC = 0x1A2B3C4D
OPT_END, OPT_COMMENT = 0, 1
SHB_USERAPPL = 4
IF_NAME, IF_DESCRIPTION, IF_TSRESOL = 2, 3, 9


class FormatError(ValueError):
    """A pcap stream that is not one: a bad magic number, or a record longer than any snap length."""


def _read_exactly(stream, n):
    """n bytes from `stream`; None at a clean end of stream (nothing read); FormatError when the
    stream ends inside the n bytes."""
    parts, got = [], 0
    while got < n:
        chunk = stream.read(n - got)
        if not chunk:
            if got == 0:
                return None
            raise FormatError(f"stream ended {n - got} bytes inside a {n}-byte field")
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


class PcapReader:
    """Reads a pcap stream: `linktype`, `snaplen` and `nanoseconds` once the header is read,
    then `packets()` yields (ns since the epoch, original length, data)."""

    def __init__(self, stream):
        self.stream = stream
        head = _read_exactly(stream, 24)
        if head is None:
            raise FormatError("empty stream: no pcap header")
        for order in ("<", ">"):
            magic = struct.unpack(order + "I", head[:4])[0]
            if magic in (PCAP_MAGIC_US, PCAP_MAGIC_NS):
                break
        else:
            raise FormatError(f"not a pcap stream (magic {head[:4].hex()})")
        self.order = order
        self.nanoseconds = magic == PCAP_MAGIC_NS
        _major, _minor, _zone, _sigfigs, self.snaplen, self.linktype = struct.unpack(order + "HHiIII", head[4:])
        self.linktype &= 0x0FFFFFFF          # the top bits carry FCS information, not the type

    def packets(self):
        record = struct.Struct(self.order + "IIII")
        scale = 1 if self.nanoseconds else 1000
        while True:
            head = _read_exactly(self.stream, 16)
            if head is None:
                return
            sec, frac, caplen, length = record.unpack(head)
            if caplen > MAX_SNAPLEN:
                raise FormatError(f"a record claims {caplen} bytes, over any snap length")
            data = _read_exactly(self.stream, caplen) if caplen else b""
            if data is None:
                raise FormatError("stream ended between a record's header and its data")
            yield sec * 1_000_000_000 + frac * scale, length, data


def _option(code, value):
    pad = (-len(value)) % 4
    return struct.pack("<HH", code, len(value)) + value + b"\0" * pad


def _block(kind, body):
    total = 12 + len(body)
    return struct.pack("<II", kind, total) + body + struct.pack("<I", total)


def section_header(application):
    options = _option(SHB_USERAPPL, application.encode()) + _option(OPT_END, b"")
    return _block(SHB, struct.pack("<IHHq", BYTE_ORDER_MAGIC, 1, 0, -1) + options)


def interface_description(name, description="", linktype=LINKTYPE_ETHERNET, snaplen=MAX_SNAPLEN):
    """An interface whose packets carry nanosecond timestamps (if_tsresol 9)."""
    options = _option(IF_NAME, name.encode())
    if description:
        options += _option(IF_DESCRIPTION, description.encode())
    options += _option(IF_TSRESOL, bytes([9])) + _option(OPT_END, b"")
    return _block(IDB, struct.pack("<HHI", linktype, 0, snaplen) + options)


def enhanced_packet(interface, ts_ns, length, data):
    body = struct.pack("<IIIII", interface, ts_ns >> 32, ts_ns & 0xFFFFFFFF, len(data), length)
    return _block(EPB, body + data + b"\0" * ((-len(data)) % 4))
