"""The queue sampler's series arithmetic, on hand-made samples (no kernel, no fabric)."""

import csv

import numpy as np
import pytest

from fabriclab.queues.sampler import FIELDS, QueueSeries, RowInfo, hop_name


def row(port, node, role, peer, peer_port, peer_role, cls="lossless"):
    return RowInfo(port, node, role, peer, peer_port, peer_role, cls, 20.0)


# A leaf port facing a spine and the spine's port facing it (both lossless), plus an idle NIC.
ROWS = [row("l1-eth3", "l1", "leaf", "s1", "s1-eth1", "spine"),
        row("s1-eth1", "s1", "spine", "l1", "l1-eth3", "leaf"),
        row("h1-n0", "h1", "host", "l1", "l1-eth1", "leaf")]


def series(samples, times=None, wall0=1000.0):
    """samples: list of {row index: {field: value}}; missing fields are 0."""
    data = np.zeros((len(samples), len(ROWS), len(FIELDS)), dtype=np.int64)
    for s, sample in enumerate(samples):
        for i, fields in sample.items():
            for name, value in fields.items():
                data[s, i, FIELDS.index(name)] = value
    times = times or [0.01 * s for s in range(len(samples))]
    return QueueSeries(0.01, times, ROWS, data, wall0)


def test_hop_names_are_role_pairs():
    assert [hop_name(r) for r in ROWS] == ["leaf->spine", "spine->leaf", "NIC->leaf"]


def test_delta_and_level():
    s = series([{1: {"tx_bytes": 0}}, {1: {"tx_bytes": 100}}, {1: {"tx_bytes": 350}}])
    assert list(s.level("s1-eth1/lossless", "tx_bytes")) == [0, 100, 350]
    assert list(s.delta("s1-eth1/lossless", "tx_bytes")) == [0, 100, 250]


def test_active_rows_are_the_ones_that_moved():
    s = series([{0: {"tx_bytes": 5}}, {0: {"tx_bytes": 5}, 1: {"occ": 10}}])
    # l1's counter did not change over the series, but it is not zero; s1 had a queue.
    assert [r.port for r in s.active()] == ["s1-eth1"]


def test_hops_pause_share_counts_only_ports_whose_upstream_sent():
    # The spine sends to the leaf (s1 row tx_bytes moves); the leaf holds it paused in 2 of 4
    # samples and sends 3 pauses. The leaf sends nothing, so the spine has no ingress port here.
    samples = [{1: {"tx_bytes": 0, "occ": 0}, 0: {"paused": 0, "pause_tx": 10}},
               {1: {"tx_bytes": 1000, "occ": 4000}, 0: {"paused": 1, "pause_tx": 11}},
               {1: {"tx_bytes": 2000, "occ": 6000}, 0: {"paused": 1, "pause_tx": 12}},
               {1: {"tx_bytes": 3000, "occ": 2000}, 0: {"paused": 0, "pause_tx": 13}}]
    hops = series(samples, times=[0.0, 0.5, 1.0, 1.5]).hops()
    assert set(hops) == {"leaf->spine", "spine->leaf"}
    leaf = hops["leaf->spine"]
    assert leaf["ingress_ports"] == 1 and leaf["queues"] == 0
    assert leaf["pauses"] == 3 and leaf["pauses_per_s"] == 2.0 and leaf["paused_share"] == 0.5
    spine = hops["spine->leaf"]
    assert spine["queues"] == 1 and spine["ingress_ports"] == 0
    assert spine["occ_max"] == 6000 and spine["occ_mean"] == 3000.0 and spine["pauses"] == 0


def test_hop_series_sums_ports_and_zeroes_counters():
    s = series([{0: {"marks": 7, "occ": 1}, 1: {"occ": 2}}, {0: {"marks": 9, "occ": 3}, 1: {"occ": 4}}])
    assert {k: list(v) for k, v in s.hop_series("marks").items()} == {"leaf->spine": [0, 2]}
    assert {k: list(v) for k, v in s.hop_series("occ").items()} == {"leaf->spine": [1, 3], "spine->leaf": [2, 4]}


def test_window_keeps_the_sample_before_the_start():
    s = series([{1: {"tx_bytes": 10 * i}} for i in range(10)])     # t = 0.00 .. 0.09
    w = s.window(1000.0 + 0.035, 1000.0 + 0.06)
    assert w.times == pytest.approx([0.03, 0.04, 0.05, 0.06])
    assert w._change("s1-eth1/lossless", "tx_bytes") == 30


def test_timing_reports_the_interval_reached():
    t = series([{}] * 5, times=[0.0, 0.01, 0.02, 0.05, 0.06]).timing()
    assert t["samples"] == 5 and t["reached_median_s"] == pytest.approx(0.01)
    assert t["largest_gap_s"] == pytest.approx(0.03) and t["duration_s"] == pytest.approx(0.06)


def test_summary_and_csv(tmp_path):
    s = series([{1: {"tx_bytes": 0, "occ": 0}}, {1: {"tx_bytes": 500, "occ": 300, "paused": 1}}])
    (only,) = s.summary()
    assert only["port"] == "s1-eth1" and only["tx_bytes"] == 500 and only["occ_max"] == 300
    assert only["paused_share"] == 0.5
    path = s.write_csv(tmp_path / "q.csv")
    lines = list(csv.reader(open(path)))
    assert lines[0][:6] == ["t_s", "port", "node", "peer", "role", "class"]
    assert len(lines) == 1 + 2 and lines[2][1] == "s1-eth1" and lines[2][6 + FIELDS.index("occ")] == "300"


def test_csv_holds_every_chosen_row_of_every_sample_in_order(tmp_path):
    s = series([{0: {"tx_bytes": 7}, 2: {"occ": 1}}, {0: {"tx_bytes": 9}, 2: {"occ": 2, "held": -3}},
                {1: {"paused": 1}}], times=[0.0, 0.0123456789, 1.5])
    chosen = [ROWS[2], ROWS[0]]
    lines = list(csv.reader(open(s.write_csv(tmp_path / "q.csv", rows=chosen))))
    want = [[f"{t:.6f}", r.port, r.node, r.peer, r.role, r.cls,
             *(str(int(s.data[k, ROWS.index(r), f])) for f in range(len(FIELDS)))]
            for k, t in enumerate(s.times) for r in chosen]
    assert lines[1:] == want and lines[2][0] == "0.000000" and lines[3][0] == "0.012346"
