"""Room in Open vSwitch's sockets for the queues the model builds.

The userspace datapath transmits on every port through one shared, non-blocking AF_PACKET socket,
and a packet waiting in any port's qdisc is charged to that socket's send buffer. At the default
size (net.core.wmem_default, 208 KiB) a few paused or backed-up ports fill it, after which OVS
drops packets on *every* port of every bridge, the lossless class included. The lab enlarges that
one socket in place: it takes a duplicate of OVS's descriptor (pidfd_getfd) and forces its send
buffer up. The setting lives as long as ovs-vswitchd. The per-port receive sockets get the same
treatment (see enlarge_ovs_receive_buffers).
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct

SYS_PIDFD_GETFD = 438              # x86_64 and the generic syscall table alike
SO_SNDBUFFORCE = getattr(socket, "SO_SNDBUFFORCE", 32)
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)
SOL_PACKET, PACKET_STATISTICS = 263, 6
SEND_BUFFER_BYTES = 256 * 2**20
RECEIVE_BUFFER_BYTES = 8 * 2**20


def ovs_pid():
    for path in ("/var/run/openvswitch/ovs-vswitchd.pid", "/run/openvswitch/ovs-vswitchd.pid"):
        try:
            return int(open(path).read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return None


def packet_socket_inodes(proc_net_packet="/proc/net/packet"):
    """(send-only, per-port receive) inodes of packet sockets: the first are bound to no protocol
    and no interface, the second to an interface."""
    tx, rx = set(), set()
    with open(proc_net_packet) as f:
        next(f, None)
        for line in f:
            fields = line.split()
            if len(fields) < 9:
                continue
            if fields[4] != "0":
                rx.add(fields[8])
            elif int(fields[3], 16) == 0:
                tx.add(fields[8])
    return tx, rx


def tx_socket_inodes(proc_net_packet="/proc/net/packet"):
    return packet_socket_inodes(proc_net_packet)[0]


def _ovs_sockets(inodes):
    """Duplicates of OVS's sockets whose inode is in `inodes` (the caller closes each)."""
    pid = ovs_pid()
    if pid is None:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    try:
        for fd_name in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd_name}")
            except OSError:
                continue
            if not (link.startswith("socket:[") and link[8:-1] in inodes):
                continue
            dup = libc.syscall(SYS_PIDFD_GETFD, pidfd, int(fd_name), 0)
            if dup >= 0:
                yield socket.socket(fileno=dup)
    finally:
        os.close(pidfd)


def _force(sock, level_opt, force_opt, size):
    if sock.getsockopt(socket.SOL_SOCKET, level_opt) < size:
        sock.setsockopt(socket.SOL_SOCKET, force_opt, size // 2)       # the kernel doubles it
    return sock.getsockopt(socket.SOL_SOCKET, level_opt)


def enlarge_ovs_send_buffer(size=SEND_BUFFER_BYTES):
    """Force OVS's transmit socket's send buffer to `size`. Returns the size now in force, or None
    when OVS has not opened that socket yet (it does on its first transmitted packet)."""
    for sock in _ovs_sockets(tx_socket_inodes()):
        with sock:
            return _force(sock, socket.SO_SNDBUF, SO_SNDBUFFORCE, size)
    return None


def enlarge_ovs_receive_buffers(size=RECEIVE_BUFFER_BYTES):
    """Force the receive buffer of every port's packet socket (OVS reads each port through its own)
    to `size`: when ovs-vswitchd is starved of CPU for a moment a port's socket fills, and a frame
    dropped there has already been counted into its switch by the model's ingress hook, so it would
    leave bytes held forever. Returns how many sockets were set."""
    count = 0
    for sock in _ovs_sockets(packet_socket_inodes()[1]):
        with sock:
            _force(sock, socket.SO_RCVBUF, SO_RCVBUFFORCE, size)
            count += 1
    return count


def ovs_receive_drops():
    """Frames dropped by OVS's per-port packet sockets since the last call (reading resets the
    kernel's counters)."""
    drops = 0
    for sock in _ovs_sockets(packet_socket_inodes()[1]):
        with sock:
            _packets, dropped = struct.unpack("II", sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8))
            drops += dropped
    return drops
