"""Queue sampling on a fabric split over machines, without a network: the other machine's helper
samples its own maps on its own grid and hands its series back in chunks; the sampler here merges
each of its samples into the one here nearest in time. The helper's answers are treated as hostile."""

import base64
import ctypes
import json
import queue
import time
import types
import zlib

import numpy as np
import pytest

from fabriclab.errors import LabError
from fabriclab.cluster import remotequeues
from fabriclab.cluster.remotequeues import RemoteQueues, Sampling
from fabriclab.queues.datapath import NCLASS, QStat
from fabriclab.queues.sampler import FIELDS, QueueSampler, nearest

NROWS = 2 * NCLASS


class Maps:
    """A machine's queue model as the sampler reads it: two ports, row 0's tx_bytes grows by `step`
    per read and row 1 shows `paused` from the 3rd read on."""

    def __init__(self, step, peers=None):
        self.step, self.reads, self.peers = step, 0, peers or {}
        self.mine = self                 # its machine's part (queues/machine.py) is the fake itself
        self.datapath = object()
        self.ports = [types.SimpleNamespace(name=f"l1-eth{i + 1}", node="l1", role="leaf", peer_node="s1", peer=i,
                                            rate_mbps=10.0) for i in range(2)]

    def read_rows(self):
        self.reads += 1
        stats = (QStat * NROWS)()
        stats[0].tx_bytes = self.step * self.reads
        stats[1].paused = int(self.reads >= 3)
        return stats, (ctypes.c_int64 * NROWS)(*([5] * NROWS))


class Loopback:
    """A channel whose other end is the helper's dispatcher, answering at once."""

    def __init__(self, model, sampling):
        self.model, self.sampling, self.answers = model, sampling, queue.Queue()

    def send(self, line):
        answer = remotequeues._answer(self.model, line, self.sampling)
        if answer is not None:
            self.answers.put(json.loads(json.dumps(answer)))       # as a line would carry it

    def read(self, limit):
        answer = self.answers.get(timeout=5)
        if answer is None:
            raise LabError("queue model on m2: no answer")
        return answer

    def close(self):
        self.answers.put(None)


class Machine:
    name = "m2"


def peer_over(model, offset_s=0.0):
    peer = RemoteQueues(Machine(), "run", 2, lambda *a: None)
    peer.offset_s, peer.round_trip_s = offset_s, 0.002
    peer.talk.attach(Loopback(model, Sampling()), "test-peer")
    return peer


def test_the_other_machine_samples_on_its_grid_and_sends_its_series_back_in_chunks(monkeypatch):
    monkeypatch.setattr(remotequeues, "CHUNK_BYTES", 3 * NROWS * (ctypes.sizeof(QStat) + 8))   # 3 a chunk
    there = Maps(step=100)
    peer = peer_over(there, offset_s=100.0)                  # its clock (this one) taken as 100 s ahead
    before = time.time()
    peer.start_sampling(0.005)
    time.sleep(0.2)
    walls, stats, bias = peer.samples(NROWS)
    after = time.time()
    assert len(walls) >= 10 and len(peer.channel.answers.queue) == 0
    assert before - 100.01 <= walls[0] <= walls[-1] <= after - 99.99        # set back onto this clock
    assert all(b > a for a, b in zip(walls, walls[1:]))
    assert list(stats["tx_bytes"][:, 0]) == [100 * (i + 1) for i in range(len(walls))]
    assert stats.shape == bias.shape == (len(walls), NROWS) and (bias == 5).all()
    time.sleep(0.05)
    assert there.reads == len(walls)                         # the first request ended the sampling
    peer.start_sampling(0.005)                               # the next run samples again,
    time.sleep(0.05)
    peer.start_sampling(0.005)                               # and one whose run failed is replaced
    time.sleep(0.05)
    walls, _stats, _bias = peer.samples(NROWS)
    assert 0 < len(walls) < 20 and walls[0] > after - 100
    peer.channel.close()


def test_a_sampling_request_out_of_range_is_refused():
    model, sampling = Maps(1), Sampling()
    for bad in (0, 1e-4, 11, float("nan"), "fast", True):
        assert "error" in remotequeues._answer(model, json.dumps({"sample": bad}), sampling)
    assert remotequeues._answer(model, json.dumps({"samples": 0}), sampling) == {"error": "samples: not sampling"}
    assert "error" in remotequeues._answer(model, json.dumps({"samples": -1}), sampling)


def chunk(walls, stats_bytes, bias_bytes, left=0):
    pack = lambda data: base64.b64encode(zlib.compress(data)).decode()      # noqa: E731
    return {"samples": {"wall": walls, "stats": pack(stats_bytes), "bias": pack(bias_bytes), "left": left}}


def scripted(lines):
    peer = RemoteQueues(Machine(), "run", 2, lambda *a: None)
    peer.round_trip_s = 0.002
    peer.talk.channel = types.SimpleNamespace(lines=list(lines), send=lambda line: None, close=lambda: None,
                                              read=lambda limit: peer.channel.lines.pop(0) if peer.channel.lines
                                              else (_ for _ in ()).throw(LabError("queue model on m2: no answer")))
    peer.talk.read_all(peer.talk.channel)
    return peer


@pytest.mark.parametrize("reply, words", [
    (chunk([1.0], bytes(ctypes.sizeof(QStat) * NROWS - 1), bytes(8 * NROWS)), "size"),       # a row short
    (chunk([1.0], bytes(ctypes.sizeof(QStat) * NROWS * 1000), bytes(8 * NROWS)), "size"),    # a bomb
    (chunk([2.0, 1.0], bytes(ctypes.sizeof(QStat) * NROWS * 2), bytes(16 * NROWS)), "out of order"),
    (chunk([float("inf")], bytes(ctypes.sizeof(QStat) * NROWS), bytes(8 * NROWS)), "malformed"),
    ({"samples": {"wall": [], "stats": "", "bias": "", "left": 0, "more": 1}}, "malformed"),
    ({"samples": {"wall": [1.0], "stats": "!!", "bias": "", "left": 0}}, "size"),
])
def test_a_malformed_series_from_the_other_machine_is_refused(reply, words):
    with pytest.raises(LabError, match=words):
        scripted([reply]).samples(NROWS)


def test_the_series_here_merges_each_other_machines_sample_nearest_in_time():
    class Peer:
        machine = Machine()

        def __init__(self):
            self.started = None

        def start_sampling(self, interval_s):
            self.started = interval_s

        def samples(self, nrows):
            # every 40 ms from 10 ms after the start here: tx_bytes 1000, 2000, ...; paused from the 2nd
            walls = [sampler.wall0 + 0.01 + 0.04 * i for i in range(10)]
            stats = np.zeros((10, nrows), dtype=np.dtype(QStat))
            stats["tx_bytes"][:, 0] = 1000 * np.arange(1, 11)
            stats["paused"][1:, 1] = 1
            return walls, stats, np.full((10, nrows), 2, dtype=np.int64)

    peer = Peer()
    here = Maps(step=1, peers={"m2": peer})
    sampler = QueueSampler(here, interval_s=0.01).start()
    time.sleep(0.15)
    series = sampler.stop()
    assert peer.started == 0.01
    theirs = nearest([0.01 + 0.04 * i for i in range(10)], series.times)
    tx = series.data[:, 0, FIELDS.index("tx_bytes")]
    assert list(tx) == [(i + 1) + 1000 * (j + 1) for i, j in enumerate(theirs)]      # counters add up
    paused = series.data[:, 1, FIELDS.index("paused")]
    assert list(paused) == [int(i >= 2 or j >= 1) for i, j in enumerate(theirs)]     # flags: either
    assert (series.data[:, :, FIELDS.index("held")] == -7).all()                     # less both biases


def test_nearest_picks_the_closer_neighbour_and_clamps_at_the_ends():
    assert list(nearest([0.0, 1.0, 2.0], [-5, 0.4, 0.6, 1.5, 9])) == [0, 0, 1, 1, 2]
