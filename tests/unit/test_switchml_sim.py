"""Whole aggregations in the in-memory network: workers, one aggregator or a leaf/spine hierarchy,
and links that lose, duplicate and reorder. int32 sums are exact against numpy, float32 sums are
within the quantization bound, and loss anywhere (updates, results, part of a multicast, partials
between levels) still ends with every worker holding the same, right result."""

import collections

import numpy as np
import pytest

from fabriclab.switchml import sim
from fabriclab.switchml.aggregator import AdmissionError, Aggregator
from fabriclab.switchml.job import JobConfig
from fabriclab.switchml.sim import LinkModel, Simulation, SimulationStuck
from fabriclab.switchml.worker import Worker


def int_tensors(n, size, seed=0, *, high=None):
    rng = np.random.default_rng(seed)
    high = high if high is not None else (2**31 - 1) // n
    return [rng.integers(-high, high, size=size, dtype=np.int32) for _ in range(n)]


def float_tensors(n, size, seed=0):
    """Blocks of widely different magnitudes, some all zero, as gradients are."""
    rng = np.random.default_rng(seed)
    magnitude = 10.0 ** rng.uniform(-12, 6, size=size)
    tensors = [(rng.standard_normal(size) * magnitude).astype(np.float32) for _ in range(n)]
    for t in tensors:
        t[: min(size, 16)] = 0.0
    return tensors


def exact_int_sum(tensors):
    return np.sum(np.array(tensors, dtype=np.int64), axis=0)


def assert_all_exact(simulation, tensors):
    expected = exact_int_sum(tensors)
    assert np.abs(expected).max(initial=0) <= 2**31 - 1
    for result in simulation.results():
        assert result.dtype == np.int32
        assert np.array_equal(result, expected)


def assert_all_within_bound(simulation, tensors):
    exact = np.sum(np.array(tensors, dtype=np.float64), axis=0)
    results = simulation.results()
    for worker, result in zip(simulation.workers.values(), results):
        assert result.dtype == np.float32
        assert np.all(np.abs(result.astype(np.float64) - exact) <= worker.error_bound())
        assert np.array_equal(result, results[0])          # every worker holds the same result


@pytest.mark.parametrize("workers, size, slots, elements", [
    (1, 1, 4, 8), (2, 100, 4, 16), (3, 1000, 8, 32), (4, 2048, 16, 64), (8, 4096, 16, 64),
    (5, 777, 3, 256), (16, 3000, 32, 128), (6, 50, 64, 4),
])
def test_int32_aggregation_is_exact(workers, size, slots, elements):
    tensors = int_tensors(workers, size, seed=size)
    simulation = sim.rack(tensors, slots=slots, elements=elements)
    simulation.run()
    assert_all_exact(simulation, tensors)
    assert simulation.counters["lost"] == 0
    chunks = -(-size // elements)
    for w in simulation.workers.values():
        assert w.counters["sent"] == chunks and w.counters["retransmissions"] == 0


@pytest.mark.parametrize("workers, size, elements", [(2, 500, 16), (4, 2000, 64), (8, 1500, 256),
                                                     (3, 10, 64)])
def test_float32_aggregation_is_within_the_quantization_bound(workers, size, elements):
    tensors = float_tensors(workers, size, seed=workers)
    simulation = sim.rack(tensors, slots=8, elements=elements)
    simulation.run()
    assert_all_within_bound(simulation, tensors)


@pytest.mark.parametrize("loss, duplicate, seed", [(0.01, 0.0, 1), (0.05, 0.05, 2),
                                                   (0.2, 0.1, 3), (0.3, 0.0, 4)])
def test_random_loss_and_duplication_on_every_link_still_gives_the_exact_sum(loss, duplicate, seed):
    tensors = int_tensors(4, 1500, seed=seed)
    simulation = sim.rack(tensors, slots=8, elements=32, seed=seed,
                          link=LinkModel(loss=loss, duplicate=duplicate))
    simulation.run()
    assert_all_exact(simulation, tensors)
    assert simulation.counters["lost"] > 0
    assert sum(w.counters["retransmissions"] for w in simulation.workers.values()) > 0


def test_float32_under_loss_is_within_the_bound():
    tensors = float_tensors(4, 1000, seed=9)
    simulation = sim.rack(tensors, slots=8, elements=32, seed=9,
                          link=LinkModel(loss=0.1, duplicate=0.05))
    simulation.run()
    assert_all_within_bound(simulation, tensors)


def test_a_large_tensor_under_one_percent_loss():
    """64 Ki elements from 8 workers, k = 256 and s = 64 as in the paper's 100 Gbps set-up."""
    for tensors, check in ((int_tensors(8, 1 << 16, seed=30), assert_all_exact),
                           (float_tensors(8, 1 << 16, seed=30), assert_all_within_bound)):
        simulation = sim.rack(tensors, slots=64, elements=256, seed=30,
                              link=LinkModel(loss=0.01))
        simulation.run()
        check(simulation, tensors)
        assert simulation.counters["lost"] > 0


def first_copies(predicate):
    """A drop rule losing the first packet (per source, destination, slot, offset) that
    matches, so every loss is recovered by a resend that gets through."""
    dropped = set()

    def rule(source, destination, p):
        key = (source, destination, p.slot, p.offset, p.result)
        if predicate(source, destination, p) and key not in dropped:
            dropped.add(key)
            return True
        return False
    return rule


def test_a_multicast_lost_to_some_workers_is_recovered_from_the_shadow_copy():
    tensors = int_tensors(4, 640, seed=5)
    lose = first_copies(lambda source, destination, p: p.result and destination in ("w1", "w2"))
    simulation = sim.rack(tensors, slots=4, elements=16, drop=lose)
    simulation.run()
    assert_all_exact(simulation, tensors)
    tor = simulation.aggregators["tor"].totals()
    assert tor["completed"] == tor["multicast"] == 40
    # every chunk's result again for w1 and w2 (and for others' resends that found the use
    # complete: they time out waiting on w1 and w2's next chunk)
    assert tor["unicast"] >= 2 * 40
    assert simulation.workers["w1"].counters["retransmissions"] >= 40
    assert simulation.workers["w2"].counters["retransmissions"] >= 40


def test_lost_updates_are_resent_and_added_once():
    tensors = int_tensors(3, 480, seed=6)
    lose = first_copies(lambda source, destination, p: not p.result and source == "w2")
    simulation = sim.rack(tensors, slots=4, elements=16, drop=lose)
    simulation.run()
    assert_all_exact(simulation, tensors)
    tor = simulation.aggregators["tor"].totals()
    assert tor["aggregated"] == 3 * 30                 # each update added once, resends or not
    assert simulation.workers["w2"].counters["retransmissions"] >= 30
    # w0 and w1 time out too while w2's update is missing: those resends are duplicates
    assert tor["duplicates"] > 0


def test_duplicated_packets_are_ignored():
    tensors = int_tensors(3, 800, seed=7)
    simulation = sim.rack(tensors, slots=8, elements=16, seed=7,
                          link=LinkModel(duplicate=0.5))
    simulation.run()
    assert_all_exact(simulation, tensors)
    tor = simulation.aggregators["tor"].totals()
    assert tor["duplicates"] > 0 and tor["aggregated"] == 3 * 50
    assert sum(w.counters["duplicates"] for w in simulation.workers.values()) > 0


def test_each_slot_alternates_versions_and_advances_by_k_times_s():
    sent = collections.defaultdict(list)

    def spy(source, destination, p):
        if not p.result and not p.retransmit:
            sent[(source, p.slot)].append((p.version, p.offset))
        return False
    tensors = int_tensors(2, 16 * 4 * 5, seed=8)
    sim.rack(tensors, slots=4, elements=16, drop=spy, seed=8,
             link=LinkModel(loss=0.1)).run()
    for (source, slot), uses in sent.items():
        assert uses == [(u % 2, (slot + 4 * u) * 16) for u in range(5)]


def test_delays_reorder_packets():
    simulation = sim.rack(int_tensors(1, 64 * 16), slots=64, elements=16)
    tor = simulation.aggregators["tor"]
    arrivals = []

    def handle(p):
        arrivals.append(p.offset)
        return Aggregator.handle(tor, p)
    tor.handle = handle
    simulation.run()
    assert sorted(arrivals) == [16 * i for i in range(64)]     # sent in this order at t=0 ...
    assert arrivals != sorted(arrivals)                        # ... and delivered in another


# -- hierarchy -------------------------------------------------------------------------------------

@pytest.mark.parametrize("rack_sizes", [(2, 2), (3, 1, 2), (1, 1, 1, 1), (4,)])
def test_two_levels_give_the_single_rack_result_bit_for_bit(rack_sizes):
    n = sum(rack_sizes)
    for tensors in (int_tensors(n, 900, seed=n), float_tensors(n, 900, seed=n)):
        racks, start = [], 0
        for size in rack_sizes:
            racks.append(tensors[start:start + size])
            start += size
        hierarchy = sim.two_level(racks, slots=8, elements=32)
        hierarchy.run()
        single = sim.rack(tensors, slots=8, elements=32)
        single.run()
        for a, b in zip(hierarchy.results(), single.results()):
            assert a.dtype == b.dtype and np.array_equal(a, b)
        spine = hierarchy.aggregators["spine"].totals()
        priming = 8 if tensors[0].dtype == np.float32 else 0
        assert spine["completed"] == spine["multicast"] == 29 + priming


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_two_levels_recover_from_loss_and_duplication_at_every_level(seed):
    tensors = int_tensors(6, 1200, seed=seed)
    simulation = sim.two_level([tensors[:3], tensors[3:5], tensors[5:]], slots=8, elements=32,
                               seed=seed, link=LinkModel(loss=0.1, duplicate=0.05))
    simulation.run()
    assert_all_exact(simulation, tensors)
    leaves = sum((simulation.aggregators[f"leaf{r}"].totals() for r in range(3)),
                 collections.Counter())
    assert leaves["reforwarded"] > 0 and leaves["unicast"] > 0


def test_two_levels_float32_under_loss_is_within_the_bound():
    tensors = float_tensors(4, 700, seed=21)
    simulation = sim.two_level([tensors[:2], tensors[2:]], slots=4, elements=64, seed=21,
                               link=LinkModel(loss=0.1))
    simulation.run()
    assert_all_within_bound(simulation, tensors)


@pytest.mark.parametrize("where", ["leaf-to-spine", "spine-to-leaf", "leaf-to-workers"])
def test_two_levels_recover_a_loss_scripted_at_each_hop(where):
    predicates = {
        "leaf-to-spine": lambda s, d, p: d == "spine" and s == "leaf1",
        "spine-to-leaf": lambda s, d, p: s == "spine" and d == "leaf0",
        "leaf-to-workers": lambda s, d, p: s == "leaf1" and d == "w1.0",
    }
    tensors = int_tensors(4, 640, seed=3)
    simulation = sim.two_level([tensors[:2], tensors[2:]], slots=4, elements=16,
                               drop=first_copies(predicates[where]))
    simulation.run()
    assert_all_exact(simulation, tensors)
    leaf0 = simulation.aggregators["leaf0"].totals()
    leaf1 = simulation.aggregators["leaf1"].totals()
    spine = simulation.aggregators["spine"].totals()
    if where == "leaf-to-spine":
        assert leaf1["reforwarded"] >= 40
    elif where == "spine-to-leaf":
        assert leaf0["reforwarded"] >= 40 and spine["unicast"] >= 40
    else:
        assert leaf1["unicast"] >= 40
        assert simulation.workers["w1.0"].counters["retransmissions"] >= 40


def test_wrapping_partial_sums_give_the_same_exact_result_on_both_set_ups():
    """Each rack's partial overflows int32 and wraps; the job's sum fits, so both are exact."""
    big = np.full(64, 2**31 - 1, dtype=np.int32)
    tensors = [big, big, -big, -big + 5]
    hierarchy = sim.two_level([tensors[:2], tensors[2:]], slots=2, elements=16)
    hierarchy.run()
    single = sim.rack(tensors, slots=2, elements=16)
    single.run()
    for result in hierarchy.results() + single.results():
        assert result.tolist() == [5] * 64


# -- jobs, and the simulator itself ----------------------------------------------------------------

def test_two_jobs_share_one_aggregator_and_a_third_is_refused():
    simulation = Simulation(seed=4, link=LinkModel(loss=0.05))
    tor = simulation.add_aggregator("tor", Aggregator(12, slot_elements=16, name="tor"))
    expected = {}
    for job_id, workers, slots in ((1, 3, 8), (2, 2, 4)):
        job = JobConfig(job_id, workers, slots, 16)
        tor.admit(job)
        tensors = int_tensors(workers, 500, seed=job_id)
        expected[job_id] = exact_int_sum(tensors)
        names = [f"j{job_id}w{i}" for i in range(workers)]
        for i, (name, tensor) in enumerate(zip(names, tensors)):
            simulation.add_worker(name, Worker(tensor, job=job, worker_id=i, workers=workers,
                                               timeout=10.0), "tor")
        simulation.connect("tor", job_id, names)
    with pytest.raises(AdmissionError, match="job 3 needs 1 slots, 0 of 12 are free"):
        tor.admit(JobConfig(3, 2, 1, 16))
    simulation.run()
    for name, worker in simulation.workers.items():
        assert np.array_equal(worker.result, expected[worker.job.job_id]), name


def test_a_network_that_loses_everything_is_reported_stuck():
    simulation = sim.rack(int_tensors(2, 64), slots=2, elements=16,
                          drop=lambda s, d, p: True)
    with pytest.raises(SimulationStuck, match="w0, w1 have not finished by t=100"):
        simulation.run(until=100)


def test_a_seed_replays_the_same_run():
    def one_run():
        tensors = int_tensors(3, 700, seed=1)
        simulation = sim.rack(tensors, slots=8, elements=16, seed=42,
                              link=LinkModel(loss=0.1, duplicate=0.1))
        finish = simulation.run()
        return finish, dict(simulation.counters)
    assert one_run() == one_run()


def test_completion_time_and_bytes_are_recorded_per_worker():
    tensors = int_tensors(2, 256)
    simulation = sim.rack(tensors, slots=4, elements=64)
    finish = simulation.run()
    for w in simulation.workers.values():
        assert w.started_at == 0.0 and 0 < w.finished_at <= finish
        assert w.counters["bytes_sent"] == 4 * (20 + 64 * 4)
