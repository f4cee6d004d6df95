"""An in-memory network for the SwitchML state machines: workers and aggregators exchanging
encoded packets over links that lose, duplicate and reorder them, on a virtual clock with a seeded
random generator. It plays the part the UDP processes and the fabric play in the lab, so the
protocol's correctness under loss can be shown without a network; it says nothing about timing
on a real fabric.

Each copy of a packet takes its own delay drawn from `delay`, so packets overtake one another.
Algorithm 3 assumes that no packet is overtaken by one sent two uses of its slot later (on a
switch's direct links, packets of one flow keep their order); delays within (d, 3d) keep that
true here, since two uses of a slot are at least three one-way trips apart.
Multicast is one copy per member, each lost or delayed on its own, as a switch's replication is.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import itertools
import random
from typing import Callable

import numpy as np

from fabriclab.errors import LabError
from fabriclab.switchml.aggregator import Aggregator
from fabriclab.switchml.job import JobConfig
from fabriclab.switchml.packet import Packet, decode, encode
from fabriclab.switchml.pool import MULTICAST, UNICAST, UPSTREAM
from fabriclab.switchml.worker import Worker

DropRule = Callable[[str, str, Packet], bool]
"""(source, destination, packet) -> True to lose this copy: scripted losses for tests."""


class SimulationStuck(LabError):
    """The workers did not finish by the time limit."""


@dataclasses.dataclass(frozen=True)
class LinkModel:
    """Every link's behaviour: each copy is lost with probability `loss`, a packet is sent twice
    with probability `duplicate`, and each copy's delay is uniform in `delay`."""

    loss: float = 0.0
    duplicate: float = 0.0
    delay: tuple[float, float] = (1.0, 2.0)


@dataclasses.dataclass
class _JobLinks:
    children: list[str]          # by worker id at this aggregator
    parent: str | None


class Simulation:
    def __init__(self, *, seed: int = 0, link: LinkModel = LinkModel(),
                 drop: DropRule | None = None):
        self.rng = random.Random(seed)
        self.link = link
        self.drop = drop
        self.now = 0.0
        self.workers: dict[str, Worker] = {}
        self.aggregators: dict[str, Aggregator] = {}
        self.counters: collections.Counter[str] = collections.Counter()
        self._uplink: dict[str, str] = {}
        self._links: dict[tuple[str, int], _JobLinks] = {}
        self._events: list = []
        self._order = itertools.count()
        self._timer_at: dict[str, float] = {}

    # -- building ---------------------------------------------------------------------------------

    def add_aggregator(self, name: str, aggregator: Aggregator) -> Aggregator:
        self.aggregators[name] = aggregator
        return aggregator

    def add_worker(self, name: str, worker: Worker, aggregator: str) -> Worker:
        self.workers[name] = worker
        self._uplink[name] = aggregator
        return worker

    def connect(self, aggregator: str, job_id: int, children: list[str],
                parent: str | None = None) -> None:
        """Where `aggregator` sends job `job_id`'s packets: its workers by id, and its parent."""
        self._links[(aggregator, job_id)] = _JobLinks(list(children), parent)

    # -- running ----------------------------------------------------------------------------------

    def run(self, until: float = 1e6) -> float:
        """Start every worker and run until all are done; returns the time the last finished."""
        for name, worker in self.workers.items():
            for p in worker.start(self.now):
                self._send(name, self._uplink[name], p)
            self._arm_timer(name)
        while not all(worker.done for worker in self.workers.values()):
            if not self._events:
                raise SimulationStuck(f"nothing left to happen at t={self.now} and "
                                      f"{self._unfinished()} have not finished")
            when, _, kind, target, data = heapq.heappop(self._events)
            if when > until:
                raise SimulationStuck(f"{self._unfinished()} have not finished by t={until}")
            self.now = when
            if kind == "timer":
                self._on_timer(target)
            else:
                self._deliver(target, data)
        return max((w.finished_at for w in self.workers.values()), default=self.now)

    def results(self) -> list[np.ndarray]:
        return [worker.result for worker in self.workers.values()]

    def _unfinished(self) -> str:
        return ", ".join(name for name, w in self.workers.items() if not w.done)

    def _send(self, source: str, destination: str, p: Packet) -> None:
        data = encode(p)
        self.counters["sent"] += 1
        copies = 2 if self.rng.random() < self.link.duplicate else 1
        self.counters["duplicated"] += copies - 1
        for _ in range(copies):
            if (self.drop is not None and self.drop(source, destination, p)) \
                    or self.rng.random() < self.link.loss:
                self.counters["lost"] += 1
                continue
            when = self.now + self.rng.uniform(*self.link.delay)
            heapq.heappush(self._events, (when, next(self._order), "deliver", destination, data))

    def _deliver(self, name: str, data: bytes) -> None:
        p = decode(data)
        self.counters["delivered"] += 1
        if name in self.workers:
            for reply in self.workers[name].on_packet(p, self.now):
                self._send(name, self._uplink[name], reply)
            self._arm_timer(name)
            return
        for destination, out in self.aggregators[name].handle(p):
            links = self._links[(name, out.job)]
            if destination.kind == MULTICAST:
                targets = links.children
            elif destination.kind == UNICAST:
                targets = [links.children[destination.worker]]
            else:
                assert destination.kind == UPSTREAM and links.parent is not None, destination
                targets = [links.parent]
            for target in targets:
                self._send(name, target, out)

    def _on_timer(self, name: str) -> None:
        if self._timer_at.get(name) == self.now:
            del self._timer_at[name]
        for p in self.workers[name].on_timer(self.now):
            self._send(name, self._uplink[name], p)
        self._arm_timer(name)

    def _arm_timer(self, name: str) -> None:
        """Make sure an event fires at the worker's earliest deadline (later ones re-arm then)."""
        deadline = self.workers[name].next_deadline
        if deadline is None:
            return
        armed = self._timer_at.get(name)
        if armed is None or deadline < armed:
            self._timer_at[name] = deadline
            heapq.heappush(self._events, (deadline, next(self._order), "timer", name, None))


# -- the two set-ups the tests use -----------------------------------------------------------------

def rack(tensors, *, slots: int, elements: int, timeout: float = 10.0, job_id: int = 1,
         **simulation) -> Simulation:
    """n workers under one aggregator (seed 003's single rack)."""
    sim = Simulation(**simulation)
    job = JobConfig(job_id, len(tensors), slots, elements)
    tor = sim.add_aggregator("tor", Aggregator(slots, slot_elements=elements, name="tor"))
    tor.admit(job)
    names = [f"w{i}" for i in range(len(tensors))]
    for i, (name, tensor) in enumerate(zip(names, tensors)):
        sim.add_worker(name, Worker(tensor, job=job, worker_id=i, workers=len(tensors),
                                    timeout=timeout), "tor")
    sim.connect("tor", job_id, names)
    return sim


def two_level(racks, *, slots: int, elements: int, timeout: float = 20.0, job_id: int = 1,
              **simulation) -> Simulation:
    """Racks of workers, each under a leaf aggregator that forwards to one spine aggregator
    (section 7). `racks` is a list of lists of tensors."""
    sim = Simulation(**simulation)
    total = sum(len(tensors) for tensors in racks)
    spine = sim.add_aggregator("spine", Aggregator(slots, slot_elements=elements, level=2,
                                                   name="spine"))
    spine.admit(JobConfig(job_id, len(racks), slots, elements))
    leaves = [f"leaf{r}" for r in range(len(racks))]
    sim.connect("spine", job_id, leaves)
    for r, (leaf_name, tensors) in enumerate(zip(leaves, racks)):
        job = JobConfig(job_id, len(tensors), slots, elements)
        leaf = sim.add_aggregator(leaf_name, Aggregator(slots, slot_elements=elements,
                                                        name=leaf_name))
        leaf.admit(job, upstream=r)
        names = [f"w{r}.{i}" for i in range(len(tensors))]
        for i, (name, tensor) in enumerate(zip(names, tensors)):
            sim.add_worker(name, Worker(tensor, job=job, worker_id=i, workers=total,
                                        timeout=timeout), leaf_name)
        sim.connect(leaf_name, job_id, names, parent="spine")
    return sim
