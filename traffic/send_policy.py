"""What a refused send means to a RoCEv2 sender, and how long it waits before offering it again.

One policy for every sender in the lab: the all-pairs generator's flows and the collective
agent's ports. A raw socket's sendto fails in three ways, and each calls for its own answer:

- busy (ENOBUFS, EAGAIN): the port's queue (its qdisc or socket buffer) is full, because the
  link pushes back or a PFC pause holds it. Every sender on the port waits BUSY_BACKOFF_S, since
  they share that queue, and the refused packet goes first when the port sends again.
- unreachable (ENETUNREACH, EHOSTUNREACH, ENETDOWN, EHOSTDOWN, ENXIO, EPERM): no way out to
  that destination now: a link is down, a route is being replaced, or a netfilter rule refuses
  the packet (EPERM). These are states of the fabric that end, not faults of the agent. The
  sender retries the same packet after UNREACHABLE_BACKOFF_S; the port's other destinations
  carry on.
- fatal (anything else: EMSGSIZE, EINVAL, ...): the packet itself is wrong and a retry cannot
  help.

Every refusal is counted by the port that met it (`enobufs`, `send_errors`).
"""

from __future__ import annotations

import errno

BUSY = "busy"
UNREACHABLE = "unreachable"
FATAL = "fatal"

BUSY_ERRNOS = frozenset({errno.ENOBUFS, errno.EAGAIN})
UNREACHABLE_ERRNOS = frozenset({errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ENETDOWN,
                                errno.EHOSTDOWN, errno.ENXIO, errno.EPERM})

BUSY_BACKOFF_S = 0.0005
"""Wait after a full queue. At the lab's link rates (10-800 Mbit/s) one 1-4 KiB frame leaves the
queue in 0.01-3 ms, so 0.5 ms finds room again about as soon as a NIC would, without spinning
on refused syscalls."""
UNREACHABLE_BACKOFF_S = 0.01
"""Wait after a routing error: a failover (a route withdrawn and replaced by the controller)
takes tens of milliseconds, so retrying sooner only burns CPU on refusals."""


def classify(error):
    """BUSY, UNREACHABLE or FATAL for the OSError a send raised."""
    if error.errno in BUSY_ERRNOS:
        return BUSY
    if error.errno in UNREACHABLE_ERRNOS:
        return UNREACHABLE
    return FATAL


def failure_detail(error, packet_len, dst):
    """One line saying why a fatal send failed, with what to change where we know it."""
    if error.errno == errno.EMSGSIZE:
        return (f"a {packet_len}-byte packet exceeds the MTU towards {dst}; "
                f"lower payload_bytes")
    return f"send to {dst} failed: {error.strerror or error}"
