"""Collective schedules and the rank engine, run over an in-memory "network" (no root needed).

Each schedule, out of place and in place, is executed by the same RankEngine the agents use, with
transfers delivered in a random order (a transfer's bytes are read from the sender's memory when
it is delivered, as a NIC reads them when it sends), and every rank's receive buffer is compared
with numpy's answer.
"""

import random

import numpy as np
import pytest

from fabriclab.traffic import schedules as S
from fabriclab.traffic.engine import Memory, RankEngine, remote_address, split_address


def buffer(memory, where):
    """A user buffer (schedules.Buffer) as a float32 view of the rank's memory."""
    start = where.offset // S.ELEMENT_BYTES
    return memory.arrays[where.region][start:start + where.nbytes // S.ELEMENT_BYTES]


def received(schedule, memories):
    """Every rank's receive buffer (None for a rank without one)."""
    return [None if b["output"] is None else buffer(m, b["output"]) for m, b in zip(memories, schedule.buffers)]


def simulate(schedule, seed=0):
    """Run every rank's program; deliver posted transfers in a seeded random order."""
    rng = random.Random(seed)
    n = schedule.ranks
    memories = [Memory(schedule.regions[r]) for r in range(n)]
    inputs = []
    for r in range(n):
        send = buffer(memories[r], schedule.buffers[r]["input"])
        send[:] = np.random.default_rng(r).integers(-50, 50, send.size)
        inputs.append(send.copy())
    posted = []
    engines = [RankEngine(schedule.programs[r], posted.append, memories[r]) for r in range(n)]
    for engine in engines:
        engine.start()
    order = []
    while posted:
        t = posted.pop(rng.randrange(len(posted)))
        order.append(t)
        data = bytes(memories[t.src].view(t.src_region, t.src_off, t.nbytes))
        # A transfer may arrive as several NIC messages: deliver it in two parts.
        half = (t.nbytes // 8) * 4
        for off, part in ((0, half), (half, t.nbytes - half)):
            if part:
                memories[t.dst].write(t.dst_region, t.dst_off + off, data[off:off + part])
                engines[t.dst].received(t.tag, part)
        engines[t.src].sent(t.tag)
    assert all(e.done for e in engines), [e.pending_recvs() for e in engines]
    return memories, inputs, order


def assert_outputs_match_reference(schedule, seed):
    """Run the schedule (simulate) and check every rank's output against the reference."""
    memories, inputs, _ = simulate(schedule, seed=seed)
    expected = S.reference_outputs(schedule, inputs)
    for rank, got in enumerate(received(schedule, memories)):
        if expected[rank] is None:
            assert got is None
        else:
            np.testing.assert_array_equal(got, expected[rank])


# The bisection test pairs ranks, so it only runs with an even count.
CASES = [(c, a, n) for c in S.COLLECTIVES for a in S.ALGORITHMS.get(c, ("ring",))
         for n in (2, 3, 4, 8) if c != "bisection" or n % 2 == 0]


# In place too, but for the collectives whose in-place result is undefined (tested at the end).
MODES = [(*case, in_place) for case in CASES for in_place in (False, True)
         if not (in_place and case[0] in S.IN_PLACE_UNDEFINED)]


@pytest.mark.parametrize("collective,algorithm,ranks,in_place", MODES)
@pytest.mark.parametrize("channels", [1, 3])
def test_schedule_computes_what_numpy_computes(collective, algorithm, ranks, channels, in_place):
    for size in (4 * ranks, 12_000):
        schedule = S.build(collective, ranks, size, algorithm=algorithm, channels=channels,
                           piece_bytes=1024, seed=ranks, in_place=in_place)
        assert schedule.in_place == in_place and schedule.defined
        for seed in range(3):
            assert_outputs_match_reference(schedule, ranks * channels + seed)


def test_ring_allreduce_steps_follow_the_ring():
    """8 ranks, 1 channel: 2(n-1) steps; at RS step s rank r writes block (r-s-1) to r+1."""
    n, size = 8, 8 * 1024
    schedule = S.build("allreduce", n, size)
    block = size // n
    for r in range(n):
        program = schedule.programs[r]
        assert len(program) == 2 * (n - 1)
        for s, step in enumerate(program[:n - 1]):
            (t,) = step.sends
            assert t.dst == (r + 1) % n and t.nbytes == block
            assert t.src_off == ((r - s - 1) % n) * block
            assert t.src_region == ("input" if s == 0 else "output")
            assert t.dst_region == "scratch"                # reduced at the receiver
            (got,) = step.recvs
            assert got.src == (r - 1) % n
        for s, step in enumerate(program[n - 1:]):
            (t,) = step.sends
            assert t.src_off == ((r - s) % n) * block and t.dst_region == "output"
        # each step waits for the previous one
        assert all(step.deps == (step.id - 1,) for step in program[1:])


@pytest.mark.parametrize("collective,factor", [("allreduce", lambda n: 2 * (n - 1) / n),
                                               ("allgather", lambda n: (n - 1) / n),
                                               ("reducescatter", lambda n: (n - 1) / n),
                                               ("alltoall", lambda n: (n - 1) / n)])
@pytest.mark.parametrize("n", [2, 4, 16])
def test_bytes_per_rank_match_the_bus_factor(collective, factor, n):
    """nccl-tests' busbw factor is exactly the fraction of `size` each rank sends in a ring or a
    direct exchange: the schedule moves the bytes the formula assumes."""
    size = n * 4096
    schedule = S.build(collective, n, size, channels=2)
    for r in range(n):
        assert schedule.sent_bytes(r) == pytest.approx(size * factor(n))
        assert schedule.received_bytes(r) == pytest.approx(size * factor(n))
    assert S.bus_factor(collective, n) == pytest.approx(factor(n))


def test_tree_allreduce_double_tree_balances_the_ranks():
    n, size = 8, 8 * 4096
    one = S.build("allreduce", n, size, algorithm="tree", channels=1, piece_bytes=size)
    two = S.build("allreduce", n, size, algorithm="tree", channels=2, piece_bytes=size)
    sent_one = [one.sent_bytes(r) for r in range(n)]
    sent_two = [two.sent_bytes(r) for r in range(n)]
    # One tree: leaves send once (up), the root twice (down to its two children), an interior
    # rank with two children three times (up once, down twice).
    assert sent_one[0] == 2 * size and max(sent_one) == 3 * size and min(sent_one) == size
    # Mirrored pair: spread tighter than one tree.
    assert max(sent_two) - min(sent_two) < max(sent_one) - min(sent_one)
    # Total bytes: every tree edge carries the channel's data up and down once.
    assert sum(sent_one) == 2 * (n - 1) * size


def test_tree_is_pipelined_in_pieces():
    schedule = S.build("allreduce", 4, 4 * 1024, algorithm="tree", piece_bytes=1024)
    leaf = 3                                     # rank 3 is a leaf of the unmirrored tree
    sizes = [t.nbytes for step in schedule.programs[leaf] for t in step.sends]
    assert sizes == [1024] * 4
    # all of the leaf's pieces can be posted without waiting for the first one to come back
    first_four = schedule.programs[leaf][:4]
    assert all(not step.recvs for step in first_four)


def test_gather_is_an_incast_to_the_root():
    schedule = S.build("gather", 8, 8 * 1000, root=2)
    assert {t.dst for t in schedule.transfers} == {2}
    assert {t.src for t in schedule.transfers} == set(range(8)) - {2}
    assert "output" not in schedule.regions[0] and schedule.regions[2]["output"] == 8000


def test_bisection_pairs_halves():
    schedule = S.build("bisection", 6, 4000)
    pairs = {(t.src, t.dst) for t in schedule.transfers}
    assert pairs == {(0, 3), (3, 0), (1, 4), (4, 1), (2, 5), (5, 2)}
    assert all(schedule.sent_bytes(r) == 4000 for r in range(6))


def test_alltoallv_is_imbalanced_and_seeded():
    m1 = S.alltoallv_matrix(8, 80_000, 4.0, seed=3)
    m2 = S.alltoallv_matrix(8, 80_000, 4.0, seed=3)
    assert m1 == m2
    blocks = [b for row in m1 for b in row]
    assert max(blocks) / min(blocks) > 2.5
    assert all(b % 4 == 0 for b in blocks)
    assert sum(blocks) / 8 == pytest.approx(80_000, rel=0.01)
    even = S.alltoallv_matrix(4, 4000, 1.0, seed=1)
    assert {b for row in even for b in row} == {1000}


def test_sizes_are_rounded_like_nccl_tests():
    assert S.build("allgather", 3, 1000).size == 996          # 249 elements -> 83 per rank
    assert S.build("allreduce", 3, 1000).size == 1000
    assert S.build("allreduce", 3, 1002).size == 1000         # whole float32 elements


@pytest.mark.parametrize("kwargs,message", [
    (dict(collective="broadcast", ranks=4, size=64), "unknown collective"),
    (dict(collective="allgather", ranks=4, size=64, algorithm="tree"), "no 'tree' algorithm"),
    (dict(collective="allreduce", ranks=1, size=64), "at least 2 ranks"),
    (dict(collective="bisection", ranks=3, size=64), "even rank count"),
    (dict(collective="allgather", ranks=4, size=8), "at least 16 bytes"),
    (dict(collective="gather", ranks=4, size=64, root=4), "root rank 4"),
    (dict(collective="allreduce", ranks=4, size=64, channels=0), "channels must be >= 1"),
])
def test_bad_parameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        S.build(**kwargs)


def test_remote_addresses_name_the_region():
    assert split_address(remote_address("scratch", 123)) == ("scratch", 123)
    assert split_address(remote_address("output", 0)) == ("output", 0)


def test_engine_reports_what_it_waits_for():
    schedule = S.build("allreduce", 4, 4096)
    posted = []
    engine = RankEngine(schedule.programs[1], posted.append)
    engine.start()
    assert [t.dst for t in posted] == [2]
    ((tag, src, missing),) = engine.pending_recvs()[:1]
    assert src == 0 and missing == 1024
    engine.received(tag, 1000)
    assert engine.pending_recvs()[0][2] == 24
    with pytest.raises(ValueError, match="more than"):
        engine.received(tag, 100)


# -- in place ---------------------------------------------------------------------------------------

def test_out_of_place_buffers_are_the_input_and_output_regions():
    schedule = S.build("gather", 4, 4000, root=1)
    assert schedule.buffers[1] == {"input": S.Buffer("input", 0, 1000), "output": S.Buffer("output", 0, 4000)}
    assert schedule.buffers[0] == {"input": S.Buffer("input", 0, 1000), "output": None}


@pytest.mark.parametrize("collective,send,recv", [
    # nccl-tests' getCollByteCount: where the send (receive) buffer sits in the receive (send) one
    ("allreduce", lambda r: S.Buffer("output", 0, 4096), lambda r: S.Buffer("output", 0, 4096)),
    ("allgather", lambda r: S.Buffer("output", r * 1024, 1024), lambda r: S.Buffer("output", 0, 4096)),
    ("gather", lambda r: S.Buffer("output", r * 1024, 1024), lambda r: S.Buffer("output", 0, 4096)),
    ("reducescatter", lambda r: S.Buffer("input", 0, 4096), lambda r: S.Buffer("input", r * 1024, 1024)),
    ("alltoall", lambda r: S.Buffer("output", 0, 4096), lambda r: S.Buffer("output", 0, 4096)),
    ("bisection", lambda r: S.Buffer("output", 0, 4096), lambda r: S.Buffer("output", 0, 4096)),
])
def test_in_place_buffers_sit_where_nccl_tests_puts_them(collective, send, recv):
    schedule = S.build(collective, 4, 4096, in_place=True, root=2)
    for r in range(4):
        assert schedule.buffers[r] == {"input": send(r), "output": recv(r)}
        # the aliased region is gone: every transfer and local operation names where bytes live
        aliased = "output" if collective == "reducescatter" else "input"
        assert aliased not in schedule.regions[r]
        named = {region for step in schedule.programs[r] for op in step.pre + step.post
                 for region, _off in (op.out,) + op.srcs}
        named |= {t.src_region for t in schedule.transfers if t.src == r}
        named |= {t.dst_region for t in schedule.transfers if t.dst == r}
        assert named <= set(schedule.regions[r])


@pytest.mark.parametrize("collective,algorithm", [(c, a) for c in S.COLLECTIVES
                                                  for a in S.ALGORITHMS.get(c, ("ring",))])
def test_in_place_moves_the_same_bytes_between_the_same_ranks(collective, algorithm):
    """Only where the data lives changes: the wire carries what it carries out of place."""
    out = S.build(collective, 4, 12_000, algorithm=algorithm, channels=2, piece_bytes=1024, seed=2)
    inp = S.build(collective, 4, 12_000, algorithm=algorithm, channels=2, piece_bytes=1024, seed=2,
                  in_place=True)
    assert out.size == inp.size and out.connections() == inp.connections()
    assert [(t.src, t.dst, t.channel, t.nbytes) for t in out.transfers] == \
        [(t.src, t.dst, t.channel, t.nbytes) for t in inp.transfers]
    assert [[(s.deps, len(s.sends), len(s.recvs)) for s in p] for p in out.programs] == \
        [[(s.deps, len(s.sends), len(s.recvs)) for s in p] for p in inp.programs]


def test_in_place_all_gather_does_not_copy_its_own_block():
    """Out of place a rank copies its block into its output; in place it is already there."""
    copies = [op for p in S.build("allgather", 4, 4096).programs for s in p for op in s.pre]
    assert len(copies) == 4
    assert not [op for p in S.build("allgather", 4, 4096, in_place=True).programs for s in p for op in s.pre]


def test_in_place_gather_leaves_a_non_root_buffer_as_it_was():
    """nccl-tests checks every rank's receive buffer: off the root, its own slice and zeros."""
    schedule = S.build("gather", 4, 4096, root=1, in_place=True)
    inputs = [np.full(256, r + 1, dtype=np.float32) for r in range(4)]
    expected = S.reference_outputs(schedule, inputs)
    np.testing.assert_array_equal(expected[1], np.concatenate(inputs))
    assert list(np.unique(expected[2])) == [0.0, 3.0] and list(expected[2][512:768]) == [3.0] * 256


@pytest.mark.parametrize("collective", S.IN_PLACE_UNDEFINED)
def test_in_place_send_recv_overwrites_what_it_still_sends(collective):
    """In place, AlltoAll(v) and the bisection test receive into the blocks they send from: a
    peer's write lands before the block left, and the check (against what the collective means)
    fails, as it must when a schedule overwrites data it still needs. So their in-place result is
    undefined: nccl-tests reports no errors for it, and the lab checks nothing."""
    schedule = S.build(collective, 4, 4096, seed=1, in_place=True)
    assert not schedule.defined
    with pytest.raises(ValueError, match="no defined result"):
        S.reference_outputs(schedule, [np.zeros(1024, np.float32)] * 4)
    meaning = S.reference_outputs(S.build(collective, 4, 4096, seed=1), simulate(schedule)[1])
    memories, _inputs, _ = simulate(schedule)
    wrong = sum(int(np.sum(got != want)) for got, want in zip(received(schedule, memories), meaning))
    assert wrong > 0


@pytest.mark.parametrize("root", [0, 2])
def test_scatter_is_one_to_many_from_the_root(root):
    """Scatter: the root writes one block to every other rank and nothing else moves, so the root
    sends (n-1)/n of `size`, nccl-tests' bus factor; Gather is its mirror."""
    n, size = 4, 4 * 4096
    scatter = S.build("scatter", n, size, root=root, channels=2)
    gather = S.build("gather", n, size, root=root, channels=2)
    assert scatter.sent_bytes(root) == size * S.bus_factor("scatter", n) == gather.received_bytes(root)
    assert all(scatter.sent_bytes(r) == 0 and scatter.received_bytes(r) == size // n
               for r in range(n) if r != root)
    assert {t.src for t in scatter.transfers} == {root}


def test_schedule_items_bound_what_build_makes():
    """validate() refuses a schedule by schedule_items() before anything is built: it must be an
    upper bound of the steps and transfers build() makes, for every collective and shape."""
    for collective in S.COLLECTIVES:
        for algorithm in S.ALGORITHMS.get(collective, ("ring",)):
            for ranks, size, channels, piece in ((2, 4096, 1, 65536), (5, 1 << 16, 3, 4096), (8, 1 << 20, 4, 65536),
                                                 (6, 4 * 6 * 7 + 4, 8, 4), (4, 1 << 14, 2, 4)):
                if collective == "bisection" and ranks % 2:
                    continue
                built = S.build(collective, ranks, size, algorithm=algorithm, channels=channels,
                                        piece_bytes=piece)
                made = len(built.transfers) + sum(len(program) for program in built.programs)
                assert made <= S.schedule_items(collective, algorithm, ranks, size, channels, piece), \
                    (collective, algorithm, ranks, size, channels, piece)


def test_a_runaway_schedule_is_refused_before_it_is_built():
    # a tree AllReduce of 4 GiB in 4-byte pieces: billions of steps, refused in microseconds
    with pytest.raises(ValueError, match="steps and transfers, more than"):
        S.validate("allreduce", 8, 1 << 32, algorithm="tree", piece_bytes=4)
    with pytest.raises(ValueError, match="steps and transfers"):
        S.build("alltoall", 1024, 1 << 20, channels=2)
    assert S.validate("allreduce", 64, 1 << 20, channels=64) == "ring"   # 1.03 million: taken
