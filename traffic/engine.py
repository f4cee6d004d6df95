"""One rank's progress through a collective schedule: the part of a collective library that is
not the network.

`RankEngine` walks the rank's step DAG (see `schedules`): a step whose dependencies are complete
runs its local copies and posts its sends through a callback; when every transfer it waits for
has arrived, it runs its reductions and completes, which may make further steps ready. The agent
calls it with the transport's events; the unit tests call it with an in-memory "network", so the
same code is checked without one.

`Memory` holds the rank's regions when values are carried (verify mode): RDMA WRITEs land at byte
offsets and reductions run on float32 views with numpy. Without it only sizes move.
"""

from __future__ import annotations

from fabriclab.traffic.schedules import ELEMENT_BYTES

REGION_IDS = {"input": 1, "output": 2, "work": 3, "scratch": 4}
REGION_NAMES = {v: k for k, v in REGION_IDS.items()}
ADDRESS_SHIFT = 40
"""A remote address is (region id << 40) | byte offset: the R_Key names the region too."""


def remote_address(region, offset):
    return (REGION_IDS[region] << ADDRESS_SHIFT) | offset


def split_address(vaddr):
    return REGION_NAMES.get(vaddr >> ADDRESS_SHIFT), vaddr & ((1 << ADDRESS_SHIFT) - 1)


class Memory:
    """A rank's registered memory: one byte buffer per region, with float32 views for arithmetic.

    `buffers` (optional) gives each region's bytes (writable, at least its size), e.g. slices of
    memory registered with an RDMA device, which a NIC writes into directly; without it each
    region is a fresh bytearray."""

    def __init__(self, regions, buffers=None):
        import numpy as np

        self.np = np
        if buffers is None:
            self.bytes = {name: bytearray(size) for name, size in regions.items()}
        else:
            self.bytes = {name: memoryview(buffers[name]).cast("B")[:size]
                          for name, size in regions.items()}
        self.arrays = {name: np.frombuffer(buf, dtype=np.float32) for name, buf in self.bytes.items()}

    def view(self, region, offset, nbytes):
        return memoryview(self.bytes[region])[offset:offset + nbytes]

    def write(self, region, offset, data):
        buf = self.bytes.get(region)
        if buf is None or offset + len(data) > len(buf):
            raise ValueError(f"write of {len(data)} bytes at {region}+{offset} is outside the region")
        buf[offset:offset + len(data)] = data

    def apply(self, op):
        """out = sum(srcs) over op.nbytes bytes (numpy, float32)."""
        count = op.nbytes // ELEMENT_BYTES
        region, off = op.out
        out = self.arrays[region][off // ELEMENT_BYTES:off // ELEMENT_BYTES + count]
        srcs = [self.arrays[r][o // ELEMENT_BYTES:o // ELEMENT_BYTES + count] for r, o in op.srcs]
        if len(srcs) == 1:
            out[:] = srcs[0]
        else:
            self.np.add(srcs[0], srcs[1], out=out)
            for extra in srcs[2:]:
                out += extra


class RankEngine:
    """Step-DAG progress of one rank for one iteration.

    post_send(transfer) is called for every send in the order steps become ready; the owner
    reports arrivals with `received(tag, nbytes)` (a transfer may arrive as several messages)
    and send completions with `sent(tag)`. `done` is true when every step completed and every
    send was acknowledged.
    """

    def __init__(self, program, post_send, memory=None):
        self.program = program
        self.post_send = post_send
        self.memory = memory
        self.remaining_deps = [len(step.deps) for step in program]
        self.dependents = [[] for _ in program]
        for step in program:
            for dep in step.deps:
                self.dependents[dep].append(step.id)
        self.waiting = [len(step.recvs) for step in program]
        self.step_of_recv = {t.tag: step.id for step in program for t in step.recvs}
        self.arrived = {}                 # tag -> bytes arrived so far
        self.expected = {t.tag: t.nbytes for step in program for t in step.recvs}
        self.unacked_sends = sum(len(step.sends) for step in program)
        self.started = [False] * len(program)
        self.completed_steps = 0

    def start(self):
        for step in self.program:
            if not step.deps:
                self._run(step)

    @property
    def done(self):
        return self.completed_steps == len(self.program) and self.unacked_sends == 0

    def pending_recvs(self):
        """(tag, peer rank, bytes missing) of transfers not fully arrived, for diagnostics."""
        out = []
        for step in self.program:
            for t in step.recvs:
                missing = t.nbytes - self.arrived.get(t.tag, 0)
                if missing > 0:
                    out.append((t.tag, t.src, missing))
        return out

    def _run(self, step):
        self.started[step.id] = True
        if self.memory is not None:
            for op in step.pre:
                self.memory.apply(op)
        for transfer in step.sends:
            self.post_send(transfer)
        self._maybe_complete(step)

    def _maybe_complete(self, step):
        if self.waiting[step.id] or not self.started[step.id]:
            return
        if self.memory is not None:
            for op in step.post:
                self.memory.apply(op)
        self.completed_steps += 1
        for dependent in self.dependents[step.id]:
            self.remaining_deps[dependent] -= 1
            if self.remaining_deps[dependent] == 0:
                self._run(self.program[dependent])

    def received(self, tag, nbytes):
        """`nbytes` more of transfer `tag` arrived (its data is already in memory)."""
        step_id = self.step_of_recv.get(tag)
        if step_id is None:
            raise ValueError(f"transfer {tag} is not addressed to this rank")
        got = self.arrived.get(tag, 0) + nbytes
        self.arrived[tag] = got
        if got > self.expected[tag]:
            raise ValueError(f"transfer {tag} received {got} bytes, more than its "
                             f"{self.expected[tag]}")
        if got == self.expected[tag]:
            self.waiting[step_id] -= 1
            self._maybe_complete(self.program[step_id])

    def sent(self, _tag):
        self.unacked_sends -= 1
