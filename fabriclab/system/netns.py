"""Commands in a lab node's network namespace, by the PID of a process in it (None: the root one).

Interfaces are read with `ip`, not from /sys: /sys/class/net shows the namespace it was mounted in,
not the one nsenter enters.
"""

from __future__ import annotations

import subprocess

from fabriclab.errors import LabError


def in_namespace(pid, argv):
    """`argv` run in the network namespace of process `pid` (None: as it is)."""
    return argv if pid is None else ["nsenter", f"--net=/proc/{pid}/ns/net", *argv]


def interface_indexes(pid, what="a node"):
    """{interface name: ifindex} of the namespace of process `pid` (None: the root namespace)."""
    proc = subprocess.run(in_namespace(pid, ["ip", "-o", "link", "show"]), capture_output=True, text=True)
    if proc.returncode != 0:
        raise LabError(f"cannot list the interfaces of {what}: {(proc.stderr.strip().splitlines() or ['?'])[0]}")
    out = {}
    for line in proc.stdout.splitlines():
        # "7: s1-eth1@if6: <BROADCAST,...> mtu ..." (the @ part names a veth's peer)
        index, _, rest = line.partition(":")
        name = rest.strip().split(":", 1)[0].split("@", 1)[0]
        if index.strip().isdigit() and name:
            out[name] = int(index)
    return out
