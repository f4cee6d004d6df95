"""The two ends of the soft-RoCE interop test (test_kernel_fabric.py): a kernel rxe RC QP driven
with pyverbs from the test process, and the lab's raw-socket RNIC as one QP
(`fabriclab.traffic.rc_endpoint`) in a lab host's network namespace, driven over its stdin.

The kernel's QP lives on an rdma device in the root namespace (an rxe device works only there
on Debian's 6.1, see traffic/softroce.py), so the test process opens it directly, as the verbs
agent does from a host's namespace: the device is shared, its packets go out through the host's
NIC. What each side must know of the other (QPN, PSN, address, R_Key, memory address) goes
between them as JSON lines, out of band."""

from __future__ import annotations

import ctypes
import ipaddress
import json
import mmap
import queue
import secrets
import socket
import subprocess
import sys
import threading
import time

from fabriclab.system import patience
from fabriclab.traffic import roce
from fabriclab.traffic.softroce import IB_MTU, ib_timeout

TRAFFIC_CLASS = (roce.DEFAULT_DSCP << 2) | roce.DEFAULT_ECN


def v4_gid(address):
    """The RoCEv2 GID of an IPv4 address (::ffff:a.b.c.d), written out as verbs prints GIDs."""
    return ipaddress.IPv6Address(f"::ffff:{address}").exploded


class KernelQp:
    """One RC QP on an rxe device with a memory region of `length` bytes (an mmap this process
    reads and writes directly) and a completion queue polled for every work request."""

    def __init__(self, device, address, length=1 << 20, depth=16):
        import pyverbs.enums as e
        from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr

        from fabriclab.traffic.verbs_agent import VerbsPort

        self.device, self.address = device, address
        self.buffer = mmap.mmap(-1, length)
        self._anchor = ctypes.c_char.from_buffer(self.buffer)
        self.base = ctypes.addressof(self._anchor)
        self.port = VerbsPort(0, address, device, self.base, length, 1)
        cap = QPCap(max_send_wr=depth, max_recv_wr=depth, max_send_sge=1, max_recv_sge=1)
        init = QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.port.cq, rcq=self.port.cq, cap=cap)
        attr = QPAttr(port_num=1)
        attr.qp_access_flags = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
        self.qp = QP(self.port.pd, init, attr)
        self.qpn = self.qp.qp_num
        self.psn = secrets.randbelow(roce.PSN_MODULUS)
        self.rkey = self.port.mr.rkey
        self.lkey = self.port.mr.lkey
        self.next_wr = 1

    def describe(self):
        return {"address": self.address, "qpn": self.qpn, "psn": self.psn, "rkey": self.rkey,
                "vaddr": self.base, "gid": self.port.gid, "gid_index": self.port.gid_index}

    def connect(self, peer_address, peer_qpn, peer_psn, payload_bytes, ack_timeout_s):
        """INIT -> RTR -> RTS against the peer, with its PSN, at a path MTU of `payload_bytes`."""
        import pyverbs.enums as e
        from pyverbs.addr import GID, AHAttr, GlobalRoute
        from pyverbs.qp import QPAttr

        route = GlobalRoute(dgid=GID(v4_gid(peer_address)), sgid_index=self.port.gid_index,
                            hop_limit=64, traffic_class=TRAFFIC_CLASS)
        attr = QPAttr(port_num=1)
        attr.qp_access_flags = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
        attr.path_mtu = IB_MTU[payload_bytes]
        attr.dest_qp_num = peer_qpn
        attr.rq_psn = peer_psn
        attr.sq_psn = self.psn
        attr.max_dest_rd_atomic = 1
        attr.max_rd_atomic = 1
        attr.min_rnr_timer = 12
        attr.timeout = ib_timeout(ack_timeout_s)
        attr.retry_cnt = 7
        attr.rnr_retry = 7
        attr.ah_attr = AHAttr(gr=route, is_global=1, port_num=1)
        self.qp.to_rts(attr)

    def write_local(self, offset, data):
        self.buffer[offset:offset + len(data)] = data

    def read_local(self, offset, length):
        return bytes(self.buffer[offset:offset + length])

    def _wr_id(self):
        wr_id, self.next_wr = self.next_wr, self.next_wr + 1
        return wr_id

    def post_recv(self, offset, length):
        from pyverbs.wr import SGE, RecvWR

        wr_id = self._wr_id()
        self.qp.post_recv(RecvWR(wr_id=wr_id, num_sge=1, sg=[SGE(self.base + offset, length, self.lkey)]))
        return wr_id

    def post_send(self, offset, length, *, remote=None, immediate=None):
        """A SEND, or with `remote` = (vaddr, rkey) an RDMA WRITE, of `length` bytes at `offset`
        of the memory; `immediate` (None: none) is a 32-bit value, sent in network order."""
        import pyverbs.enums as e
        from pyverbs.wr import SGE, SendWR

        if remote is None:
            opcode = e.IBV_WR_SEND if immediate is None else e.IBV_WR_SEND_WITH_IMM
        else:
            opcode = e.IBV_WR_RDMA_WRITE if immediate is None else e.IBV_WR_RDMA_WRITE_WITH_IMM
        wr_id = self._wr_id()
        wr = SendWR(wr_id=wr_id, opcode=opcode, num_sge=1, send_flags=e.IBV_SEND_SIGNALED,
                    sg=[SGE(self.base + offset, length, self.lkey)],
                    imm_data=socket.htonl(immediate) if immediate is not None else 0)
        if remote is not None:
            wr.set_wr_rdma(remote[1], remote[0])
        self.qp.post_send(wr)
        return wr_id

    def poll(self, count, timeout_s):
        """Up to `count` work completions, as dicts, waiting at most `timeout_s` for them."""
        import pyverbs.enums as e

        out, end = [], time.monotonic() + timeout_s
        while len(out) < count and time.monotonic() < end:
            n, wcs = self.port.cq.poll(count - len(out))
            if not n:
                time.sleep(0.002)
                continue
            for wc in wcs:
                out.append({"wr_id": wc.wr_id, "status": wc.status, "opcode": wc.opcode,
                            "byte_len": wc.byte_len,
                            "immediate": socket.ntohl(wc.imm_data) if wc.wc_flags & e.IBV_WC_WITH_IMM else None})
        return out

    def close(self):
        self.port.close()                  # the QP, CQ, MR and PD with the context
        del self._anchor
        self.buffer.close()


class EndpointProcess:
    """`python -m fabriclab.traffic.rc_endpoint` in a host's namespace, one command at a time."""

    def __init__(self, host, address, payload_bytes, ack_timeout_s):
        self.proc = host.popen([sys.executable, "-m", "fabriclab.traffic.rc_endpoint", "--address", address,
                                "--payload-bytes", str(payload_bytes), "--ack-timeout", str(ack_timeout_s)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, bufsize=1)
        self.lines = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.ready = self._answer(patience.scaled(20), "ready")["ready"]

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def _answer(self, timeout_s, what):
        try:
            line = self.lines.get(timeout=timeout_s)
        except queue.Empty:
            raise AssertionError(f"rc_endpoint: no answer to {what} within {timeout_s:.0f} s") from None
        if line is None:
            self.proc.wait(timeout=5)
            raise AssertionError(f"rc_endpoint ended (exit {self.proc.returncode}) before answering "
                                 f"{what}: {self.proc.stderr.read().strip()[-500:]}")
        answer = json.loads(line)
        if "error" in answer:
            raise AssertionError(f"rc_endpoint refused {what}: {answer['error']}")
        return answer

    def call(self, op, wait_s=None, **fields):
        """Send command `op` with `fields`; its answer's body, within `wait_s` (by default the
        command's own timeout_s, if any, and 10 s)."""
        self.proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
        self.proc.stdin.flush()
        wait = (fields.get("timeout_s") or 0) + patience.scaled(10) if wait_s is None else wait_s
        return self._answer(wait, op)["ok"]

    def close(self):
        if self.proc.poll() is None:
            try:
                self.call("quit", wait_s=patience.scaled(5))
            except (AssertionError, OSError, ValueError):
                pass
        try:
            self.proc.wait(timeout=patience.scaled(5))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
