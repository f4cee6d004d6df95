"""The OS plumbing a RoCEv2 agent needs in a lab host: raw IPv4 out, UDP 4791 in, and dying
with the process that started it.

Shared by the all-pairs generator and the collective agent so both fail the same clear way.
"""

from __future__ import annotations

import errno
import fcntl
import json
import signal
import socket
import struct
import subprocess

from fabriclab.errors import LabError
from fabriclab.traffic import roce

# Linux socket constants that Python's socket module does not always export.
IP_PKTINFO = getattr(socket, "IP_PKTINFO", 8)
IP_RECVERR = getattr(socket, "IP_RECVERR", 11)
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)
SO_SNDBUFFORCE = getattr(socket, "SO_SNDBUFFORCE", 32)

RECEIVE_BUFFER_BYTES = 8 << 20
SEND_BUFFER_BYTES = 4 << 20
ANCILLARY_SPACE = socket.CMSG_SPACE(12) + socket.CMSG_SPACE(4) + socket.CMSG_SPACE(16)
"""Room for what `open_roce_listener` asks the kernel to attach: IP_PKTINFO, the TOS byte and
SO_TIMESTAMPNS."""


def host_addresses():
    """The IPv4 addresses configured in this network namespace (loopback excluded)."""
    try:
        out = subprocess.run(["ip", "-j", "-4", "addr", "show"], capture_output=True, text=True,
                             check=True, timeout=5).stdout
        links = json.loads(out or "[]")
    except (OSError, subprocess.SubprocessError, ValueError):
        return []
    return [info["local"] for link in links for info in link.get("addr_info", [])
            if info.get("local") and not info["local"].startswith("127.")]


def set_buffer(sock, force_option, option, size):
    """Ask for a big socket buffer; as root the FORCE variant goes past net.core.*mem_max."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, force_option, size)
    except OSError:
        try:
            sock.setsockopt(socket.SOL_SOCKET, option, size)
        except OSError:
            pass


def open_raw_sender(src, what, send_buffer=None):
    """A raw IPv4 socket with IP_HDRINCL bound to `src`, so `ip rule from <src>` picks the NIC.

    `what` names the user of the address in errors (a flow, a rank's port). `send_buffer` bounds
    the bytes the kernel queues for this socket (default SEND_BUFFER_BYTES): under the queue model
    it is the NIC's own transmit queue, which a PFC pause fills and stops.
    """
    try:
        sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    except PermissionError:
        raise LabError("raw sockets need root (or CAP_NET_RAW): run the agent as root") from None
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_HDRINCL, 1)
    # Without IP_RECVERR Linux hides a full qdisc from raw sockets (the packet is dropped and
    # send() succeeds); with it the sender sees ENOBUFS and can back off and count.
    sock.setsockopt(socket.IPPROTO_IP, IP_RECVERR, 1)
    set_buffer(sock, SO_SNDBUFFORCE, socket.SO_SNDBUF, send_buffer or SEND_BUFFER_BYTES)
    try:
        sock.bind((src, 0))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRNOTAVAIL:
            known = ", ".join(host_addresses()) or "none"
            raise LabError(f"{what}: source address {src} is not configured on this host "
                           f"(addresses: {known})") from None
        raise LabError(f"{what}: cannot bind to {src}: {exc.strerror}") from None
    return sock


def open_roce_listener(address="0.0.0.0", *, destinations=False, timestamps=False):
    """A UDP socket on port 4791 reporting each datagram's TOS byte (ECN CE marks), and with
    `destinations` its destination address (IP_PKTINFO), with `timestamps` the kernel's arrival
    time (SO_TIMESTAMPNS, where the kernel has it): see `read_ancillary`.

    Binding the port also keeps the kernel from answering RoCE packets with ICMP port unreachable.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.bind((address, roce.ROCEV2_UDP_PORT))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise LabError(f"UDP port {roce.ROCEV2_UDP_PORT} on {address} is already in use in "
                           "this network namespace (another agent still running?)") from None
        if exc.errno == errno.EADDRNOTAVAIL:
            raise LabError(f"address {address} is not configured on this host "
                           f"(addresses: {', '.join(host_addresses()) or 'none'})") from None
        raise LabError(f"cannot listen on UDP port {roce.ROCEV2_UDP_PORT}: {exc.strerror}") from None
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
    if destinations:
        sock.setsockopt(socket.IPPROTO_IP, IP_PKTINFO, 1)
    if timestamps:
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        except OSError:
            pass
    set_buffer(sock, SO_RCVBUFFORCE, socket.SO_RCVBUF, RECEIVE_BUFFER_BYTES)
    return sock


def read_ancillary(ancillary):
    """(TOS byte, destination address or None, kernel arrival time or None) from recvmsg's
    ancillary data on a socket from `open_roce_listener`."""
    tos, dst, arrival = 0, None, None
    for level, kind, data in ancillary:
        if level == socket.IPPROTO_IP:
            if kind == socket.IP_TOS and data:
                tos = data[0]
            elif kind == IP_PKTINFO and len(data) >= 12:
                dst = socket.inet_ntoa(data[8:12])
        elif level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= 16:
            seconds, nanos = struct.unpack_from("@qq", data)
            arrival = seconds + nanos * 1e-9
    return tos, dst, arrival


SIOCOUTQ = 0x5411
"""ioctl: the bytes a socket has queued and not yet handed to the device (TIOCOUTQ's number)."""


def queued_bytes(sock):
    """The bytes `sock` has waiting below it: for a raw sender, its packets still in the port's
    qdisc (the kernel charges each its truesize). The NIC's local egress queue, in the lab."""
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), SIOCOUTQ, b"\0\0\0\0"))[0]


NETLINK_ROUTE = 0
RTMGRP_LINK = 1
RTM_NEWLINK = 16
RTM_DELLINK = 17
IFF_UP = 0x1
IFF_LOWER_UP = 0x10000
_NLMSG_HEADER = struct.Struct("=IHHII")
_IFINFOMSG = struct.Struct("=BxHiII")


def open_link_watch():
    """A netlink socket that hears every link change in this network namespace (RTMGRP_LINK),
    non-blocking: how a NIC learns at once that its own port lost its carrier."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
    sock.bind((0, RTMGRP_LINK))
    sock.setblocking(False)
    return sock


def parse_link_events(data):
    """[(interface index, carrier up)] from the netlink messages in one datagram: up means
    administratively up with a carrier (IFF_UP and IFF_LOWER_UP); a removed link is down."""
    events, offset = [], 0
    while offset + _NLMSG_HEADER.size <= len(data):
        length, kind, _flags, _seq, _pid = _NLMSG_HEADER.unpack_from(data, offset)
        if length < _NLMSG_HEADER.size:
            break
        body = offset + _NLMSG_HEADER.size
        if kind in (RTM_NEWLINK, RTM_DELLINK) and body + _IFINFOMSG.size <= len(data):
            _family, _type, index, flags, _change = _IFINFOMSG.unpack_from(data, body)
            up = kind == RTM_NEWLINK and flags & IFF_UP and flags & IFF_LOWER_UP
            events.append((index, bool(up)))
        offset += (length + 3) & ~3
    return events


def read_link_events(sock):
    """Every link event waiting on a socket from `open_link_watch`."""
    events = []
    while True:
        try:
            data = sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return events
        events.extend(parse_link_events(data))


def die_with_parent():
    """Ask Linux to send SIGTERM to this process when its parent exits (PR_SET_PDEATHSIG)."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass
