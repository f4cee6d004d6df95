"""SPX CC arithmetic (fabriclab.traffic.spxcc) on a fake clock, against numbers worked out by hand.

Most tests use a 100 Mbit/s line, a 30% CNP cut, 5 Mbit/s additive steps, a 1 s tolerance and a
10 s initial RTT, so each expected value is a short chain written next to the assert.
"""

import math

import pytest

from fabriclab.traffic import cc
from fabriclab.traffic.dcqcn import DcqcnParams, NotificationPoint
from fabriclab.traffic.spxcc import NIC_DEFAULTS, ReactionPoint, RttProbe, SpxParams


def params(**overrides):
    base = dict(line_rate_mbps=100.0, cnp_cut=0.3, ai_rate_mbps=5.0, rtt_tolerance_s=1.0,
                delay_beta=0.2, max_delay_cut=0.1, initial_rtt_s=10.0, rtt_gain=0.5,
                min_rate_mbps=1.0)
    base.update(overrides)
    return SpxParams(**base)


# -- CNPs ----------------------------------------------------------------------------------------

def test_a_cnp_cuts_the_rate_by_cnp_cut():
    rp = ReactionPoint(params())
    assert rp.rate_mbps == 100.0 and not rp.throttled
    rp.on_cnp(0.0)
    assert rp.rate_mbps == pytest.approx(70.0)          # 100 * (1 - 0.3)
    assert rp.throttled
    assert rp.counters["cnps"] == 1 and rp.counters["rate_decreases"] == 1


def test_cnps_within_one_rtt_of_a_cut_are_ignored():
    rp = ReactionPoint(params())                  # no sample yet: the RTT is initial_rtt, 10 s
    rp.on_cnp(0.0)
    rp.on_cnp(5.0)                                # 5 s after the cut: the same congestion event
    rp.on_cnp(9.999)
    assert rp.rate_mbps == pytest.approx(70.0)
    rp.on_cnp(10.0)                               # an RTT later: a new event
    assert rp.rate_mbps == pytest.approx(49.0)          # 70 * 0.7
    assert rp.counters["cnps"] == 4 and rp.counters["cnps_ignored"] == 2
    assert rp.counters["rate_decreases"] == 2


def test_the_cut_window_follows_the_smoothed_rtt_once_samples_arrive():
    rp = ReactionPoint(params(rtt_tolerance_s=100.0))   # no delay decrease in this test
    rp.on_rtt(2.0, 0.0)                           # srtt 2 (the first sample)
    rp.on_rtt(4.0, 0.0)                           # srtt 0.5 * 2 + 0.5 * 4 = 3
    assert rp.rtt_s == 3.0
    rp.on_cnp(1.0)
    rp.on_cnp(3.5)                                # 2.5 s later: inside the 3 s window
    rp.on_cnp(4.0)                                # 3 s later: a new event
    assert rp.rate_mbps == pytest.approx(49.0)
    assert rp.counters["cnps_ignored"] == 1


def test_the_rate_never_drops_below_min_rate():
    rp = ReactionPoint(params(min_rate_mbps=40.0, initial_rtt_s=1.0))
    rates = []
    for t in range(4):
        rp.on_cnp(float(t))
        rates.append(rp.rate_mbps)
    assert rates == pytest.approx([70.0, 49.0, 40.0, 40.0])   # 34.3 clamped up to 40
    assert rp.counters["rate_decreases"] == 3                 # the last one lowered nothing


# -- RTT samples -------------------------------------------------------------------------------------

def test_samples_at_or_below_the_target_raise_the_rate_additively_up_to_line_rate():
    rp = ReactionPoint(params())
    rp.on_cnp(0.0)                                # 70
    rp.on_rtt(2.0, 1.0)                           # base 2, target 3: +5
    assert rp.rate_mbps == pytest.approx(75.0)
    rp.on_rtt(3.0, 2.0)                           # exactly the target: still an increase
    assert rp.rate_mbps == pytest.approx(80.0)
    for t in range(3, 10):
        rp.on_rtt(2.5, float(t))
    assert rp.rate_mbps == 100.0 and not rp.throttled     # 80 + 4 * 5, capped at line rate
    assert rp.counters["additive_increase"] == 6          # none once at line rate
    assert rp.base_rtt_s == 2.0 and rp.target_rtt_s == 3.0


def test_a_sample_above_the_target_lowers_the_rate_gently():
    rp = ReactionPoint(params())
    rp.on_rtt(2.0, 0.0)                           # base 2, target 3, srtt 2
    rp.on_rtt(4.0, 1.0)                           # 1 s over: cut 0.2 * (4 - 3) / 4 = 5%
    assert rp.rate_mbps == pytest.approx(95.0)
    assert rp.counters["delay_decrease"] == 1


def test_a_delay_decrease_is_capped_by_max_delay_cut():
    rp = ReactionPoint(params())
    rp.on_rtt(1.0, 0.0)                           # base 1, target 2
    rp.on_rtt(100.0, 1.0)                         # 0.2 * 98 / 100 = 19.6%, capped at 10%
    assert rp.rate_mbps == pytest.approx(90.0)


def test_delay_decreases_come_at_most_once_per_rtt():
    rp = ReactionPoint(params(rtt_gain=0.125))
    rp.on_rtt(2.0, 0.0)                           # srtt 2
    rp.on_rtt(12.0, 1.0)                          # cut 10% (capped); srtt 2 + (12 - 2)/8 = 3.25
    rp.on_rtt(12.0, 3.0)                          # 2 s after the cut, srtt 4.47: no second cut
    assert rp.rate_mbps == pytest.approx(90.0)
    rp.on_rtt(12.0, 10.0)                         # 9 s later, srtt ~5.5: a second cut
    assert rp.rate_mbps == pytest.approx(81.0)
    assert rp.counters["delay_decrease"] == 2 and rp.counters["rtt_samples"] == 4


def test_the_base_rtt_is_the_lowest_sample_and_moves_the_target_down():
    rp = ReactionPoint(params(rtt_tolerance_s=0.5))
    rp.on_rtt(3.0, 0.0)
    assert rp.target_rtt_s == 3.5
    rp.on_rtt(1.0, 1.0)
    rp.on_rtt(5.0, 2.0)
    assert rp.base_rtt_s == 1.0 and rp.target_rtt_s == 1.5
    assert rp.counters["delay_decrease"] == 1     # 5 > 1.5


def test_a_burst_absorbed_in_one_rtt_costs_spx_less_than_dcqcn():
    """The paper's argument in numbers: one CNP burst (a CNP every 4 us for 20 us) at a 400G
    port. DCQCN cuts on each CNP; SPX once per RTT."""
    dcqcn = cc.reaction_point(DcqcnParams())
    spx = cc.reaction_point(SpxParams())
    for k in range(6):
        t = k * 4e-6
        dcqcn.on_cnp(t)
        spx.on_cnp(t)
    # cuts at 0, 8 and 16 us (each 5 us initial RTT window swallows the next CNP): 0.7**3
    assert spx.rate_mbps == pytest.approx(400_000.0 * 0.7 ** 3)
    assert spx.counters["rate_decreases"] == 3 and spx.counters["cnps_ignored"] == 3
    assert dcqcn.rate_mbps < 20_000.0                    # six cuts of nearly half each


def test_time_going_backwards_and_bad_samples_are_errors():
    rp = ReactionPoint(params())
    rp.on_cnp(5.0)
    with pytest.raises(ValueError, match="backwards"):
        rp.on_rtt(1.0, 4.0)
    for bad in (0.0, -1.0, math.nan, math.inf, True, "1"):
        with pytest.raises(ValueError, match="RTT sample"):
            rp.on_rtt(bad, 6.0)
    with pytest.raises(ValueError, match="nbytes"):
        rp.on_sent(-1, 6.0)


def test_no_timers_sent_bytes_and_time_leave_the_rate_alone():
    rp = ReactionPoint(params())
    rp.on_cnp(0.0)
    rp.on_sent(10**9, 100.0)
    rp.advance(1000.0)
    assert rp.next_event(2000.0) is None
    assert rp.rate_mbps == pytest.approx(70.0)


# -- RTT probes ---------------------------------------------------------------------------------

def test_a_probe_echo_gives_the_rtt_and_frees_the_next_probe():
    probe = RttProbe(timeout_s=1.0)
    assert probe.wants_probe(0.0)
    seq = probe.probe_sent(0.0)
    assert not probe.wants_probe(0.5)             # one in flight
    assert probe.on_echo(seq, 0.25) == 0.25
    assert probe.wants_probe(0.25)
    seq2 = probe.probe_sent(0.3)
    assert seq2 == seq + 1
    assert probe.on_echo(seq2, 0.4) == pytest.approx(0.1)
    assert probe.summary() == {"probes_sent": 2, "echoes": 2, "lost": 0,
                               "rtt_ms": {"min": 100.0, "max": 250.0, "mean": 175.0}}


def test_a_probe_not_echoed_in_time_is_lost_and_its_late_echo_ignored():
    probe = RttProbe(timeout_s=1.0)
    seq = probe.probe_sent(0.0)
    assert not probe.wants_probe(0.99)
    assert probe.wants_probe(1.0)                 # timed out: the next may go
    assert probe.lost == 1
    assert probe.on_echo(seq, 1.2) is None        # too late: no sample
    seq2 = probe.probe_sent(1.2)
    assert probe.on_echo(seq + 7, 1.3) is None    # never sent
    assert probe.on_echo(seq2, 1.5) == pytest.approx(0.3)


def test_with_every_bytes_a_probe_waits_for_that_much_data():
    probe = RttProbe(timeout_s=1.0, every_bytes=8192)
    assert not probe.wants_probe(0.0)             # nothing sent yet
    probe.on_data(4096)
    assert not probe.wants_probe(0.1)
    probe.on_data(4096)
    assert probe.wants_probe(0.2)
    seq = probe.probe_sent(0.2)
    assert probe.on_echo(seq, 0.3) == pytest.approx(0.1)
    assert not probe.wants_probe(0.4)             # the count starts again at the probe
    probe.on_data(9000)
    assert probe.wants_probe(0.5)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="spacing"):
            RttProbe(1.0, bad)


def test_a_probe_timeout_must_be_positive():
    for bad in (0, -1.0, math.nan, None):
        with pytest.raises(ValueError, match="timeout"):
            RttProbe(bad)


# -- parameters ---------------------------------------------------------------------------------

def test_defaults_are_the_documented_real_units_of_a_400g_port():
    p = SpxParams()
    assert p.line_rate_mbps == 400_000.0
    assert p.cnp_cut == NIC_DEFAULTS["cnp_cut"] == 0.3
    assert p.ai_rate_mbps == 4000.0
    assert p.rtt_tolerance_s == pytest.approx(2e-6)
    assert p.initial_rtt_s == pytest.approx(5e-6)
    assert p.min_time_between_cnps_s == pytest.approx(4e-6)


def test_scaled_stretches_times_and_shrinks_rates_by_the_time_scale():
    p = SpxParams.scaled(6.0, 66667.0)
    assert p.line_rate_mbps == 6.0
    assert p.rtt_tolerance_s == pytest.approx(2e-6 * 66667)      # 133 ms
    assert p.initial_rtt_s == pytest.approx(5e-6 * 66667)
    assert p.min_time_between_cnps_s == pytest.approx(4e-6 * 66667)
    assert p.ai_rate_mbps == pytest.approx(4000 / 66667)
    assert p.min_rate_mbps == pytest.approx(100 / 66667)
    assert (p.cnp_cut, p.delay_beta, p.max_delay_cut, p.rtt_gain) == (0.3, 0.2, 0.1, 0.125)
    q = SpxParams.scaled(6.0, 66667.0, cnp_cut=0.5, rtt_tolerance=1.0)
    assert q.cnp_cut == 0.5 and q.rtt_tolerance_s == pytest.approx(1e-6 * 66667)
    assert SpxParams(**q.to_dict()) == q


def test_a_scaled_context_follows_the_hardware_one_in_units_of_line_rate():
    hw, lab = ReactionPoint(SpxParams()), ReactionPoint(SpxParams.scaled(6.0, 66667.0))
    scale = 66667.0
    for rp, k in ((hw, 1.0), (lab, scale)):
        rp.on_rtt(3e-6 * k, 0.0)
        rp.on_cnp(1e-6 * k)
        rp.on_rtt(3e-6 * k, 2e-6 * k)
        rp.on_rtt(9e-6 * k, 30e-6 * k)
    assert lab.rate_mbps / 6.0 == pytest.approx(hw.rate_mbps / 400_000.0)


@pytest.mark.parametrize("field, value", [
    ("line_rate_mbps", 0), ("cnp_cut", 0.0), ("cnp_cut", 1.0), ("ai_rate_mbps", -1.0),
    ("rtt_tolerance_s", -1e-6), ("delay_beta", math.nan), ("max_delay_cut", 1.5),
    ("initial_rtt_s", math.inf), ("rtt_gain", 0), ("min_rate_mbps", 0), ("cnp_cut", True),
    ("min_time_between_cnps_s", -1.0), ("ai_rate_mbps", "5"),
])
def test_bad_parameters_are_errors_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"SPX parameter {field} "):
        params(**{field: value})


def test_min_rate_above_line_rate_is_an_error():
    with pytest.raises(ValueError, match="min_rate_mbps .* exceeds line_rate_mbps"):
        params(min_rate_mbps=200.0)


@pytest.mark.parametrize("kwargs, name", [
    ({"cnp_cutt": 0.3}, "unknown SPX parameter 'cnp_cutt'"),
    ({"cnp_cut": 2}, "SPX parameter cnp_cut "), ({"ai_rate": math.nan}, "SPX parameter ai_rate "),
    ({"rtt_tolerance": -1}, "SPX parameter rtt_tolerance "),
    ({"x" * 500: 1}, "unknown SPX parameter 'xxxx"),
])
def test_scaled_names_the_bad_real_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name) as info:
        SpxParams.scaled(6.0, 1000.0, **kwargs)
    assert len(str(info.value)) < 250


def test_the_notification_point_reads_spx_params_cnp_spacing():
    np_ = NotificationPoint(params(min_time_between_cnps_s=1.0))
    assert np_.on_ce(0.0) and not np_.on_ce(0.5) and np_.on_ce(1.0)


# -- the registry -------------------------------------------------------------------------------

def test_the_registry_builds_each_kind_from_its_params():
    assert set(cc.KINDS) == {"dcqcn", "spx"} and cc.DEFAULT == "dcqcn"
    assert type(cc.reaction_point(SpxParams())) is ReactionPoint
    assert cc.of_params(DcqcnParams()).name == "dcqcn" and not cc.KINDS["dcqcn"].uses_rtt
    assert cc.KINDS["spx"].uses_rtt
    spx = cc.kind("spx")
    p = spx.scaled(10.0, 100.0, {"cnp_cut": 0.4})
    assert spx.from_dict(p.to_dict()) == p
    with pytest.raises(ValueError, match="cc must be one of dcqcn, spx"):
        cc.kind("swift")
    with pytest.raises(ValueError, match="no congestion-control kind"):
        cc.of_params({"line_rate_mbps": 1})
