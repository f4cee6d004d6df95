"""Port telemetry from synthetic counters: no sampler thread, no /sys. Columns of a fabric, binned
rates of a PortSeries, the symmetry groups and their outliers, NIC histograms and stragglers, and
a fault's impact on delivered traffic. Every counter below is written so its Mbit/s are exact."""

import csv
import random

import numpy as np
import pytest

from fabriclab.measure import recovery

from fabriclab.measure import symmetry
from fabriclab.measure.portsampler import PortSeries, columns
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import load_spec

BIN = 0.05


@pytest.fixture(scope="module")
def tiny():
    """2x2, one host per leaf, 10 Mbit/s everywhere."""
    return columns(Fabric(load_spec("tiny")))


@pytest.fixture(scope="module")
def default():
    """4x4, two hosts per leaf, 20 Mbit/s everywhere."""
    return columns(Fabric(load_spec("default")))


def series_of(cols, bins, bin_s=BIN, wall0=0.0):
    """A PortSeries sampled exactly at bin edges; `bins` gives Mbit/s per bin for some columns
    (the rest stay idle). Bytes per bin are whole numbers for the rates used here."""
    count = max(len(v) for v in bins.values())
    names = [c.name for c in cols]
    rows = np.zeros((count + 1, len(cols)), dtype=np.int64)
    for name, mbps in bins.items():
        per_bin = [round(m * 1e6 * bin_s / 8) for m in mbps]
        rows[1:, names.index(name)] = np.cumsum(per_bin)
    times = bin_s * np.arange(count + 1)           # exactly the bin edges rates() computes
    return PortSeries(0.005, times, cols, rows.tolist(), wall0)


def by_name(cols):
    return {c.name: c for c in cols}


# -- columns --------------------------------------------------------------------------------------
def test_tiny_columns_in_order(tiny):
    """Fabric links first (both directions, in link order), then each NIC's send and receive."""
    assert [c.name for c in tiny] == [
        "l1>s1", "s1>l1", "l1>s2", "s2>l1", "l2>s1", "s1>l2", "l2>s2", "s2>l2",
        "h1-n0>l1", "l1>h1-n0", "h2-n0>l2", "l2>h2-n0"]
    assert [c.kind for c in tiny] == ["up", "down"] * 4 + ["nic_tx", "nic_rx"] * 2


def test_column_counters_and_interfaces(tiny):
    """Fabric directions read the sender's tx_bytes; both NIC directions read the leaf port, whose
    rx_bytes is what the NIC sent and tx_bytes what it received."""
    cols = by_name(tiny)
    up, down = cols["l1>s1"], cols["s1>l1"]
    assert (up.intf, up.counter, up.src, up.dst, up.link) == ("l1-eth2", "tx_bytes", "l1", "s1", "l1-s1")
    assert (down.intf, down.counter, down.src, down.dst) == ("s1-eth1", "tx_bytes", "s1", "l1")
    assert down.link == "l1-s1"
    send, receive = cols["h1-n0>l1"], cols["l1>h1-n0"]
    assert (send.intf, send.counter, send.host, send.nic) == ("l1-eth1", "rx_bytes", "h1", 0)
    assert send.link == "h1-l1"
    assert (receive.intf, receive.counter, receive.host, receive.nic) == ("l1-eth1", "tx_bytes", "h1", 0)
    assert all(c.rate_mbps == 10.0 and c.plane == 1 for c in tiny)
    assert all(c.host == "" and c.nic == -1 for c in tiny if c.kind in ("up", "down"))


def test_parallel_members_get_a_suffix():
    """The second parallel cable between two switches is #2 in both directions; the first has none."""
    cols = columns(Fabric(load_spec("parallel_links")))
    names = [c.name for c in cols]
    assert names[:4] == ["l1>s1", "s1>l1", "l1>s1#2", "s1>l1#2"]
    assert by_name(cols)["s1>l1#2"].link == "l1-s1#2"
    assert len(names) == len(set(names)) == 2 * 16 + 2 * 16


# -- PortSeries -----------------------------------------------------------------------------------
def test_rates_interpolate_irregular_samples(tiny):
    """A counter growing at exactly 1.25 MB/s reads 10 Mbit/s in every bin, whatever the sample times."""
    rng = random.Random(3)
    times = [0.0] + sorted(rng.uniform(0, 1) for _ in range(37)) + [1.0]
    rows = [[round(1.25e6 * t) if c.name == "l1>s1" else 0 for c in tiny] for t in times]
    series = PortSeries(0.005, times, tiny, rows)
    starts, mbps = series.rates(0.1)
    assert starts == pytest.approx([0.1 * i for i in range(10)])
    assert mbps.shape == (10, len(tiny))
    assert mbps[:, 0] == pytest.approx([10.0] * 10, abs=1e-3)
    assert np.all(mbps[:, 1:] == 0)
    gaps = np.diff(times)
    assert gaps.max() > 3 * gaps.min()                      # the samples really are irregular


def test_rates_in_a_window_and_out_of_range(tiny):
    series = series_of(tiny, {"l1>s1": [10.0] * 20})          # 1 s
    starts, mbps = series.rates(0.1, 0.25, 0.75)
    assert starts == pytest.approx([0.25, 0.35, 0.45, 0.55, 0.65])
    assert mbps[:, 0] == pytest.approx([10.0] * 5)
    clamped, _ = series.rates(0.25, -5.0, 50.0)               # clamped to the series
    assert clamped == pytest.approx([0.0, 0.25, 0.5, 0.75])
    none, empty = series.rates(2.0)
    assert len(none) == 0 and empty.shape == (0, len(tiny))
    with pytest.raises(ValueError):
        series.rates(0)


def test_mean_mbps_over_a_sub_window(tiny):
    """10 Mbit/s for 0.5 s then 30 Mbit/s for 0.5 s: the mean depends on the window asked for."""
    series = series_of(tiny, {"l1>s1": [10.0] * 10 + [30.0] * 10, "s1>l1": [5.0] * 20})
    assert series.mean_mbps()["l1>s1"] == pytest.approx(20.0)
    assert series.mean_mbps(0.25, 0.75)["l1>s1"] == pytest.approx(20.0)
    assert series.mean_mbps(0.6, 0.9)["l1>s1"] == pytest.approx(30.0)
    assert series.mean_mbps(0.0, 0.4)["l1>s1"] == pytest.approx(10.0)
    assert series.mean_mbps(0.1, 0.3)["s1>l1"] == pytest.approx(5.0)
    assert series.mean_mbps(0.7, 0.7) == {c.name: 0.0 for c in tiny}


def test_delivered_sums_only_what_nics_received(tiny):
    series = series_of(tiny, {"l1>s1": [50.0] * 4, "h1-n0>l1": [100.0] * 4,
                              "l1>h1-n0": [3.0] * 4, "l2>h2-n0": [4.0, 4.0, 0.0, 8.0]})
    times, delivered = series.delivered(BIN)
    assert times == pytest.approx([0.0, 0.05, 0.1, 0.15])
    assert delivered == pytest.approx([7.0, 7.0, 3.0, 11.0])


def test_timing_reports_the_reached_interval(tiny):
    """Median and p99 of the gaps between samples, and the largest gap."""
    gaps = [0.005] * 189 + [0.02] * 10 + [0.05]
    times = np.concatenate([[0.0], np.cumsum(gaps)])
    series = PortSeries(0.005, times, tiny, [[0] * len(tiny)] * len(times))
    timing = series.timing()
    assert timing["interval_s"] == 0.005 and timing["samples"] == 201
    assert timing["reached_median_s"] == pytest.approx(0.005)
    assert timing["reached_p99_s"] == pytest.approx(0.02)
    assert timing["largest_gap_s"] == pytest.approx(0.05)
    assert timing["duration_s"] == pytest.approx(sum(gaps), abs=1e-4)
    single = PortSeries(0.005, [0.0], tiny, [[0] * len(tiny)]).timing()
    assert single == {"interval_s": 0.005, "samples": 1}


def test_series_time_is_relative_to_the_first_sample(tiny):
    series = series_of(tiny, {"l1>s1": [1.0] * 4}, wall0=1000.0)
    assert series.to_series_time(1002.5) == pytest.approx(2.5)
    assert series.duration_s == pytest.approx(0.2)


def test_write_csv(tiny, tmp_path):
    series = series_of(tiny, {"l1>s1": [10.0, 20.0, 0.0], "l2>h2-n0": [4.0] * 3})
    path = series.write_csv(tmp_path / "links.csv", BIN)
    rows = list(csv.reader(path.open()))
    assert rows[0] == ["t_s"] + [c.name for c in tiny]
    assert len(rows) == 1 + 3
    first = dict(zip(rows[0], rows[1]))
    assert first["t_s"] == "0.0000" and first["l1>s1"] == "10.000" and first["l2>h2-n0"] == "4.000"
    assert first["s1>l1"] == "0.000"
    assert [r[0] for r in rows[1:]] == ["0.0000", "0.0500", "0.1000"]
    assert [r[1] for r in rows[1:]] == ["10.000", "20.000", "0.000"]


# -- symmetry groups ------------------------------------------------------------------------------
def test_groups_of_a_leaf_spine(default):
    groups = symmetry.groups(default)
    assert set(groups) == ({f"l{i} uplinks" for i in range(1, 5)} | {f"s{i} downlinks" for i in range(1, 5)}
                           | {"NIC send"})
    assert groups["l1 uplinks"] == {f"l1>s{i}": [f"l1>s{i}"] for i in range(1, 5)}
    assert groups["s2 downlinks"] == {f"s2>l{i}": [f"s2>l{i}"] for i in range(1, 5)}
    assert groups["NIC send"] == {f"h{i}-n0": [f"h{i}-n0>l{(i + 1) // 2}"] for i in range(1, 9)}


def test_nic_groups_take_only_the_jobs_hosts(default):
    assert set(symmetry.groups(default, hosts={"h1", "h4"})["NIC send"]) == {"h1-n0", "h4-n0"}
    assert "NIC send" not in symmetry.groups(default, hosts={"h1"})        # one member: no group
    assert "l1 uplinks" in symmetry.groups(default, hosts={"h1"})          # fabric groups stay


def test_groups_of_a_multiplane_fabric():
    """spectrumx_fig16: 4 planes, 2 parallel links per leaf-spine pair, 1 NIC per host split over
    the planes: a planes group of uplink load, and one group per NIC comparing its planes."""
    cols = columns(Fabric(load_spec("spectrumx_fig16")))
    groups = symmetry.groups(cols)
    planes = groups["planes (uplink load)"]
    assert set(planes) == {f"plane {p}" for p in range(1, 5)}
    assert all(len(names) == 3 * 2 * 2 for names in planes.values())
    assert "p3l2>p3s1#2" in planes["plane 3"]
    assert groups["h1 n0 planes"] == {f"plane {p}": [f"h1-n0p{p}>p{p}l1"] for p in range(1, 5)}
    assert set(groups["p1l1 uplinks"]) == {"p1l1>p1s1", "p1l1>p1s1#2", "p1l1>p1s2", "p1l1>p1s2#2"}
    assert len(groups["NIC send"]) == 12 * 4
    assert sum(1 for name in groups if name.endswith(" planes")) == 12


def test_groups_with_two_nics_are_per_rail():
    cols = columns(Fabric(load_spec("meta_ai_zone")))
    groups = symmetry.groups(cols)
    assert "NIC send" not in groups
    assert set(groups["rail 0 NIC send"]) == {f"h{i}-n0" for i in range(1, 9)}
    assert set(groups["rail 1 NIC send"]) == {f"h{i}-n1" for i in range(1, 9)}
    assert "planes (uplink load)" not in groups


# -- outliers and check ---------------------------------------------------------------------------
def test_outliers_are_far_from_the_median():
    loads = {"a": 10.0, "b": 10.0, "c": 5.0, "d": 14.0, "e": 12.0}
    assert symmetry.outliers(loads, 20.0) == [{"member": "c", "mbps": 5.0, "deviation": -0.5},
                                              {"member": "d", "mbps": 14.0, "deviation": 0.4}]
    assert symmetry.outliers(loads, 20.0, tolerance=0.45) == [{"member": "c", "mbps": 5.0, "deviation": -0.5}]


def test_outliers_of_an_idle_or_single_group_are_none():
    """A median under 5 % of line rate is idle, however lopsided; one member has no peers."""
    assert symmetry.outliers({"a": 0.5, "b": 0.5, "c": 0.0}, 20.0) == []
    assert symmetry.outliers({"a": 0.5, "b": 0.5, "c": 0.0}, 20.0, active_fraction=0.01) == [
        {"member": "c", "mbps": 0.0, "deviation": -1.0}]
    assert symmetry.outliers({"a": 20.0}, 20.0) == []


def slow_uplink(default):
    """l1's uplinks: three healthy ones at line rate (20) for 3 of 10 bins, l1>s1 at 30 % for all
    10: every mean is 6 Mbit/s, the busy-bin rates are 20, 20, 20 and 6."""
    healthy = [20.0] * 3 + [0.0] * 7
    return series_of(default, {"l1>s1": [6.0] * 10, "l1>s2": healthy, "l1>s3": healthy[::-1],
                               "l1>s4": healthy[3:] + healthy[:3]})


def test_busy_metric_flags_a_slow_link_with_an_equal_mean(default):
    """The rate a link reaches when busy exposes the slow uplink that its mean hides."""
    series = slow_uplink(default)
    report = {g["group"]: g for g in symmetry.check(series, metric="busy", bin_s=BIN)}
    uplinks = report["l1 uplinks"]
    assert uplinks["metric"] == "busy"
    assert uplinks["members"] == {"l1>s1": 6.0, "l1>s2": 20.0, "l1>s3": 20.0, "l1>s4": 20.0}
    assert uplinks["median_mbps"] == 20.0
    assert uplinks["outliers"] == [{"member": "l1>s1", "mbps": 6.0, "deviation": -0.7}]
    assert symmetry.flagged(report.values()) == [("l1 uplinks", "l1>s1", -0.7, "busy")]
    assert report["s1 downlinks"]["members"] == {f"s1>l{i}": 0.0 for i in range(1, 5)}   # never busy


def test_busy_metric_ignores_idle_bins(default):
    """Bins under 10 % of line rate are idle and left out of the busy rate, not averaged in."""
    series = series_of(default, {"l1>s1": [20.0] * 3 + [1.5] * 7, "l1>s2": [10.0] * 10})
    busy = {g["group"]: g for g in symmetry.check(series, metric="busy")}["l1 uplinks"]["members"]
    mean = {g["group"]: g for g in symmetry.check(series, metric="mean")}["l1 uplinks"]["members"]
    assert (busy["l1>s1"], busy["l1>s2"], busy["l1>s3"]) == (20.0, 10.0, 0.0)
    assert (mean["l1>s1"], mean["l1>s2"]) == (7.05, 10.0)


def test_mean_metric_sees_nothing_wrong_with_the_same_series(default):
    report = symmetry.check(slow_uplink(default), metric="mean")
    uplinks = next(g for g in report if g["group"] == "l1 uplinks")
    assert uplinks["members"] == {name: 6.0 for name in ("l1>s1", "l1>s2", "l1>s3", "l1>s4")}
    assert uplinks["max_mean_ratio"] == 1.0 and uplinks["outliers"] == []
    assert symmetry.flagged(report) == []
    idle = next(g for g in report if g["group"] == "s1 downlinks")
    assert idle["max_mean_ratio"] is None and idle["outliers"] == []


def test_check_rejects_an_unknown_metric(default):
    with pytest.raises(ValueError):
        symmetry.check(slow_uplink(default), metric="p50")


def test_check_over_a_window_and_hosts(default):
    """Only the window is measured: l1>s1 idle before 0.25 s and at 10 Mbit/s after."""
    series = series_of(default, {"l1>s1": [0.0] * 5 + [10.0] * 5, "l1>s2": [10.0] * 10,
                                 "h1-n0>l1": [10.0] * 10, "h2-n0>l1": [2.0] * 10})
    later = {g["group"]: g for g in symmetry.check(series, 0.25, 0.5, hosts={"h1", "h2"})}
    assert later["l1 uplinks"]["members"]["l1>s1"] == pytest.approx(10.0)
    assert later["NIC send"]["members"] == {"h1-n0": 10.0, "h2-n0": 2.0}
    whole = {g["group"]: g for g in symmetry.check(series)}
    assert whole["l1 uplinks"]["members"]["l1>s1"] == pytest.approx(5.0)
    assert len(whole["NIC send"]["members"]) == 8


# -- NIC histograms and stragglers ----------------------------------------------------------------
def nic_series(default):
    """h1-h3 alternate line-rate and idle bins; h4 sends steadily at 40 %; h5-h8 stay idle."""
    bursty = [20.0, 0.0] * 5
    return series_of(default, {"h1-n0>l1": bursty, "h2-n0>l1": bursty[::-1], "h3-n0>l2": bursty,
                               "h4-n0>l2": [8.0] * 10})


def test_nic_histograms(default):
    hist = symmetry.nic_histograms(nic_series(default), BIN, hosts={"h1", "h2", "h3", "h4"})
    assert set(hist) == {"h1-n0", "h2-n0", "h3-n0", "h4-n0"}
    assert hist["h1-n0"] == {"histogram": [0.5] + [0.0] * 8 + [0.5], "idle_share": 0.5,
                             "mean_utilization": 0.5, "busy_mean_utilization": 1.0}
    assert hist["h4-n0"] == {"histogram": [0.0] * 4 + [1.0] + [0.0] * 5, "idle_share": 0.0,
                             "mean_utilization": 0.4, "busy_mean_utilization": 0.4}
    everyone = symmetry.nic_histograms(nic_series(default), BIN)
    assert len(everyone) == 8
    assert everyone["h8-n0"]["idle_share"] == 1.0 and everyone["h8-n0"]["busy_mean_utilization"] == 0.0


def test_nic_histograms_of_received_traffic_are_keyed_by_the_nic(default):
    series = series_of(default, {"l1>h1-n0": [20.0] * 4})
    hist = symmetry.nic_histograms(series, BIN, kind="nic_rx", hosts={"h1", "h2"})
    assert set(hist) == {"h1-n0", "h2-n0"} and hist["h1-n0"]["histogram"][-1] == 1.0


def test_stragglers_pick_the_nic_that_never_reaches_line_rate(default):
    hist = symmetry.nic_histograms(nic_series(default), BIN)
    assert symmetry.stragglers(hist) == ["h4-n0"]          # idle NICs are not stragglers
    assert symmetry.stragglers(hist, tolerance=0.7) == []
    assert symmetry.stragglers({k: hist[k] for k in ("h1-n0", "h5-n0")}) == []


# -- recovery -------------------------------------------------------------------------------------
def bins(values):
    return [round(BIN * i, 9) for i in range(len(values))], values


def test_a_dip_and_recovery():
    """100 Mbit/s, 10 for 0.3 s from the fault at 1.0 s, then 100 again."""
    times, mbps = bins([100.0] * 20 + [10.0] * 6 + [100.0] * 14)
    out = recovery.impact(times, mbps, 1.0)
    assert out["baseline_mbps"] == 100.0 and out["fell"] is True
    assert out["recovery_s"] == pytest.approx(0.3, abs=BIN)
    assert out["min_mbps"] == 10.0 and out["min_at_s"] == 0.0
    assert out["after_mbps"] == 100.0 and out["retained"] == 1.0


def test_a_fault_that_does_not_hurt():
    """Never below half the baseline: recovery 0, the mean after the fault is what is retained."""
    times, mbps = bins([100.0] * 20 + [60.0] * 4 + [100.0] * 16)
    out = recovery.impact(times, mbps, 1.0)
    assert out["fell"] is False and out["recovery_s"] == 0.0
    assert out["min_mbps"] == 60.0
    assert out["after_mbps"] == pytest.approx(92.0) and out["retained"] == pytest.approx(0.92)


def test_a_fault_that_never_recovers():
    times, mbps = bins([100.0] * 20 + [10.0] * 20)
    out = recovery.impact(times, mbps, 1.0)
    assert out["fell"] is True and out["recovery_s"] is None
    assert out["after_mbps"] is None and out["retained"] is None


def test_recovery_only_looks_until_end():
    """The next fault at 1.2 s ends this one's window: it has not come back by then."""
    times, mbps = bins([100.0] * 20 + [10.0] * 6 + [100.0] * 14)
    assert recovery.impact(times, mbps, 1.0, end=1.2)["recovery_s"] is None


def test_baseline_is_the_half_second_before_the_fault():
    times, mbps = bins([0.0] * 10 + [80.0] * 10 + [30.0] * 10)
    out = recovery.impact(times, mbps, 1.0)
    assert out["baseline_mbps"] == 80.0 and out["fell"] is True and out["recovery_s"] is None


BEFORE = "no traffic before the fault to compare with"


def test_no_bins_before_the_fault_gives_a_note():
    """A fault at (or within the first bin of) the series has nothing to compare with."""
    times, mbps = bins([100.0] * 10)
    for fault_at in (0.0, 0.02):
        assert recovery.impact(times, mbps, fault_at) == {"baseline_mbps": None, "recovery_s": None,
                                                          "note": BEFORE}
    assert recovery.impact(times, mbps, 5.0)["note"] == "no traffic after the fault"


def test_no_traffic_before_the_fault_gives_a_note():
    """Idle bins before the fault (jobs still starting) are no baseline: a note, not an instant recovery."""
    times, mbps = bins([0.0] * 20 + [10.0] * 6 + [100.0] * 14)
    out = recovery.impact(times, mbps, 1.0)
    assert out == {"baseline_mbps": None, "recovery_s": None, "note": BEFORE}
    trickle, _ = bins([0.0] * 30)
    start_up = [4.0] * 20 + [100.0] * 10             # 4 % of the run's peak: start-up, not a baseline
    assert recovery.impact(trickle, start_up, 1.0)["note"] == BEFORE
    assert recovery.impact(trickle, [0.0] * 30, 1.0)["note"] == BEFORE


def test_a_fault_in_the_jobs_own_gap_takes_its_baseline_from_before_the_gap():
    """The shape of a CI failure (2026-11-27): the ring idled from 0.43 s before a flap to 0.17 s
    after it (between iterations), so the half second before the flap held nothing. The baseline
    is the traffic before the gap, and the gap is stated."""
    times, mbps = bins([0.0] * 2 + [90.0] * 10 + [0.0] * 8 + [0.0] * 4 + [70.0] * 16)
    out = recovery.impact(times, mbps, 1.0)
    assert out["baseline_mbps"] == 90.0 and out["idle_before_s"] == pytest.approx(0.4)
    assert out["fell"] is True and out["recovery_s"] == pytest.approx(0.2)
    assert out["after_mbps"] == 70.0 and out["retained"] == pytest.approx(70 / 90, abs=1e-3)
    # mid-traffic, nothing idle: the half second just before
    times, mbps = bins([50.0] * 10 + [90.0] * 10 + [30.0] * 10)
    out = recovery.impact(times, mbps, 1.0)
    assert out["baseline_mbps"] == 90.0 and out["idle_before_s"] == 0.0


def test_the_baseline_search_stops_at_its_limit():
    """Traffic more than SEARCH_S before the fault is no baseline for it."""
    gap = round(recovery.SEARCH_S / BIN) + 1
    times, mbps = bins([90.0] * 10 + [0.0] * gap + [90.0] * 10)
    out = recovery.impact(times, mbps, times[10 + gap])
    assert out == {"baseline_mbps": None, "recovery_s": None, "note": BEFORE}


def test_a_small_but_real_baseline_is_used():
    """6 % of the peak is above the floor: the fault is measured against it."""
    times, mbps = bins([6.0] * 20 + [1.0] * 4 + [6.0] * 4 + [100.0])
    out = recovery.impact(times, mbps, 1.0, end=1.4)
    assert out["baseline_mbps"] == 6.0 and out["fell"] is True
    assert out["recovery_s"] == pytest.approx(0.2) and out["after_mbps"] == 6.0
