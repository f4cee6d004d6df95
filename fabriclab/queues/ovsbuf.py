"""Room in Open vSwitch's send socket for the queues the model builds.

The userspace datapath transmits on every port through one shared, non-blocking AF_PACKET socket,
and a packet waiting in any port's qdisc is charged to that socket's send buffer. At the default
size (net.core.wmem_default, 208 KiB) a few paused or backed-up ports fill it, after which OVS
drops packets on *every* port of every bridge, the lossless class included. The lab enlarges that
one socket in place: it takes a duplicate of OVS's descriptor (pidfd_getfd) and forces its send
buffer up. The setting lives as long as ovs-vswitchd.
"""

from __future__ import annotations

import ctypes
import os
import socket

SYS_PIDFD_GETFD = 438              # x86_64 and the generic syscall table alike
SO_SNDBUFFORCE = getattr(socket, "SO_SNDBUFFORCE", 32)
SEND_BUFFER_BYTES = 256 * 2**20


def ovs_pid():
    for path in ("/var/run/openvswitch/ovs-vswitchd.pid", "/run/openvswitch/ovs-vswitchd.pid"):
        try:
            return int(open(path).read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return None


def tx_socket_inodes(proc_net_packet="/proc/net/packet"):
    """Inodes of packet sockets bound to no protocol and no interface (send-only sockets)."""
    inodes = set()
    with open(proc_net_packet) as f:
        next(f, None)
        for line in f:
            fields = line.split()
            if len(fields) >= 9 and int(fields[3], 16) == 0 and fields[4] == "0":
                inodes.add(fields[8])
    return inodes


def enlarge_ovs_send_buffer(size=SEND_BUFFER_BYTES):
    """Force OVS's transmit socket's send buffer to `size`. Returns the size now in force, or None
    when OVS has not opened that socket yet (it does on its first transmitted packet)."""
    pid = ovs_pid()
    if pid is None:
        return None
    inodes = tx_socket_inodes()
    libc = ctypes.CDLL(None, use_errno=True)
    for fd_name in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd_name}")
        except OSError:
            continue
        if not (link.startswith("socket:[") and link[8:-1] in inodes):
            continue
        pidfd = os.pidfd_open(pid)
        try:
            dup = libc.syscall(SYS_PIDFD_GETFD, pidfd, int(fd_name), 0)
            if dup < 0:
                return None
            sock = socket.socket(fileno=dup)
            try:
                if sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) < size:
                    sock.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, size // 2)   # the kernel doubles it
                return sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
            finally:
                sock.close()
        finally:
            os.close(pidfd)
    return None
