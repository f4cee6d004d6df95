"""The collective agent over real RDMA verbs: one per rank, on the rank's soft-RoCE (rdma_rxe)
devices, under the same rank driver as the udp agent.

    python -m fabriclab.traffic.verbs_agent --config RANK.json

It speaks the launcher's protocol (traffic/rank_driver.py: prepare, run, status, stop) with one
exchange added before the first size, since a device numbers its own QPs and keys:

    -> {"hello": r, "verbs": {...}}      per port the device, its RoCEv2 GID and the memory's
                                         R_Key; the memory's base address and region layout;
                                         the device's QP number for each QP of the plan
    <- {"connect": {rank: verbs info}}   every rank's hello
    -> {"connected": r}                  every QP in RTS, receive queues posted

Data path: per port a protection domain, one memory region over all of the rank's regions (one
mmap, laid out once for the largest size; verify mode's numpy Memory is a view of it, so the
device writes straight into the arrays the reductions read), one completion queue with a
completion channel whose file descriptor the event loop selects on. Per QP of the plan an RC QP,
connected with the plan's PSNs. The rank driver cuts transfers into NIC messages and spreads
them over the connection's QPs; each message is an RDMA WRITE WITH IMMEDIATE (immediate: the
iteration round and the transfer tag, see softroce.encode_immediate), at most SEND_WINDOW
outstanding per QP. The device paces and retransmits. A send completion is the responder's acknowledgement;
a receive completion says `byte_len` bytes of transfer `tag` are in memory. The agent counts the
bytes and messages it moved; the launcher adds the device's own counters (hw_counters), which a
process in a host's namespace may not see.

Errors: as the udp agent's. A completion with an error status (the retry counter ran out: the
peer is dead or unreachable) is reported with the peer's rank, then the agent exits 1.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import socket
import sys
import time
from collections import deque

from fabriclab.errors import LabError
from fabriclab.traffic import rank_driver
from fabriclab.traffic.engine import Memory
from fabriclab.traffic.rank_driver import PeerError, QpActivity
from fabriclab.traffic.softroce import IB_MTU, decode_immediate, encode_immediate, ib_timeout

SEND_WINDOW = 16              # RDMA WRITEs outstanding per QP
RECEIVE_DEPTH = 2 * SEND_WINDOW + 8
POLL_BATCH = 32
POLL_INTERVAL_S = 0.001       # without a completion channel fd: how often a busy agent polls
PAGE = mmap.PAGESIZE
LANDING_BYTES = 64            # what a receive WR points at (a WRITE WITH IMMEDIATE uses none of it)
RNR_TIMER = 12                # 0.64 ms before retrying a write the receiver had no WR for

WC_STATUS = {
    1: "local length error", 2: "local QP operation error", 4: "local protection error",
    5: "work request flushed", 9: "remote invalid request", 10: "remote access error",
    11: "remote operation error", 12: "transport retry counter exceeded",
    13: "RNR retry counter exceeded",
}


def layout(regions):
    """{region: byte offset} with every region page-aligned, and the total length including the
    receive landing area at the end."""
    offsets, at = {}, 0
    for name in sorted(regions):
        offsets[name] = at
        at += -(-max(regions[name], 1) // PAGE) * PAGE
    return offsets, at + PAGE


def _events_fd(open_channel):
    """Open a completion channel and find its file descriptor: pyverbs does not expose it, so it
    is the one new `[infinibandevent]` descriptor. Returns (channel, fd or None)."""
    def descriptors():
        found = {}
        for name in os.listdir("/proc/self/fd"):
            try:
                found[int(name)] = os.readlink(f"/proc/self/fd/{name}")
            except OSError:
                pass
        return found

    before = descriptors()
    channel = open_channel()
    fresh = [fd for fd, target in descriptors().items()
             if fd not in before and "infinibandevent" in target]
    return channel, (fresh[0] if len(fresh) == 1 else None)


class VerbsPort:
    """One NIC port: its rxe device, protection domain, memory region, CQ and GID."""

    def __init__(self, index, address, device, buffer_address, length, qps):
        import pyverbs.enums as e
        from pyverbs.cq import CQ, CompChannel
        from pyverbs.device import Context
        from pyverbs.mr import MR
        from pyverbs.pd import PD
        from pyverbs.pyverbs_error import PyverbsError

        self.index, self.address, self.device = index, address, device
        try:
            self.ctx = Context(name=device)
        except PyverbsError as exc:
            raise LabError(f"cannot open RDMA device {device}: {exc}") from None
        self.gid_index, self.gid = self._find_gid()
        self.pd = PD(self.ctx)
        self.mr = MR(self.pd, length, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE,
                     address=buffer_address)
        self.channel, self.event_fd = _events_fd(lambda: CompChannel(self.ctx))
        # Room for every completion its QPs can have outstanding at once.
        cqe = min(self.ctx.query_device().max_cqe, max(256, qps * (SEND_WINDOW + RECEIVE_DEPTH) + 16))
        self.cq = CQ(self.ctx, cqe, None, self.channel, 0)
        self.cq.req_notify()

    def _find_gid(self):
        """The GID table entry of this port's IPv4 address, RoCE v2."""
        want = socket.inet_aton(self.address)
        attr = self.ctx.query_port(1)
        for i in range(attr.gid_tbl_len):
            try:
                gid = self.ctx.query_gid(1, i).gid
            except Exception:                # an empty slot reads as an error on some kernels
                continue
            raw = bytes.fromhex(gid.replace(":", ""))
            if raw[:12] != bytes(10) + b"\xff\xff" or raw[12:] != want:
                continue
            if self._gid_type(i) in (None, "RoCE v2"):
                return i, gid
        raise LabError(f"RDMA device {self.device} has no RoCE v2 GID for {self.address}")

    def _gid_type(self, index):
        """"RoCE v2", another type's name, or None where neither verbs nor sysfs can tell."""
        import pyverbs.enums as e

        try:
            return "RoCE v2" if self.ctx.query_gid_type(1, index) == e.IBV_GID_TYPE_SYSFS_ROCE_V2 else "other"
        except Exception:
            kind = _read(f"/sys/class/infiniband/{self.device}/ports/1/gid_attrs/types/{index}")
            return kind.strip() if kind else None

    def take_event(self):
        """The channel's fd is readable: consume the event and re-arm the CQ."""
        self.channel.get_cq_event(self.cq)
        self.cq.ack_events(1)
        self.cq.req_notify()

    def close(self):
        self.ctx.close()          # pyverbs closes the QPs, CQ, MR, PD and channel with it


def _read(path):
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read()
    except OSError:
        return None


class VerbsQP:
    """An RC QP of the plan: the device's QP, its send queue in software, counters."""

    usable = True        # rxe runs the static plane split only: every QP takes messages

    def __init__(self, spec, port, qp):
        self.label = spec["qpn"]               # the plan's name for it
        self.peer = spec["peer"]
        self.peer_label = spec["peer_qpn"]
        self.channel = spec["channel"]
        self.send_psn, self.recv_psn = spec["send_psn"], spec["recv_psn"]
        self.port = port
        self.port_index = port.index
        self.qp = qp
        self.qpn = qp.qp_num
        self.peer_qpn = None
        self.remote = None                     # (peer base address, rkey, peer layout)
        self.queue = deque()                   # NIC messages not yet posted
        self.outstanding = 0
        self.tx_messages = self.tx_bytes = 0
        self.rx_messages = self.rx_bytes = 0
        self.activity = QpActivity()

    def counters(self):
        return {"qpn": self.qpn, "plan_qpn": self.label, "peer": self.peer,
                "peer_qpn": self.peer_qpn, "channel": self.channel, "plane": self.port.index + 1,
                "device": self.port.device, "messages_completed": self.tx_messages,
                "tx_bytes": self.tx_bytes, "messages_received": self.rx_messages,
                "rx_bytes": self.rx_bytes, "first_send": self.activity.first_send,
                "last_ack": self.activity.last_ack}


class VerbsRnic:
    """RDMA verbs on the rank's rxe devices, for `rank_driver.RankDriver`."""

    def __init__(self, config, driver):
        self.config = config
        self.driver = driver
        self.transport = config["transport"]
        self.rdma = config["rdma"]
        self.ports = []
        self.qps = {}                    # the plan's QP number -> VerbsQP
        self.by_qpn = {}                 # (port index, device QP number) -> VerbsQP
        self.inflight = {}               # wr_id -> (qp, tag, nbytes)
        self.next_wr = 1
        self.buffer = None               # the rank's memory (an mmap), registered on every port
        self._anchor = None              # a ctypes view pinning the mmap's address
        self.offsets = {}
        self.base_address = 0
        self.landing = 0
        self.event_driven = True

    # -- set-up ------------------------------------------------------------------------------------

    def open(self):
        import pyverbs.enums as e
        from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr

        config = self.config
        self.offsets, length = layout(self.rdma["regions"])
        self.buffer = mmap.mmap(-1, length)
        self._anchor = ctypes.c_char.from_buffer(self.buffer)
        self.base_address = ctypes.addressof(self._anchor)
        self.landing = self.base_address + length - PAGE
        for index, port in enumerate(config["ports"]):
            qps = sum(1 for spec in config["qps"] if spec["port"] == index)
            self.ports.append(VerbsPort(index, port["address"], self.rdma["devices"][index],
                                        self.base_address, length, qps))
        self.event_driven = all(p.event_fd is not None for p in self.ports)
        cap = QPCap(max_send_wr=SEND_WINDOW, max_recv_wr=RECEIVE_DEPTH, max_send_sge=1, max_recv_sge=1)
        for spec in config["qps"]:
            port = self.ports[spec["port"]]
            init = QPInitAttr(qp_type=e.IBV_QPT_RC, scq=port.cq, rcq=port.cq, cap=cap)
            attr = QPAttr(port_num=1)
            attr.qp_access_flags = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
            qp = VerbsQP(spec, port, QP(port.pd, init, attr))
            self.qps[qp.label] = qp
            self.by_qpn[(port.index, qp.qpn)] = qp
        return list(self.qps.values())

    def hello(self):
        return {"verbs": {"ports": [{"device": p.device, "gid": p.gid, "gid_index": p.gid_index,
                                     "rkey": p.mr.rkey} for p in self.ports],
                          "base": self.base_address, "layout": self.offsets,
                          "qps": {str(qp.label): qp.qpn for qp in self.qps.values()},
                          "events": self.event_driven}}

    def selectables(self):
        if not self.event_driven:
            return []
        return [(port.event_fd, lambda _now, port=port: port.take_event()) for port in self.ports]

    def on_control(self, message):
        if "connect" in message:
            self.connect(message["connect"])
            return {"connected": self.driver.rank}
        return None

    def connect(self, table):
        """Every QP to RTS against its peer's (from the launcher's table of every rank's hello)."""
        import pyverbs.enums as e
        from pyverbs.addr import GID, AHAttr, GlobalRoute
        from pyverbs.pyverbs_error import PyverbsError
        from pyverbs.qp import QPAttr

        transport = self.transport
        mtu = IB_MTU.get(transport["payload_bytes"])
        if mtu is None:
            raise LabError(f"no RoCE path MTU of {transport['payload_bytes']} bytes")
        tclass = (transport["dscp"] << 2) | transport["ecn"]
        for qp in self.qps.values():
            peer = table[str(qp.peer)]
            pport = peer["ports"][qp.port.index]
            qp.peer_qpn = peer["qps"][str(qp.peer_label)]
            qp.remote = (peer["base"], pport["rkey"], peer["layout"])
            route = GlobalRoute(dgid=GID(pport["gid"]), sgid_index=qp.port.gid_index, hop_limit=64,
                                traffic_class=tclass)
            attr = QPAttr(port_num=1)
            attr.qp_access_flags = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
            attr.path_mtu = mtu
            attr.dest_qp_num = qp.peer_qpn
            attr.rq_psn = qp.recv_psn
            attr.sq_psn = qp.send_psn
            attr.max_dest_rd_atomic = 1
            attr.max_rd_atomic = 1
            attr.min_rnr_timer = RNR_TIMER
            attr.timeout = ib_timeout(transport["ack_timeout_s"])
            attr.retry_cnt = min(7, transport["retry_limit"])
            attr.rnr_retry = 7                   # 7: retry for ever (the receiver reposts promptly)
            attr.ah_attr = AHAttr(gr=route, is_global=1, port_num=1)
            try:
                qp.qp.to_rts(attr)
            except PyverbsError as exc:
                raise LabError(f"connecting QP {qp.qpn:#x} on {qp.port.device} to "
                               f"{self.driver.describe(qp.peer)}: {exc}") from None
            for _ in range(RECEIVE_DEPTH):
                self.post_receive(qp)

    def post_receive(self, qp):
        from pyverbs.wr import SGE, RecvWR

        qp.qp.post_recv(RecvWR(wr_id=0, num_sge=1,
                               sg=[SGE(self.landing, LANDING_BYTES, qp.port.mr.lkey)]))

    def make_memory(self, regions):
        """Verify mode's arrays are views of the registered memory: the device writes into them."""
        views = {name: memoryview(self.buffer)[self.offsets[name]:self.offsets[name] + size]
                 for name, size in regions.items()}
        return Memory(regions, buffers=views)

    def check_schedule(self, schedule):
        if len(schedule.transfers) > (1 << 24):
            raise LabError(f"{len(schedule.transfers)} transfers do not fit the immediate's "
                           f"24-bit tag")
        for name, size in schedule.regions[self.driver.rank].items():
            if size > self.rdma["regions"].get(name, 0):
                raise LabError(f"region {name} of {size} bytes exceeds the registered "
                               f"{self.rdma['regions'].get(name, 0)}")

    def close(self):
        for port in self.ports:
            port.close()

    # -- sending ----------------------------------------------------------------------------------

    def post(self, qp, message, _data):
        """Queue one NIC message on its QP (its bytes are in the registered memory already)."""
        qp.queue.append((message.tag, self.offsets[message.src_region] + message.src_offset,
                         message.nbytes, message.dst_region, message.dst_offset))
        self.pump(qp)

    def pump(self, qp):
        """Post the QP's queued messages while its window has room."""
        import pyverbs.enums as e
        from pyverbs.wr import SGE, SendWR

        while qp.queue and qp.outstanding < SEND_WINDOW:
            tag, local, nbytes, region, offset = qp.queue.popleft()
            base_address, rkey, peer_layout = qp.remote
            wr_id = self.next_wr
            self.next_wr += 1
            immediate = socket.htonl(encode_immediate(self.driver.round, tag))
            wr = SendWR(wr_id=wr_id, opcode=e.IBV_WR_RDMA_WRITE_WITH_IMM, num_sge=1,
                        sg=[SGE(self.base_address + local, nbytes, qp.port.mr.lkey)],
                        send_flags=e.IBV_SEND_SIGNALED, imm_data=immediate)
            wr.set_wr_rdma(rkey, base_address + peer_layout[region] + offset)
            qp.qp.post_send(wr)
            self.inflight[wr_id] = (qp, tag, nbytes)
            qp.outstanding += 1
            qp.activity.sending(nbytes, time.monotonic(), self.driver.clock_offset)

    # -- completions ------------------------------------------------------------------------------

    def poll(self, now):
        """Handle every completion the CQs hold; without completion events, poll again soon
        while anything is under way."""
        for port in self.ports:
            self.drain(port)
        if not self.event_driven and (self.driver.running or self.inflight):
            return now + POLL_INTERVAL_S
        return None

    def drain(self, port):
        """Handle every completion the port's CQ holds."""
        while True:
            count, completions = port.cq.poll(POLL_BATCH)
            if not count:
                return
            now = time.monotonic()
            for wc in completions:
                self.completion(port, wc, now)

    def completion(self, port, wc, now):
        import pyverbs.enums as e

        driver = self.driver
        qp = self.by_qpn.get((port.index, wc.qp_num))
        if wc.status != e.IBV_WC_SUCCESS:
            what = WC_STATUS.get(wc.status, f"completion status {wc.status}")
            if qp is None:
                raise LabError(f"{what} on QP {wc.qp_num:#x} of {port.device}")
            raise PeerError(qp.peer, f"{what} on QP {qp.qpn:#x} ({port.device})")
        if wc.opcode == e.IBV_WC_RDMA_WRITE:
            qp, tag, nbytes = self.inflight.pop(wc.wr_id)
            qp.outstanding -= 1
            qp.tx_messages += 1
            qp.tx_bytes += nbytes
            qp.activity.completed(now)
            qp.activity.acknowledged(now, driver.clock_offset)
            self.pump(qp)
            driver.message_sent(tag, now)
        elif wc.opcode == e.IBV_WC_RECV_RDMA_WITH_IMM:
            self.post_receive(qp)
            round_, tag = decode_immediate(socket.ntohl(wc.imm_data))
            qp.rx_messages += 1
            qp.rx_bytes += wc.byte_len
            driver.message_received(qp, tag, wc.byte_len, now, round_)

    # -- counters ---------------------------------------------------------------------------------

    def totals(self):
        """What the agent counts itself; the launcher adds the devices' counters (softroce)."""
        qps = self.qps.values()
        return {"tx_bytes": sum(qp.tx_bytes for qp in qps),
                "rx_bytes": sum(qp.rx_bytes for qp in qps),
                "messages_sent": sum(qp.tx_messages for qp in qps),
                "messages_received": sum(qp.rx_messages for qp in qps)}

    def qp_counters(self):
        return [qp.counters() for qp in self.qps.values()]

    def plane_bytes(self):
        """Message bytes written through each port so far (rxe owns the packets)."""
        out = [0] * len(self.ports)
        for qp in self.qps.values():
            out[qp.port_index] += qp.tx_bytes
        return out

    def plb_report(self):
        return None

    def port_reports(self):
        return [{"address": p.address, "device": p.device, "gid": p.gid} for p in self.ports]

    def status(self):
        return {"unposted_messages": sum(len(qp.queue) for qp in self.qps.values()),
                "outstanding_writes": len(self.inflight)}


def main(argv=None):
    return rank_driver.main(argv, VerbsRnic, module="fabriclab.traffic.verbs_agent",
                            prog="fabriclab-verbs-agent")


if __name__ == "__main__":
    sys.exit(main())
