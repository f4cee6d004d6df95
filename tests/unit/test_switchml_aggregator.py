"""The aggregator against algorithm 3 of seed 003, packet by packet: duplicates, lost updates,
lost results answered from the shadow copy, version flips, the look-ahead exponent, wrapping
arithmetic, multi-job admission, and the leaf/spine hierarchy's loss recovery."""

import numpy as np
import pytest

from fabriclab.errors import LabError
from fabriclab.switchml.aggregator import (ALL_WORKERS, PARENT, AdmissionError, Aggregator,
                                           to_worker)
from fabriclab.switchml.job import JobConfig, JobConfigError
from fabriclab.switchml.packet import NO_EXPONENT, Packet
from fabriclab.switchml.pool import SlotPool

K = 4


def update(worker, values, *, slot=0, version=0, offset=0, job=1, next_exponent=NO_EXPONENT,
           exponent=NO_EXPONENT, level=0, retransmit=False):
    return Packet(job=job, worker=worker, slot=slot, version=version, offset=offset,
                  vector=np.array(values, dtype=np.int32), exponent=exponent,
                  next_exponent=next_exponent, retransmit=retransmit, level=level)


def pool(workers=3, slots=2, **kwargs):
    return SlotPool(JobConfig(1, workers, slots, K), **kwargs)


def result_of(actions):
    """The single action's destination and vector; fails unless there is exactly one."""
    assert len(actions) == 1, actions
    (destination, p), = actions
    assert p.result
    return destination, p.vector.tolist()


# -- algorithm 3, single level ---------------------------------------------------------------------

def test_appendix_a_example_step_by_step():
    """Seed 003 appendix A: three workers on slot x, an update lost, then a result lost."""
    agg = pool(workers=3)
    a, b, c = [1, 2, 3, 4], [10, 20, 30, 40], [100, 200, 300, 400]
    total = [111, 222, 333, 444]
    assert agg.handle(update(0, a)) == []                            # t0
    assert agg.handle(update(1, b)) == []                            # t1; w3's update lost (t2-t3)
    assert agg.handle(update(0, a, retransmit=True)) == []           # t4: seen, ignored
    assert agg.handle(update(1, b, retransmit=True)) == []           # t5: seen, ignored
    assert agg.counters["duplicates"] == 2
    destination, values = result_of(agg.handle(update(2, c, retransmit=True)))   # t6
    assert destination == ALL_WORKERS and values == total
    # t7: w1's copy of the result is lost; t8: w1 resends and gets it by unicast
    destination, values = result_of(agg.handle(update(0, a, retransmit=True)))
    assert destination == to_worker(0) and values == total
    assert agg.counters["unicast"] == 1
    # t12-t13: w2 and w3 move the slot to the other version with the next chunk
    assert agg.handle(update(1, [1, 1, 1, 1], version=1, offset=8)) == []
    assert agg.handle(update(2, [2, 2, 2, 2], version=1, offset=8)) == []
    # the shadow copy is intact while version 1 fills: a further resend from w1 still gets it
    destination, values = result_of(agg.handle(update(0, a, retransmit=True)))
    assert destination == to_worker(0) and values == total
    # t14-t15: w1 moves on too; version 1 completes
    destination, values = result_of(agg.handle(update(0, [3, 3, 3, 3], version=1, offset=8)))
    assert destination == ALL_WORKERS and values == [6, 6, 6, 6]
    assert agg.counters["completed"] == 2 and agg.counters["aggregated"] == 6


def test_a_reused_version_starts_from_the_new_values_not_the_old_result():
    agg = pool(workers=2)
    agg.handle(update(0, [1, 1, 1, 1]))
    agg.handle(update(1, [2, 2, 2, 2]))
    agg.handle(update(0, [0, 0, 0, 0], version=1, offset=8))
    agg.handle(update(1, [0, 0, 0, 0], version=1, offset=8))
    agg.handle(update(1, [5, 6, 7, 8], version=0, offset=16))
    _, values = result_of(agg.handle(update(0, [1, 1, 1, 1], version=0, offset=16)))
    assert values == [6, 7, 8, 9]


def test_duplicates_of_an_update_are_added_once():
    agg = pool(workers=2)
    for _ in range(3):
        assert agg.handle(update(0, [1, 2, 3, 4])) == []
    _, values = result_of(agg.handle(update(1, [1, 1, 1, 1])))
    assert values == [2, 3, 4, 5]
    assert agg.counters["duplicates"] == 2


def test_seen_bits_move_to_the_version_a_worker_sends_to():
    agg = pool(workers=2)
    agg.handle(update(0, [0] * K))
    agg.handle(update(1, [0] * K))
    assert agg.seen[0, 0].tolist() == [True, True] and agg.count[0, 0] == 0
    agg.handle(update(0, [0] * K, version=1, offset=8))
    assert agg.seen[0, 0].tolist() == [False, True]
    assert agg.seen[1, 0].tolist() == [True, False]
    assert agg.count[1, 0] == 1


def test_slots_are_independent():
    agg = pool(workers=2, slots=3)
    assert agg.handle(update(0, [1] * K, slot=2)) == []
    assert agg.handle(update(1, [7] * K, slot=1)) == []
    _, values = result_of(agg.handle(update(1, [2] * K, slot=2)))
    assert values == [3] * K
    _, values = result_of(agg.handle(update(0, [1] * K, slot=1)))
    assert values == [8] * K


def test_the_look_ahead_exponent_is_the_maximum_and_comes_back_with_every_copy():
    agg = pool(workers=3)
    agg.handle(update(0, [0] * K, exponent=4, next_exponent=-2))
    agg.handle(update(1, [0] * K, exponent=4, next_exponent=NO_EXPONENT))
    (destination, p), = agg.handle(update(2, [0] * K, exponent=4, next_exponent=3))
    assert destination == ALL_WORKERS and (p.next_exponent, p.exponent) == (3, 4)
    (destination, p), = agg.handle(update(1, [0] * K, exponent=4, retransmit=True))
    assert destination == to_worker(1) and p.next_exponent == 3 and not p.retransmit


def test_a_result_keeps_the_header_of_the_packet_that_completed_it():
    agg = pool(workers=2)
    agg.handle(update(0, [1] * K, slot=1, version=1, offset=64))
    (_, p), = agg.handle(update(1, [1] * K, slot=1, version=1, offset=64))
    assert (p.job, p.slot, p.version, p.offset, p.level, p.result) == (1, 1, 1, 64, 1, True)


def test_a_short_last_chunk_is_aggregated_at_its_length():
    agg = pool(workers=2)
    agg.handle(update(0, [1, 2]))
    _, values = result_of(agg.handle(update(1, [3, 4])))
    assert values == [4, 6]


def test_a_single_worker_job_completes_on_every_update():
    """Algorithm 3's count = 1 test never holds for n = 1; the first contribution is the one that
    finds count 0, so the second use of version 0 does not add onto the first."""
    agg = pool(workers=1)
    _, values = result_of(agg.handle(update(0, [1, 2, 3, 4])))
    assert values == [1, 2, 3, 4]
    result_of(agg.handle(update(0, [9] * K, version=1, offset=8)))
    _, values = result_of(agg.handle(update(0, [5, 5, 5, 5], version=0, offset=16)))
    assert values == [5, 5, 5, 5]
    destination, values = result_of(agg.handle(update(0, [5, 5, 5, 5], version=0, offset=16)))
    assert destination == to_worker(0) and values == [5, 5, 5, 5]


def test_arithmetic_wraps_like_32_bit_adders():
    agg = pool(workers=2)
    agg.handle(update(0, [2**31 - 1, -2**31, 5, 0]))
    _, values = result_of(agg.handle(update(1, [1, -1, 5, 0])))
    assert values == [-2**31, 2**31 - 1, 10, 0]


@pytest.mark.parametrize("order", [(0, 1, 2), (2, 1, 0), (1, 0, 2)])
def test_a_sum_that_fits_is_exact_even_when_a_partial_sum_overflows(order):
    contributions = [[2**31 - 1] * K, [2**31 - 1] * K, [-(2**31 - 1)] * K]
    agg = pool(workers=3)
    actions = []
    for w in order:
        actions = agg.handle(update(w, contributions[w]))
    _, values = result_of(actions)
    assert values == [2**31 - 1] * K


@pytest.mark.parametrize("p, counter", [
    (update(0, [1] * K, slot=2), "malformed"),                  # slot beyond the job's pool
    (update(0, [1] * (K + 1)), "malformed"),                     # wider than a slot
    (update(3, [1] * K), "malformed"),                           # no such worker
    (update(0, [1] * K, level=1), "wrong_level"),                # an aggregator's partial
    (update(0, [1] * K).replace(result=True, level=2), "wrong_level"),   # a result at the root
])
def test_packets_that_do_not_belong_are_counted_and_change_nothing(p, counter):
    agg = pool(workers=3)
    assert agg.handle(p) == []
    assert agg.counters[counter] == 1
    assert not agg.seen.any() and not agg.count.any() and not agg.values.any()


def test_an_update_whose_length_disagrees_with_the_use_is_dropped():
    agg = pool(workers=2)
    agg.handle(update(0, [1, 1, 1, 1]))
    assert agg.handle(update(1, [1, 1])) == []
    assert agg.counters["malformed"] == 1
    assert agg.seen[0, 0].tolist() == [True, False] and agg.count[0, 0] == 1
    _, values = result_of(agg.handle(update(1, [1, 1, 1, 1])))
    assert values == [2] * K


# -- jobs and admission ----------------------------------------------------------------------------

def test_each_job_gets_its_own_pool():
    agg = Aggregator(8, slot_elements=K)
    agg.admit(JobConfig(1, 2, 2, K))
    agg.admit(JobConfig(2, 2, 2, K))
    agg.handle(update(0, [1] * K, job=1))
    agg.handle(update(0, [100] * K, job=2))
    _, values = result_of(agg.handle(update(1, [2] * K, job=1)))
    assert values == [3] * K
    (_, p), = agg.handle(update(1, [200] * K, job=2))
    assert p.job == 2 and p.vector.tolist() == [300] * K
    assert agg.totals()["completed"] == 2


def test_admission_refuses_a_job_when_the_slots_are_used():
    agg = Aggregator(10, slot_elements=K, name="tor-l1")
    agg.admit(JobConfig(1, 2, 6, K))
    agg.admit(JobConfig(2, 2, 4, K))
    assert agg.free_slots == 0
    with pytest.raises(AdmissionError, match=r"tor-l1: job 3 needs 1 slots, 0 of 10 are free "
                                             r"\(job 1: 6, job 2: 4\)"):
        agg.admit(JobConfig(3, 2, 1, K))
    agg.release(1)
    assert agg.free_slots == 6
    agg.admit(JobConfig(3, 2, 6, K))
    assert isinstance(AdmissionError("x"), LabError)


def test_admission_refuses_a_taken_id_and_a_chunk_wider_than_a_slot():
    agg = Aggregator(10, slot_elements=K)
    agg.admit(JobConfig(1, 2, 2, K))
    with pytest.raises(AdmissionError, match="job 1 is already admitted"):
        agg.admit(JobConfig(1, 2, 2, K))
    with pytest.raises(AdmissionError, match="wants 5 elements per slot, slots here hold 4"):
        agg.admit(JobConfig(2, 2, 2, K + 1))
    with pytest.raises(AdmissionError, match="job 9 is not admitted"):
        agg.release(9)


def test_an_unknown_job_is_counted_and_dropped():
    agg = Aggregator(4, slot_elements=K)
    assert agg.handle(update(0, [1] * K, job=5)) == []
    assert agg.totals()["unknown_job"] == 1


@pytest.mark.parametrize("fields, named", [
    (dict(job_id=1, workers=0, slots=1, elements=1), "workers=0"),
    (dict(job_id=1, workers=2, slots=0, elements=1), "slots=0"),
    (dict(job_id=1, workers=2, slots=1, elements=0), "elements=0"),
    (dict(job_id=1, workers=2, slots=1, elements=20_000), "elements=20000"),
    (dict(job_id=70_000, workers=2, slots=1, elements=1), "job_id=70000"),
    (dict(job_id=1, workers=True, slots=1, elements=1), "workers=True"),
    (dict(job_id=1, workers=2, slots=1.5, elements=1), "slots=1.5"),
])
def test_job_config_names_the_bad_field(fields, named):
    with pytest.raises(JobConfigError, match=named):
        JobConfig(**fields)


# -- hierarchy: a leaf under a spine ---------------------------------------------------------------

class TwoLevels:
    """A leaf pool (2 local workers, worker 1 at the spine) and the spine's pool (2 leaves)."""

    def __init__(self):
        self.leaf = pool(workers=2, level=1, upstream=1)
        self.spine = pool(workers=2, level=2)
        # the other rack's partial, as leaf 0 would send it
        self.other_rack = update(0, [1000] * K, level=1, next_exponent=7)

    def up(self, actions):
        """The leaf's single upward packet."""
        (destination, p), = actions
        assert destination == PARENT and not p.result and p.level == 1 and p.worker == 1
        return p


def test_a_leaf_forwards_its_partial_instead_of_multicasting():
    t = TwoLevels()
    assert t.leaf.handle(update(0, [1, 2, 3, 4], next_exponent=2)) == []
    partial = t.up(t.leaf.handle(update(1, [10, 20, 30, 40], next_exponent=5)))
    assert partial.vector.tolist() == [11, 22, 33, 44] and partial.next_exponent == 5
    assert not partial.retransmit
    assert t.spine.handle(partial) == []
    (destination, result), = t.spine.handle(t.other_rack)
    assert destination == ALL_WORKERS and result.level == 2
    assert result.vector.tolist() == [1011, 1022, 1033, 1044] and result.next_exponent == 7
    (destination, down), = t.leaf.handle(result)
    assert destination == ALL_WORKERS and down.result and down.level == 1
    assert down.vector.tolist() == [1011, 1022, 1033, 1044] and down.next_exponent == 7


def test_hierarchy_recovers_a_lost_partial_a_lost_result_and_a_lost_relay():
    t = TwoLevels()
    t.leaf.handle(update(0, [1] * K))
    t.up(t.leaf.handle(update(1, [2] * K)))                        # the partial is lost
    # worker 0 times out: the leaf has seen it and is complete, but has no result: send up again
    again = t.up(t.leaf.handle(update(0, [1] * K, retransmit=True)))
    assert again.retransmit and again.vector.tolist() == [3] * K
    assert t.leaf.counters["reforwarded"] == 1
    assert t.spine.handle(again) == []                             # the spine now has this rack
    (_, result), = t.spine.handle(t.other_rack)                    # ... and completes; lost to us
    # worker 1 times out: the leaf asks again, the spine answers from its shadow copy, unicast
    again = t.up(t.leaf.handle(update(1, [2] * K, retransmit=True)))
    (destination, unicast), = t.spine.handle(again)
    assert destination == to_worker(1) and unicast.vector.tolist() == [1003] * K
    assert t.spine.counters["unicast"] == 1
    (destination, down), = t.leaf.handle(unicast)
    assert destination == ALL_WORKERS and down.vector.tolist() == [1003] * K
    # the spine's multicast copy turns up late: the leaf has the result, drops it
    assert t.leaf.handle(result) == []
    assert t.leaf.counters["duplicate_results"] == 1
    # worker 0 lost the relayed result: the leaf answers from its own copy, nothing goes up
    destination, values = result_of(t.leaf.handle(update(0, [1] * K, retransmit=True)))
    assert destination == to_worker(0) and values == [1003] * K
    assert t.leaf.counters["unicast"] == 1 and t.leaf.counters["reforwarded"] == 2


def test_a_resent_partial_at_an_incomplete_spine_is_a_duplicate():
    t = TwoLevels()
    t.leaf.handle(update(0, [1] * K))
    partial = t.up(t.leaf.handle(update(1, [2] * K)))
    assert t.spine.handle(partial) == []
    again = t.up(t.leaf.handle(update(0, [1] * K, retransmit=True)))
    assert t.spine.handle(again) == []                             # the other rack is missing
    assert t.spine.counters["duplicates"] == 1 and t.spine.counters["aggregated"] == 1


def test_a_leaf_ignores_a_parent_result_it_is_not_waiting_for():
    t = TwoLevels()
    stray = update(0, [9] * K, level=2).replace(result=True)
    assert t.leaf.handle(stray) == []                              # nothing aggregated yet
    t.leaf.handle(update(0, [1] * K, offset=64))
    assert t.leaf.handle(stray.replace(offset=64)) == []           # the rack is incomplete
    t.up(t.leaf.handle(update(1, [1] * K, offset=64)))
    assert t.leaf.handle(stray) == []                              # an older use's offset
    assert t.leaf.handle(stray.replace(offset=64, vector=np.zeros(2, np.int32))) == []
    assert t.leaf.counters["duplicate_results"] == 4
    assert result_of(t.leaf.handle(stray.replace(offset=64)))[1] == [9] * K


def test_a_leaf_starts_a_reused_version_without_the_old_final_result():
    t = TwoLevels()
    for version, offset in ((0, 0), (1, 8), (0, 16)):
        t.leaf.handle(update(0, [1] * K, version=version, offset=offset))
        partial = t.up(t.leaf.handle(update(1, [1] * K, version=version, offset=offset)))
        t.spine.handle(partial)
        (_, result), = t.spine.handle(t.other_rack.replace(version=version, offset=offset))
        (_, down), = t.leaf.handle(result)
        assert down.vector.tolist() == [1002] * K
    # version 0's second use: a resend before the result is back goes up, not to the old result
    t.leaf.handle(update(0, [1] * K, version=1, offset=24))
    t.up(t.leaf.handle(update(1, [1] * K, version=1, offset=24)))
    t.leaf.handle(update(0, [5] * K, version=0, offset=32))
    t.up(t.leaf.handle(update(1, [5] * K, version=0, offset=32)))
    again = t.up(t.leaf.handle(update(0, [5] * K, version=0, offset=32, retransmit=True)))
    assert again.vector.tolist() == [10] * K and again.offset == 32


def test_a_leaf_accepts_updates_from_workers_and_results_only_from_its_parent_tier():
    leaf = pool(workers=2, level=1, upstream=0)
    assert leaf.handle(update(0, [1] * K, level=1)) == []
    assert leaf.handle(update(0, [1] * K, level=1).replace(result=True)) == []   # not a spine's
    assert leaf.counters["wrong_level"] == 2


def test_aggregator_settings_are_checked_with_its_name():
    with pytest.raises(JobConfigError, match="SwitchML aggregator tor: capacity=0"):
        Aggregator(0, name="tor")
    with pytest.raises(JobConfigError, match="slot_elements=20000"):
        Aggregator(8, slot_elements=20_000)
    with pytest.raises(JobConfigError, match="upstream=-1"):
        Aggregator(8, slot_elements=K).admit(JobConfig(1, 2, 2, K), upstream=-1)
