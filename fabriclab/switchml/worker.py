"""A SwitchML worker: algorithm 4 of seed 003 (self-clocked streaming with loss recovery), as a
state machine with no I/O or clock of its own.

The tensor is cut into chunks of k elements; slot i carries chunks i, i+s, i+2s, ... one at a time.
`start(now)` sends the first chunk of every slot (s packets in flight), the result for a slot sends
that slot's next chunk with the pool version flipped, and a slot whose result does not come within
`timeout` resends its packet unchanged (same slot, version and contents: the aggregator's seen
bitmap makes a resend harmless). The caller passes the time to every call and calls `on_timer`
at or after `next_deadline`; a UDP loop and the simulator drive the same code.

int32 tensors are summed exactly (if the sum fits in int32; beyond that it wraps, as the
aggregator's adders do). Floating tensors are quantized per chunk (quantize.py) with an exponent
all workers agree on before sending the chunk: each packet carries the worker's own exponent of the
slot's next chunk, and the result returns the maximum over all workers. The first chunk of a slot
has no predecessor to carry its exponent, so a float tensor opens each slot with a priming use: an
update with no integers whose look-ahead is the exponent of the slot's first chunk. That costs one
round trip per tensor and keeps the aggregator oblivious to quantization.

A result is taken only if it matches the slot's current use (version and offset): a late or
duplicated copy of an earlier result is counted and dropped.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np

from fabriclab.switchml import quantize
from fabriclab.switchml.job import JobConfig, JobConfigError, check_field
from fabriclab.switchml.packet import NO_EXPONENT, U32, Packet, wire_size

PRIME = -1
"""The chunk index of a slot's priming use (float tensors): no data, only a look-ahead."""


@dataclasses.dataclass
class _Slot:
    index: int
    use: int = 0                       # uses started so far; the current one's version is (use-1)%2
    chunk: int = PRIME
    exponent: int = NO_EXPONENT        # the agreed exponent of `chunk`
    packet: Packet | None = None       # what was last sent, for a resend
    deadline: float | None = None      # None: nothing in flight, the slot is done


class Worker:
    """One worker's side of one tensor aggregation.

    `job` is the job as the worker's aggregator sees it: the pool (slots, elements) and the job
    id. `workers` is the number of workers in the whole job (all racks), which sets the
    quantization scale; `worker_id` is this worker's bit at its aggregator.
    """

    def __init__(self, tensor, *, job: JobConfig, worker_id: int, workers: int, timeout: float,
                 after: "Worker | None" = None):
        self.tensor = np.asarray(tensor)
        self.job = job
        self.worker_id = worker_id
        self.workers = workers
        self.timeout = timeout
        owner = f"SwitchML job {job.job_id}"
        check_field(owner, "worker_id", worker_id, 0, job.workers - 1)
        check_field(owner, "workers", workers, job.workers, 1 << 16)
        if not timeout > 0:
            raise JobConfigError(f"{owner}: timeout={timeout!r} must be > 0")
        if self.tensor.dtype == np.int32:
            self.quantized = False
        elif np.issubdtype(self.tensor.dtype, np.floating):
            self.quantized = True
        else:
            raise JobConfigError(f"{owner}: a {self.tensor.dtype} tensor "
                                 "cannot be aggregated; use int32 (exact) or a float type")
        self.flat = self.tensor.ravel()
        if self.flat.size > U32 + 1:
            raise JobConfigError(f"{owner}: {self.flat.size} elements exceed "
                                 "the 32-bit offset")
        k = job.elements
        self.chunks = -(-self.flat.size // k)
        self.own_exponents = quantize.block_exponents(self.flat, k) if self.quantized else []
        self.agreed_exponents = np.full(self.chunks, NO_EXPONENT, dtype=np.int64)
        self.output = np.zeros(self.flat.size,
                               dtype=np.float64 if self.quantized else np.int32)
        self.slots = [_Slot(i) for i in range(min(job.slots, self.chunks))]
        # A job that aggregates again (the next iteration) continues each slot's version where
        # the previous aggregation left it: the aggregator's seen bits still hold that history,
        # so restarting at version 0 would look like a retransmission and fetch the old result.
        self.version_base = [0] * len(self.slots)
        if after is not None:
            if after.job != job or len(after.slots) != len(self.slots) or not after.done:
                raise JobConfigError(f"{owner}: `after` must be a finished aggregation of the same "
                                     "job using as many slots")
            self.version_base = [(b + slot.use) % 2 for b, slot in zip(after.version_base, after.slots)]
        self.finished_slots = 0
        self.counters: collections.Counter[str] = collections.Counter()
        self.started_at: float | None = None
        self.finished_at: float | None = None

    # -- driving ----------------------------------------------------------------------------------

    def start(self, now: float) -> list[Packet]:
        """The first packet of every slot in use."""
        if self.started_at is not None:
            raise RuntimeError("this worker has already started")
        self.started_at = now
        if not self.slots:
            self.finished_at = now
        return [self._begin_use(slot, now) for slot in self.slots]

    def on_packet(self, p: Packet, now: float) -> list[Packet]:
        """Take a result from the aggregator; returns the slot's next chunk, if any."""
        slot = self._slot_awaiting(p)
        if slot is None:
            return []
        self.counters["results"] += 1
        if slot.chunk == PRIME:
            next_chunk = slot.index
        else:
            self._store(slot, p.vector)
            next_chunk = slot.chunk + self.job.slots
        if next_chunk < self.chunks:
            if self.quantized:
                self.agreed_exponents[next_chunk] = p.next_exponent
            return [self._begin_use(slot, now)]
        slot.deadline = None
        slot.packet = None
        self.finished_slots += 1
        if self.done:
            self.finished_at = now
        return []

    def on_timer(self, now: float) -> list[Packet]:
        """Resend the packet of every slot whose timeout has passed."""
        resent = []
        for slot in self.slots:
            if slot.deadline is not None and slot.deadline <= now:
                slot.deadline = now + self.timeout
                self.counters["retransmissions"] += 1
                resent.append(self._count_sent(slot.packet.replace(retransmit=True)))
        return resent

    @property
    def next_deadline(self) -> float | None:
        pending = [slot.deadline for slot in self.slots if slot.deadline is not None]
        return min(pending) if pending else None

    @property
    def done(self) -> bool:
        return self.started_at is not None and self.finished_slots == len(self.slots)

    @property
    def result(self) -> np.ndarray:
        """The aggregated tensor, in the input's shape and dtype."""
        if not self.done:
            raise RuntimeError("the aggregation has not finished")
        return self.output.astype(self.tensor.dtype).reshape(self.tensor.shape)

    def error_bound(self) -> np.ndarray:
        """Per element, the largest |result - exact sum of the inputs|: the quantization bound of
        the element's block, plus the rounding of the result to the output dtype. Zero for int32."""
        if not self.quantized:
            return np.zeros(self.tensor.shape)
        k = self.job.elements
        per_chunk = [quantize.error_bound(int(m), self.workers) for m in self.agreed_exponents]
        bound = np.repeat(per_chunk, k)[:self.flat.size]
        rounding = np.abs(self.output) * np.finfo(self.tensor.dtype).eps
        return (bound + rounding).reshape(self.tensor.shape)

    # -- one slot's uses ---------------------------------------------------------------------------

    def _begin_use(self, slot: _Slot, now: float) -> Packet:
        """Move the slot to its next chunk (or its priming use) and send it."""
        k, s = self.job.elements, self.job.slots
        if slot.use == 0:
            slot.chunk = PRIME if self.quantized else slot.index
        else:
            slot.chunk = slot.index if slot.chunk == PRIME else slot.chunk + s
        slot.use += 1
        if slot.chunk == PRIME:
            vector, offset = np.zeros(0, dtype=np.int32), slot.index * k
            exponent, look_ahead = NO_EXPONENT, self.own_exponents[slot.index]
        else:
            block = self.flat[slot.chunk * k:(slot.chunk + 1) * k]
            offset = slot.chunk * k
            if self.quantized:
                exponent = int(self.agreed_exponents[slot.chunk])
                vector = quantize.quantize(block, exponent, self.workers)
                after = slot.chunk + s
                look_ahead = self.own_exponents[after] if after < self.chunks else NO_EXPONENT
            else:
                vector, exponent, look_ahead = block.copy(), NO_EXPONENT, NO_EXPONENT
        slot.exponent = exponent
        slot.packet = Packet(job=self.job.job_id, worker=self.worker_id, slot=slot.index,
                             version=(slot.use - 1 + self.version_base[slot.index]) % 2,
                             offset=offset, vector=vector,
                             exponent=exponent, next_exponent=look_ahead)
        slot.deadline = now + self.timeout
        return self._count_sent(slot.packet)

    def _slot_awaiting(self, p: Packet) -> _Slot | None:
        """The slot this result is for, or None (counted) if nothing waits for it."""
        if not p.result or p.job != self.job.job_id or p.slot >= len(self.slots):
            self.counters["unexpected"] += 1
            return None
        slot = self.slots[p.slot]
        sent = slot.packet
        if sent is None or p.version != sent.version or p.offset != sent.offset:
            self.counters["duplicates"] += 1        # an earlier use's result, late or copied
            return None
        if p.elements != sent.elements or p.exponent != sent.exponent:
            self.counters["unexpected"] += 1
            return None
        return slot

    def _store(self, slot: _Slot, vector: np.ndarray) -> None:
        start = slot.chunk * self.job.elements
        if self.quantized:
            vector = quantize.dequantize(vector, slot.exponent, self.workers)
        self.output[start:start + len(vector)] = vector

    def _count_sent(self, p: Packet) -> Packet:
        self.counters["sent"] += 1
        self.counters["bytes_sent"] += wire_size(p)
        return p
