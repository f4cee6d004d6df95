"""A SwitchML aggregator: the switch's slot memory shared among jobs, each job with its own pool.

This is the whole of the aggregator's logic, as a state machine with no I/O: `handle(packet)`
returns the (destination, packet) pairs to send, so the UDP process beside a ToR and the unit
tests drive the same code. Destinations are ALL_WORKERS (the job's multicast group at this level),
to_worker(id) and PARENT; the caller maps them to addresses per job.

Memory is counted in slots, as on the switch (section 7, "Multi-job"): a job asks for s slots of k
integers (each slot holds two copies), and admission refuses a job whose pool does not fit in what
the other jobs left, or whose k is wider than a slot.
"""

from __future__ import annotations

import collections

from fabriclab.errors import LabError
from fabriclab.switchml.job import JobConfig, check_field
from fabriclab.switchml.packet import MAX_ELEMENTS, U8, U16, Packet
from fabriclab.switchml.pool import ALL_WORKERS, PARENT, Action, Destination, SlotPool, to_worker

__all__ = ["ALL_WORKERS", "PARENT", "Action", "AdmissionError", "Aggregator", "Destination",
           "to_worker"]


class AdmissionError(LabError):
    """A job the aggregator cannot take: its pool does not fit, or its id is taken."""


class Aggregator:
    """`capacity` slots of up to `slot_elements` integers, shared by the admitted jobs; `level`
    is the tier it serves (1: beside a ToR, its workers are hosts; 2: at a spine, its workers are
    leaf aggregators)."""

    def __init__(self, capacity: int, *, slot_elements: int = 256, level: int = 1,
                 name: str = "aggregator"):
        owner = f"SwitchML aggregator {name}"
        check_field(owner, "capacity", capacity, 1, 1 << 24)
        check_field(owner, "slot_elements", slot_elements, 1, MAX_ELEMENTS)
        check_field(owner, "level", level, 1, U8)
        self.capacity = capacity
        self.slot_elements = slot_elements
        self.level = level
        self.name = name
        self.pools: dict[int, SlotPool] = {}
        self.counters: collections.Counter[str] = collections.Counter()

    @property
    def free_slots(self) -> int:
        return self.capacity - sum(pool.job.slots for pool in self.pools.values())

    def admit(self, job: JobConfig, *, upstream: int | None = None) -> SlotPool:
        """Give the job a pool. With `upstream` (this aggregator's worker id at the parent), the
        pool forwards its completed partial sums up instead of multicasting them."""
        if job.job_id in self.pools:
            raise AdmissionError(f"{self.name}: job {job.job_id} is already admitted")
        if job.elements > self.slot_elements:
            raise AdmissionError(f"{self.name}: job {job.job_id} wants {job.elements} elements "
                                 f"per slot, slots here hold {self.slot_elements}")
        if job.slots > self.free_slots:
            held = ", ".join(f"job {j}: {p.job.slots}" for j, p in sorted(self.pools.items()))
            raise AdmissionError(f"{self.name}: job {job.job_id} needs {job.slots} slots, "
                                 f"{self.free_slots} of {self.capacity} are free "
                                 f"({held or 'no jobs'})")
        if upstream is not None:
            check_field(f"{self.name}: job {job.job_id}", "upstream", upstream, 0, U16)
        pool = SlotPool(job, level=self.level, upstream=upstream)
        self.pools[job.job_id] = pool
        return pool

    def release(self, job_id: int) -> None:
        """Free a finished job's slots."""
        if self.pools.pop(job_id, None) is None:
            raise AdmissionError(f"{self.name}: job {job_id} is not admitted")

    def handle(self, packet: Packet) -> list[Action]:
        """What to send in answer to one packet; a packet of an unknown job is counted, dropped."""
        pool = self.pools.get(packet.job)
        if pool is None:
            self.counters["unknown_job"] += 1
            return []
        return pool.handle(packet)

    def totals(self) -> collections.Counter[str]:
        """Every pool's counters added up, with the aggregator's own."""
        total = collections.Counter(self.counters)
        for pool in self.pools.values():
            total.update(pool.counters)
        return total
