"""Pause gates: the tbf qdisc under a port's lossless htb class, closed (PFC XOFF) and opened (XON)
over rtnetlink, in whichever network namespace the port lives.

Why tbf: a changed tbf keeps its queue (only its child fifo's limit is set; a child that is not a
fifo, such as the RED qdisc that marks ECN on full kernels, is left as it is), refills its tokens and
never sends a packet it has no tokens for, so a gate closed to 1 byte/s holds everything behind it
after at most one frame (the one a real port would finish serialising). htb cannot do this: a class
changed to a tiny rate keeps the token debt of the packet it lets through and stays stuck for
minutes after it is opened again. A closed gate drains again as soon as it opens, with or without
new arrivals (checked on the lab's kernel).
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct

from fabriclab.errors import LabError

RTM_NEWQDISC = 36
NLMSG_ERROR = 2
NLM_F_REQUEST, NLM_F_ACK = 0x1, 0x4
TCA_KIND, TCA_OPTIONS = 1, 2
TCA_TBF_PARMS, TCA_TBF_RATE64, TCA_TBF_BURST = 1, 4, 6
TC_LINKLAYER_ETHERNET = 1
CLONE_NEWNET = 0x40000000

GATE_HANDLE = 0x00100000        # "10:" (tc handles are hex)
GATE_PARENT = 0x00010010        # "1:10", the lossless htb class
CLOSED_RATE = 1                 # bytes/s: tbf's smallest rate


def nlattr(kind, data):
    """One netlink attribute (length, type, payload), padded to 4 bytes."""
    length = 4 + len(data)
    return struct.pack("=HH", length, kind) + data + b"\0" * (-length % 4)


def _ratespec(rate_bytes_s):
    return struct.pack("=BBHhHI", 0, TC_LINKLAYER_ETHERNET, 0, 0, 0, min(rate_bytes_s, 0xFFFFFFFF))


def tbf_change_message(seq, ifindex, rate_bytes_s, burst, limit, handle=GATE_HANDLE, parent=GATE_PARENT):
    """An RTM_NEWQDISC 'change' of the tbf at (parent, handle) on ifindex: rate, burst, fifo limit."""
    qopt = _ratespec(rate_bytes_s) + _ratespec(0) + struct.pack("=III", limit, 0, 0)
    options = nlattr(TCA_TBF_PARMS, qopt) + nlattr(TCA_TBF_BURST, struct.pack("=I", burst))
    if rate_bytes_s > 0xFFFFFFFF:
        options += nlattr(TCA_TBF_RATE64, struct.pack("=Q", rate_bytes_s))
    body = (struct.pack("=BxHiIII", socket.AF_UNSPEC, 0, ifindex, handle, parent, 0)
            + nlattr(TCA_KIND, b"tbf\0") + nlattr(TCA_OPTIONS, options))
    return struct.pack("=IHHII", 16 + len(body), RTM_NEWQDISC, NLM_F_REQUEST | NLM_F_ACK, seq, 0) + body


def netlink_error(reply, seq):
    """The errno of the ACK for `seq` in a netlink reply (0: success), None if it is not there."""
    offset = 0
    while offset + 16 <= len(reply):
        length, kind, _flags, rseq, _pid = struct.unpack_from("=IHHII", reply, offset)
        if kind == NLMSG_ERROR and rseq == seq:
            return -struct.unpack_from("=i", reply, offset + 16)[0]
        if length < 16:
            break
        offset += (length + 3) & ~3
    return None


def request(sock, message, seq, doing):
    """Send one netlink request and wait for its ACK; returns the errno (0: done)."""
    sock.send(message)
    while True:
        try:
            err = netlink_error(sock.recv(65536), seq)
        except socket.timeout:
            raise LabError(f"no answer from the kernel {doing}") from None
        if err is not None:
            return err


def route_socket_in(ns_pid):
    """A NETLINK_ROUTE socket bound to the network namespace of process ns_pid (None: ours).
    setns() moves only the calling thread, and only for the socket's creation."""
    if ns_pid is None:
        return socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
    libc = ctypes.CDLL(None, use_errno=True)
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(f"/proc/{ns_pid}/ns/net", os.O_RDONLY)
    except OSError as exc:
        os.close(own)
        raise LabError(f"cannot enter the network namespace of process {ns_pid}: {exc.strerror}") from None
    try:
        if libc.setns(target, CLONE_NEWNET) != 0:
            raise LabError(f"setns into process {ns_pid}'s network namespace failed: "
                           f"{os.strerror(ctypes.get_errno())}")
        try:
            return socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        finally:
            if libc.setns(own, CLONE_NEWNET) != 0:
                raise LabError("could not return to the lab's own network namespace")
    finally:
        os.close(target)
        os.close(own)


class Gates:
    """Open and close gates; one netlink socket per namespace, used from one thread at a time."""

    def __init__(self):
        self._socks = {}
        self._seq = 0

    def _sock(self, ns_pid):
        if ns_pid not in self._socks:
            sock = route_socket_in(ns_pid)
            sock.settimeout(2.0)
            self._socks[ns_pid] = sock
        return self._socks[ns_pid]

    def open(self, ns_pids):
        """Open the sockets of these namespaces now: the first pause of each must not wait for it."""
        for ns_pid in ns_pids:
            self._sock(ns_pid)

    def set(self, ns_pid, ifindex, rate_bytes_s, burst, limit, what=""):
        self._seq += 1
        message = tbf_change_message(self._seq, ifindex, rate_bytes_s, burst, limit)
        err = request(self._sock(ns_pid), message, self._seq, f"changing the gate of {what or ifindex}")
        if err:
            raise LabError(f"changing the pause gate of {what or ifindex} failed: {os.strerror(err)}")

    def close(self):
        for sock in self._socks.values():
            sock.close()
        self._socks.clear()
