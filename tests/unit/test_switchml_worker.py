"""The worker against algorithm 4 of seed 003, driven by hand: s packets in flight, the next chunk
on a slot's result with the version flipped, timeouts that resend, stale results ignored, the
priming use and look-ahead of float tensors, and the assembled result."""

import numpy as np
import pytest

from fabriclab.switchml import quantize
from fabriclab.switchml.job import JobConfig, JobConfigError
from fabriclab.switchml.packet import NO_EXPONENT
from fabriclab.switchml.worker import Worker

K, S = 4, 3


def worker(tensor, *, workers=1, slots=S, timeout=10.0, worker_id=0):
    job = JobConfig(1, workers, slots, K)
    return Worker(tensor, job=job, worker_id=worker_id, workers=workers, timeout=timeout)


def answer(p, vector=None, next_exponent=None):
    """The aggregator's result for p: by default p's own integers (a one-worker sum)."""
    return p.replace(result=True, level=1,
                     vector=p.vector if vector is None else np.asarray(vector, np.int32),
                     next_exponent=p.next_exponent if next_exponent is None else next_exponent)


def test_start_sends_one_chunk_per_slot():
    w = worker(np.arange(40, dtype=np.int32))
    sent = w.start(5.0)
    assert [(p.slot, p.version, p.offset) for p in sent] == [(0, 0, 0), (1, 0, 4), (2, 0, 8)]
    assert [p.vector.tolist() for p in sent] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert all(p.worker == 0 and p.job == 1 and not p.result and p.level == 0 for p in sent)
    assert w.next_deadline == 15.0
    assert w.counters["sent"] == 3 and w.counters["bytes_sent"] == 3 * (20 + 16)


def test_a_result_sends_the_slots_next_chunk_on_the_other_version():
    w = worker(np.arange(40, dtype=np.int32))
    sent = w.start(0.0)
    follow, = w.on_packet(answer(sent[1]), 3.0)
    assert (follow.slot, follow.version, follow.offset) == (1, 1, 16)
    assert follow.vector.tolist() == [16, 17, 18, 19]
    follow, = w.on_packet(answer(follow), 4.0)
    assert (follow.slot, follow.version, follow.offset) == (1, 0, 28)


def test_versions_alternate_and_offsets_advance_by_k_times_s():
    w = worker(np.arange(100, dtype=np.int32), slots=2)
    p = w.start(0.0)[0]
    seen = []
    while p is not None:
        seen.append((p.version, p.offset))
        out = w.on_packet(answer(p), 1.0)
        p = out[0] if out else None
    assert seen == [(i % 2, i * 8) for i in range(13)]     # chunks 0, 2, ..., 24 of 25


def test_a_timeout_resends_the_same_packet_marked_as_a_resend():
    w = worker(np.arange(40, dtype=np.int32))
    sent = w.start(0.0)
    w.on_packet(answer(sent[0]), 2.0)                      # slot 0 moves on, deadline 12
    assert w.on_timer(9.99) == []
    resent = w.on_timer(10.0)
    assert [p.slot for p in resent] == [1, 2]
    for old, new in zip(sent[1:], resent):
        assert new.same_as(old.replace(retransmit=True))
    assert w.next_deadline == 12.0
    assert [p.slot for p in w.on_timer(12.5)] == [0]
    assert w.counters["retransmissions"] == 3 and w.counters["sent"] == 3 + 1 + 3


def test_a_stale_or_duplicated_result_is_counted_and_ignored():
    w = worker(np.arange(40, dtype=np.int32))
    sent = w.start(0.0)
    follow, = w.on_packet(answer(sent[0]), 1.0)
    assert w.on_packet(answer(sent[0]), 2.0) == []                       # the same result again
    assert w.on_packet(answer(follow).replace(version=0), 2.0) == []    # wrong version
    assert w.on_packet(answer(follow).replace(offset=0), 2.0) == []     # an older use's offset
    assert w.counters["duplicates"] == 3
    assert w.on_packet(answer(sent[1]).replace(job=2), 2.0) == []
    assert w.on_packet(answer(sent[1]).replace(result=False), 2.0) == []
    assert w.on_packet(answer(sent[1]).replace(slot=7), 2.0) == []
    assert w.on_packet(answer(sent[1], vector=[1, 2]), 2.0) == []
    assert w.counters["unexpected"] == 4 and w.counters["results"] == 1


def test_the_result_is_assembled_in_the_inputs_shape_and_dtype():
    tensor = np.arange(-30, 30, dtype=np.int32).reshape(6, 10)
    w = worker(tensor)
    pending = w.start(0.0)
    with pytest.raises(RuntimeError, match="not finished"):
        w.result
    while pending:
        pending = [n for p in pending for n in w.on_packet(answer(p, vector=2 * p.vector), 1.0)]
    assert w.done and w.finished_at == 1.0 and w.next_deadline is None
    assert w.result.dtype == np.int32 and w.result.shape == (6, 10)
    assert np.array_equal(w.result, 2 * tensor)
    assert not w.error_bound().any()


def test_a_tensor_smaller_than_the_pool_uses_fewer_slots_and_a_short_last_chunk():
    w = worker(np.arange(6, dtype=np.int32), slots=4)
    sent = w.start(0.0)
    assert [(p.slot, p.elements) for p in sent] == [(0, 4), (1, 2)]
    for p in sent:
        assert w.on_packet(answer(p), 1.0) == []
    assert w.done and w.result.tolist() == list(range(6))


def test_an_empty_tensor_is_done_at_once():
    w = worker(np.zeros(0, dtype=np.float32))
    assert w.start(3.0) == [] and w.done and w.finished_at == 3.0
    assert w.result.shape == (0,)


def test_a_float_tensor_primes_each_slot_with_its_first_exponent():
    tensor = np.array([0.5, 0.1, 0, 0] + [3.0] * 4 + [0.0] * 4 + [-9.0, 1, 1, 1],
                      dtype=np.float32)                    # chunk exponents -1, 2, none, 4
    w = worker(tensor, workers=2)
    sent = w.start(0.0)
    assert [(p.slot, p.version, p.offset, p.elements) for p in sent] == \
        [(0, 0, 0, 0), (1, 0, 4, 0), (2, 0, 8, 0)]
    assert [p.next_exponent for p in sent] == [-1, 2, NO_EXPONENT]
    assert all(p.exponent == NO_EXPONENT for p in sent)
    # the result of slot 0's priming says another worker's first chunk reaches 2^3
    chunk0, = w.on_packet(answer(sent[0], next_exponent=3), 1.0)
    assert (chunk0.version, chunk0.offset, chunk0.exponent) == (1, 0, 3)
    assert chunk0.next_exponent == 4                       # chunk 3, the slot's next
    assert chunk0.vector.tolist() == quantize.quantize(tensor[:4], 3, 2).tolist()
    # chunk 0's result (both workers sent the same) carries the agreed exponent of chunk 3
    chunk3, = w.on_packet(answer(chunk0, vector=2 * chunk0.vector, next_exponent=6), 2.0)
    assert (chunk3.version, chunk3.offset, chunk3.exponent) == (0, 12, 6)
    assert chunk3.next_exponent == NO_EXPONENT             # no chunk 6
    assert w.on_packet(answer(chunk3, vector=2 * chunk3.vector), 3.0) == []
    for p in sent[1:]:
        chunk, = w.on_packet(answer(p), 4.0)
        assert w.on_packet(answer(chunk, vector=2 * chunk.vector), 5.0) == []
    assert w.done and w.result.dtype == np.float32
    assert np.all(np.abs(w.result - 2 * tensor) <= w.error_bound())
    assert w.agreed_exponents.tolist() == [3, 2, NO_EXPONENT, 6]


@pytest.mark.parametrize("tensor, message", [
    (np.zeros(4, dtype=np.int64), "int64 tensor cannot be aggregated"),
    (np.zeros(4, dtype=np.uint32), "uint32 tensor cannot be aggregated"),
])
def test_a_tensor_type_without_a_path_is_refused(tensor, message):
    with pytest.raises(JobConfigError, match=message):
        worker(tensor)


def test_non_finite_floats_are_refused():
    with pytest.raises(ValueError, match="NaN or infinity"):
        worker(np.array([1.0, np.nan], dtype=np.float32))


@pytest.mark.parametrize("kwargs, named", [
    (dict(worker_id=2, workers=2), "worker_id=2"),
    (dict(timeout=0.0), "timeout=0.0"),
])
def test_bad_worker_parameters_name_the_field(kwargs, named):
    with pytest.raises(JobConfigError, match=named):
        worker(np.zeros(4, np.int32), **kwargs)


def test_total_workers_cannot_be_fewer_than_the_aggregators():
    with pytest.raises(JobConfigError, match="workers=1"):
        Worker(np.zeros(4, np.int32), job=JobConfig(1, 2, 1, K), worker_id=0, workers=1,
               timeout=1.0)


def test_a_worker_starts_once():
    w = worker(np.zeros(4, np.int32))
    w.start(0.0)
    with pytest.raises(RuntimeError, match="already started"):
        w.start(1.0)


def test_a_second_aggregation_continues_the_slot_versions_and_gets_its_own_result():
    """Iterations of one job on one aggregator: the next aggregation picks up each slot's version
    where the last left it, so its first updates are new uses, not retransmissions of old ones."""
    import numpy as np

    from fabriclab.switchml.aggregator import Aggregator
    from fabriclab.switchml.job import JobConfig
    from fabriclab.switchml.worker import Worker

    job = JobConfig(1, 2, 2, 4)

    def aggregator():
        agg = Aggregator(2, slot_elements=4)
        agg.admit(job)
        return agg

    def aggregate(agg, tensors, previous):
        workers = [Worker(t, job=job, worker_id=i, workers=2, timeout=1.0,
                          after=previous[i] if previous else None) for i, t in enumerate(tensors)]
        queue = [p for w in workers for p in w.start(0.0)]
        while queue:
            out = []
            for dest, reply in agg.handle(queue.pop(0)):
                targets = workers if dest.kind == "multicast" else [workers[dest.worker]]
                for w in targets:
                    out += w.on_packet(reply, 0.0)
            queue += out
        assert all(w.done for w in workers)
        return workers

    first = [np.arange(12, dtype=np.int32), np.ones(12, dtype=np.int32)]       # 3 chunks over 2 slots
    agg = aggregator()
    done = aggregate(agg, first, None)
    second = [np.full(12, 5, dtype=np.int32), np.full(12, 7, dtype=np.int32)]
    again = aggregate(agg, second, done)
    # slot 0 carried chunks 0 and 2 (versions 0, 1), slot 1 chunk 1 (version 0): next are 0 and 1
    assert [w.version_base for w in again] == [[0, 1], [0, 1]]
    for w in again:
        np.testing.assert_array_equal(w.result, np.full(12, 12, dtype=np.int32))
    # Without `after`, slot 1's first update repeats version 0: the aggregator answers it from the
    # shadow copy with the first aggregation's sum.
    agg = aggregator()
    aggregate(agg, first, None)
    stale = aggregate(agg, second, None)
    assert not np.array_equal(stale[0].result, np.full(12, 12, dtype=np.int32))
