"""Why a collective stopped moving, in one sentence, from every rank's status.

A ring or a tree stalls as a chain: rank 0 waits for rank 15, which waits for rank 14, ... until
a rank that is not waiting but still has something to send (or has nothing to send, and the
bytes are lost between them). Only that last rank says why: its QPs' queued and unacknowledged
packets, their retries, a DCQCN rate cut to a crawl, a port whose queue holds ACKs back (paused).
`explain_stall` follows the chain from the first stuck rank and describes its end.
"""

from __future__ import annotations

MAX_HOPS = 8                 # links of the chain named before "..."


def explain_stall(first, statuses, describe):
    """`statuses`: rank -> the status an agent answered ({"waiting_for": [{"from", "bytes"}...],
    "sending": [send states], "held_ports": [...]}); ranks that did not answer are missing.
    `describe(rank)` names a rank. Returns the explanation: "<first> did not answer" when `first`
    itself is silent (frozen: the others may have finished the iteration without it)."""
    if first not in statuses:
        return f"{describe(first)} did not answer"
    parts, seen, rank = [], set(), first
    while True:
        if rank in seen:
            return "; ".join(parts + ["a cycle: each of them waits for the next"])
        if len(parts) >= MAX_HOPS:
            return "; ".join(parts + ["..."])
        seen.add(rank)
        wants = statuses[rank].get("waiting_for") or []
        if not wants:
            break
        peer = wants[0]["from"]
        parts.append(f"{describe(rank)} waits for {wants[0]['bytes']} bytes from {describe(peer)}")
        if peer not in statuses:
            return "; ".join(parts + [f"{describe(peer)} did not answer"])
        sending = _sending_to(statuses[peer], rank)
        if sending:
            return "; ".join(parts + [f"{describe(peer)} {sending}"])
        rank = peer
    own = _own_sends(statuses[rank])
    # A sender whose packets go unacknowledged by a rank that did not answer is held up by that
    # rank (frozen, or its host gone): named, as at the end of a chain of waits.
    silent = [describe(s["peer"]) for s in statuses[rank].get("sending") or []
              if s.get("unacked_packets") and s.get("peer") not in statuses]
    tail = [f"{peer} did not answer" for peer in dict.fromkeys(silent)]
    if rank == first:
        return "; ".join([own] + tail)         # tail is empty when own is: no sends
    return "; ".join(parts + [f"{describe(rank)} waits for nobody"
                              + (f" and {own}" if own else ": the bytes were lost or never sent")] + tail)


def _sending_to(status, peer):
    """How `status`'s rank is doing at sending to `peer` ("" when it has nothing for it)."""
    for state in status.get("sending") or []:
        if state.get("peer") == peer:
            return "still has " + _describe_send(state) + _held(status)
    return ""


def _own_sends(status):
    states = status.get("sending") or []
    if states:
        return "still sends: " + ", ".join(f"to rank {s['peer']} " + _describe_send(s) for s in states[:3]) + _held(status)
    if status.get("unacked_sends"):
        return f"{status['unacked_sends']} sends not acknowledged"
    return ""


def _describe_send(state):
    what = [f"{state.get('queued_bytes', 0)} bytes queued", f"{state.get('unacked_packets', 0)} packets unacknowledged"]
    if state.get("retries"):
        what.append(f"{state['retries']} timeouts in a row")
    if state.get("retransmitted_packets"):
        what.append(f"{state['retransmitted_packets']} packets resent")
    if state.get("cc_rate_mbps") is not None:
        what.append(f"{state.get('cc', 'dcqcn').upper()} rate {state['cc_rate_mbps']:g} Mbit/s")
    if state.get("held_lanes"):
        what.append("a packet refused by a full queue")
    return ", ".join(what)


def _held(status):
    ports = status.get("held_ports") or []
    return f" (port {', '.join(map(str, ports))} holding ACKs: its queue is full, paused)" if ports else ""
