"""DCQCN arithmetic (fabriclab.traffic.dcqcn) against numbers worked out by hand.

Most tests use a 100 Mbit/s line, alpha starting at 1 and round timer periods, so each expected
value is a short chain of halvings and additions written next to the assert.
"""

import pytest

from fabriclab.traffic.dcqcn import NIC_DEFAULTS, DcqcnParams, NotificationPoint, ReactionPoint


def params(**overrides):
    base = dict(line_rate_mbps=100.0, initial_alpha=1.0, rpg_time_reset_s=1.0,
                dce_tcp_rtt_s=1000.0, rpg_ai_rate_mbps=5.0, rpg_hai_rate_mbps=50.0,
                rpg_min_rate_mbps=1.0, rpg_threshold=1, rpg_byte_reset=1000)
    base.update(overrides)
    return DcqcnParams(**base)


def cut_twice(p):
    """Two CNPs at t=0 with alpha = 1: RC 100 -> 50 -> 25, RT 100 -> 50."""
    rp = ReactionPoint(p)
    rp.on_cnp(0.0)
    rp.on_cnp(0.0)
    assert (rp.rate_mbps, rp.target_rate_mbps) == (25.0, 50.0)
    return rp


# -- rate decrease ---------------------------------------------------------------------------------

def test_one_cnp_from_line_rate_with_alpha_one_halves_the_rate():
    rp = ReactionPoint(params())
    assert rp.rate_mbps == 100.0 and not rp.throttled
    rp.on_cnp(0.0)
    assert rp.rate_mbps == 50.0              # 100 * (1 - 1/2)
    assert rp.target_rate_mbps == 100.0      # RT = RC before the cut
    assert rp.alpha == 1.0                   # (1 - g) * 1 + g
    assert rp.throttled
    assert rp.counters == {"cnps": 1, "rate_decreases": 1, "fast_recovery": 0,
                           "additive_increase": 0, "hyper_increase": 0}


def test_nic_default_alpha_cuts_a_400g_port_to_just_over_half():
    rp = ReactionPoint(DcqcnParams())
    rp.on_cnp(0.0)
    # alpha = 1023/1024: RC = 400000 * (1 - 1023/2048) = 400000 * 1025/2048
    assert rp.rate_mbps == 200195.3125
    # alpha = 1019/1024 * 1023/1024 + 5/1024 = (1019*1023 + 5*1024) / 1024**2
    assert rp.alpha == pytest.approx(1047557 / 1048576, rel=1e-15)


def test_rate_never_drops_below_rpg_min_rate():
    rp = ReactionPoint(params(rpg_min_rate_mbps=10.0))
    rates = []
    for _ in range(5):
        rp.on_cnp(0.0)
        rates.append(rp.rate_mbps)
    assert rates == [50.0, 25.0, 12.5, 10.0, 10.0]     # 6.25 is clamped up to 10
    assert rp.target_rate_mbps == 10.0
    assert rp.counters["cnps"] == 5
    assert rp.counters["rate_decreases"] == 4           # the last CNP could not lower RC


@pytest.mark.parametrize("gd, min_dec_fac, alpha, expected", [
    (10, 25, 0.5, 50.0),     # cut = alpha / 2**0 = 0.5
    (10, 25, 1.0, 25.0),     # cut would be 1 (RC -> 0); min_dec_fac keeps 25 %
    (12, 50, 1.0, 75.0),     # cut = alpha / 2**2 = 0.25
    (11, 60, 1.0, 60.0),     # the paper's halving, bounded at 60 %
])
def test_rpg_gd_and_min_dec_fac_shape_the_cut(gd, min_dec_fac, alpha, expected):
    rp = ReactionPoint(params(rpg_gd=gd, rpg_min_dec_fac=min_dec_fac, initial_alpha=alpha))
    rp.on_cnp(0.0)
    assert rp.rate_mbps == expected


# -- alpha -----------------------------------------------------------------------------------------

def test_alpha_decays_by_one_minus_g_per_period_without_cnps():
    rp = ReactionPoint(params(g=1 / 16, dce_tcp_rtt_s=0.001))
    rp.on_cnp(0.0)
    assert rp.alpha == 1.0
    rp.advance(0.0035)                        # expiries at 1, 2, 3 ms
    assert rp.alpha == (15 / 16) ** 3 == 3375 / 4096
    rp.advance(0.0039)
    assert rp.alpha == 3375 / 4096            # no expiry between 3 and 3.9 ms
    rp.advance(0.004)                         # an expiry due exactly now is applied
    assert rp.alpha == 50625 / 65536
    # The next cut uses the decayed alpha: 50 * (1 - 50625/131072).
    rp.on_cnp(0.004)
    assert rp.rate_mbps == pytest.approx(50 * 80447 / 131072, rel=1e-15)
    assert rp.alpha == pytest.approx(15 / 16 * 50625 / 65536 + 1 / 16, rel=1e-15)
    rp.advance(0.0045)                        # the CNP restarted the alpha timer
    assert rp.alpha == pytest.approx(15 / 16 * 50625 / 65536 + 1 / 16, rel=1e-15)


def test_alpha_holds_its_initial_value_until_the_first_cnp():
    rp = ReactionPoint(params(initial_alpha=0.75, g=0.5, dce_tcp_rtt_s=0.001))
    rp.advance(10.0)
    assert rp.alpha == 0.75
    rp.on_cnp(10.0)
    assert rp.rate_mbps == 62.5               # 100 * (1 - 0.75/2)
    assert rp.alpha == 0.875                  # 0.5 * 0.75 + 0.5


# -- rate increase ---------------------------------------------------------------------------------

def test_fast_recovery_halves_the_gap_to_target_then_additive_increase_raises_the_target():
    rp = cut_twice(params(rpg_threshold=3, rpg_ai_rate_mbps=5.0))
    trace = []
    for t in (1.0, 2.0, 3.0, 4.0, 5.0):
        rp.advance(t)
        trace.append((rp.rate_mbps, rp.target_rate_mbps))
    assert trace == [
        (37.5, 50.0),       # fast recovery: (50 + 25) / 2
        (43.75, 50.0),      # (50 + 37.5) / 2
        (46.875, 50.0),     # (50 + 43.75) / 2; third event, still <= rpg_threshold
        (50.9375, 55.0),    # additive: RT = 50 + 5, RC = (55 + 46.875) / 2
        (55.46875, 60.0),   # RT = 55 + 5, RC = (60 + 50.9375) / 2
    ]
    assert rp.counters["fast_recovery"] == 3
    assert rp.counters["additive_increase"] == 2
    assert rp.counters["hyper_increase"] == 0


def test_hyper_increase_once_both_counters_pass_the_threshold():
    rp = cut_twice(params(rpg_threshold=1, rpg_ai_rate_mbps=1.0, rpg_hai_rate_mbps=10.0,
                          rpg_byte_reset=1000))
    steps = [
        (lambda: rp.on_sent(1000, 0.0), 37.5, 50.0),        # bytes 1, timer 0: fast recovery
        (lambda: rp.advance(1.0), 43.75, 50.0),             # bytes 1, timer 1: fast recovery
        (lambda: rp.on_sent(1000, 1.0), 47.375, 51.0),      # bytes 2, timer 1: additive, +1
        (lambda: rp.advance(2.0), 54.1875, 61.0),           # 2, 2: hyper, i = 1, +10
        (lambda: rp.on_sent(1000, 2.0), 62.59375, 71.0),    # 3, 2: hyper, i = 1, +10
        (lambda: rp.advance(3.0), 76.796875, 91.0),         # 3, 3: hyper, i = 2, +20
        (lambda: rp.on_sent(1000, 3.0), 88.3984375, 100.0),  # 4, 3: i = 2, RT 111 -> line
    ]
    for step, rate, target in steps:
        step()
        assert (rp.rate_mbps, rp.target_rate_mbps) == (rate, target)
    assert rp.counters == {"cnps": 2, "rate_decreases": 2, "fast_recovery": 2,
                           "additive_increase": 1, "hyper_increase": 4}


def test_byte_counter_drives_increases_and_carries_the_remainder():
    rp = ReactionPoint(params(rpg_threshold=5, rpg_time_reset_s=100.0, rpg_byte_reset=1000))
    rp.on_sent(10 ** 6, 0.0)                  # unthrottled: bytes are not counted
    rp.on_cnp(0.0)
    assert rp.rate_mbps == 50.0
    rp.on_sent(999, 0.05)
    assert rp.rate_mbps == 50.0               # nothing carried over from before the CNP
    rp.on_sent(1501, 0.1)                     # 2500 bytes: two events, 500 left
    assert rp.rate_mbps == 87.5               # 50 -> 75 -> 87.5
    rp.on_sent(499, 0.2)
    assert rp.rate_mbps == 87.5
    rp.on_sent(1, 0.3)
    assert rp.rate_mbps == 93.75
    assert rp.counters["fast_recovery"] == 3


def test_a_cnp_resets_the_increase_stages():
    rp = cut_twice(params(rpg_threshold=1))
    for t in (1.0, 2.0, 3.0):
        rp.advance(t)
    assert rp.counters["additive_increase"] == 2
    rp.on_cnp(3.5)
    rp.advance(4.4)
    assert rp.counters["fast_recovery"] == 1              # unchanged: no event since the CNP
    before = rp.rate_mbps
    rp.advance(4.5)                                       # timer restarted at 3.5
    assert rp.counters["fast_recovery"] == 2              # the stage starts over
    assert rp.rate_mbps == (rp.target_rate_mbps + before) / 2


def test_a_cnp_resets_the_byte_counter():
    rp = ReactionPoint(params(rpg_time_reset_s=100.0, rpg_byte_reset=1000))
    rp.on_cnp(0.0)
    rp.on_sent(600, 0.1)
    rp.on_cnp(0.2)                            # RC 50 -> 25, RT 50
    rp.on_sent(600, 0.3)                      # 600 since the CNP: no event
    assert (rp.rate_mbps, rp.counters["fast_recovery"]) == (25.0, 0)
    rp.on_sent(400, 0.4)
    assert (rp.rate_mbps, rp.counters["fast_recovery"]) == (37.5, 1)


def test_a_timer_due_at_the_cnp_instant_fires_before_the_cut():
    rp = ReactionPoint(params())
    rp.on_cnp(0.0)
    rp.on_cnp(1.0)            # the 1.0 s expiry first takes RC 50 -> 75, then the cut halves it
    assert (rp.rate_mbps, rp.target_rate_mbps) == (37.5, 75.0)


def test_recovery_to_line_rate_releases_the_qp():
    rp = ReactionPoint(params(rpg_threshold=1))
    assert rp.next_event(0.0) is None
    rp.on_cnp(0.0)
    assert rp.next_event(0.0) == 1.0
    assert rp.next_event(1.5) == 2.0          # the 1.0 s expiry was applied on the way
    assert rp.rate_mbps == 75.0
    rp.advance(200.0)
    # RT is clamped at 100 from the second event on and RC's gap halves each time: the gap 50/2**n
    # first falls within 1e-12 of line rate (1e-10 Mbit/s) at n = 39 events.
    assert 50 / 2 ** 39 <= 1e-10 < 50 / 2 ** 38
    assert rp.counters["fast_recovery"] == 1
    assert rp.counters["additive_increase"] == 38
    assert (rp.rate_mbps, rp.target_rate_mbps) == (100.0, 100.0)
    assert not rp.throttled
    assert rp.next_event(200.0) is None
    rp.on_sent(10 ** 6, 201.0)
    assert rp.counters["additive_increase"] == 38


# -- determinism -----------------------------------------------------------------------------------

def test_advance_once_or_in_many_steps_gives_identical_state():
    p = params(rpg_threshold=2, rpg_time_reset_s=0.7, dce_tcp_rtt_s=0.003, g=1 / 16,
               rpg_ai_rate_mbps=1.0, rpg_hai_rate_mbps=2.0, rpg_byte_reset=1000)
    once, stepped = cut_twice(p), cut_twice(p)
    for rp in (once, stepped):
        rp.on_sent(5000, 0.0)                 # byte stage 5: timer events past 2 are hyper
    once.advance(10.0)
    for i in range(1, 10001):
        stepped.advance(i / 1000)
    state = [(rp.rate_mbps, rp.target_rate_mbps, rp.alpha, rp.counters, rp.next_event(10.0))
             for rp in (once, stepped)]
    assert state[0] == state[1]
    assert once.alpha == (15 / 16) ** 3333    # 3333 * 3 ms <= 10 s < 3334 * 3 ms
    assert once.counters["hyper_increase"] == 12     # 14 timer events; the first 2 are additive
    assert once.next_event(10.0) == pytest.approx(15 * 0.7)


# -- notification point ----------------------------------------------------------------------------

def test_notification_point_sends_at_most_one_cnp_per_window():
    np_ = NotificationPoint(params(min_time_between_cnps_s=50e-6))
    assert np_.on_ce(0.0) is True
    assert np_.on_ce(10e-6) is False          # within 50 us of the last CNP
    assert np_.on_ce(49e-6) is False
    assert np_.on_ce(50e-6) is True           # exactly one window later
    assert np_.on_ce(60e-6) is False
    assert np_.counters == {"ce_packets": 5, "cnps_sent": 2}


def test_notification_points_pace_each_qp_separately():
    p = params(min_time_between_cnps_s=1e-3)
    a, b = NotificationPoint(p), NotificationPoint(p)
    assert a.on_ce(0.0) and b.on_ce(0.0001)
    assert not a.on_ce(0.0002)
    assert (a.counters["cnps_sent"], b.counters["cnps_sent"]) == (1, 1)


def test_zero_cnp_interval_answers_every_ce_mark():
    np_ = NotificationPoint(params(min_time_between_cnps_s=0.0))
    assert [np_.on_ce(0.0), np_.on_ce(0.0), np_.on_ce(1e-9)] == [True, True, True]
    assert np_.counters == {"ce_packets": 3, "cnps_sent": 3}


def test_time_going_backwards_is_an_error():
    rp = ReactionPoint(params())
    rp.advance(2.0)
    with pytest.raises(ValueError, match="backwards"):
        rp.on_cnp(1.0)
    np_ = NotificationPoint(params())
    np_.on_ce(2.0)
    with pytest.raises(ValueError, match="backwards"):
        np_.on_ce(1.0)


# -- parameters ------------------------------------------------------------------------------------

def test_defaults_are_the_nic_defaults_of_a_400g_port():
    p = DcqcnParams()
    assert p == DcqcnParams.scaled(400_000, 1.0)
    assert p.rpg_time_reset_s == pytest.approx(300e-6)
    assert p.dce_tcp_rtt_s == pytest.approx(1e-6)
    assert p.min_time_between_cnps_s == pytest.approx(4e-6)
    assert (p.rpg_byte_reset, p.rpg_threshold, p.rpg_gd, p.rpg_min_dec_fac) == (32767, 1, 11, 50)
    assert (p.rpg_ai_rate_mbps, p.rpg_hai_rate_mbps, p.rpg_min_rate_mbps) == (5, 50, 1)
    assert p.g == 5 / 1024 and p.initial_alpha == 1023 / 1024
    assert p.to_dict()["rpg_time_reset_s"] == p.rpg_time_reset_s and len(p.to_dict()) == 13


def test_scaled_stretches_timers_and_shrinks_rate_steps_by_the_time_scale():
    p = DcqcnParams.scaled(20.0, 20_000)      # 20 Mbit/s standing in for 400 Gbit/s
    assert p.line_rate_mbps == 20.0
    assert p.rpg_time_reset_s == pytest.approx(6.0)            # 300 us * 20000
    assert p.dce_tcp_rtt_s == pytest.approx(0.02)              # 1 us * 20000
    assert p.min_time_between_cnps_s == pytest.approx(0.08)    # 4 us * 20000
    assert p.rpg_ai_rate_mbps == pytest.approx(0.00025)        # 5 Mbit/s / 20000
    assert p.rpg_hai_rate_mbps == pytest.approx(0.0025)
    assert p.rpg_min_rate_mbps == pytest.approx(0.00005)
    assert p.rpg_byte_reset == 32767          # rate / 20000 x time * 20000: bytes unchanged
    tuned = DcqcnParams.scaled(20.0, 20_000, rpg_time_reset=55, rpg_ai_rate=40, dce_tcp_g=1020,
                               initial_alpha_value=512, min_time_between_cnps=0)
    assert tuned.rpg_time_reset_s == pytest.approx(1.1)
    assert tuned.rpg_ai_rate_mbps == pytest.approx(0.002)
    assert tuned.g == 4 / 1024 and tuned.initial_alpha == 0.5
    assert tuned.min_time_between_cnps_s == 0


def test_a_scaled_lab_qp_follows_the_hardware_qp_in_units_of_line_rate():
    real, lab = ReactionPoint(DcqcnParams()), ReactionPoint(DcqcnParams.scaled(20.0, 20_000))
    real.on_cnp(0.0)
    lab.on_cnp(0.0)
    real.on_sent(3 * 32767, 0.0001)
    lab.on_sent(3 * 32767, 2.0)
    # 3 timer events (300 us / 6 s) and 1050 alpha periods (1 us / 20 ms) on both.
    real.advance(1.0505e-3)
    lab.advance(21.01)
    assert real.counters == lab.counters
    assert real.counters["hyper_increase"] > 0
    assert lab.rate_mbps / 20.0 == pytest.approx(real.rate_mbps / 400_000, rel=1e-9)
    assert lab.target_rate_mbps / 20.0 == pytest.approx(real.target_rate_mbps / 400_000, rel=1e-9)
    assert lab.alpha == real.alpha
    assert real.alpha == pytest.approx(1047557 / 1048576 * (1019 / 1024) ** 1050, rel=1e-12)


@pytest.mark.parametrize("field, value", [
    ("line_rate_mbps", 0), ("line_rate_mbps", -20.0), ("line_rate_mbps", float("nan")),
    ("rpg_time_reset_s", 0.0), ("rpg_time_reset_s", -1e-6),
    ("rpg_ai_rate_mbps", 0.0), ("rpg_hai_rate_mbps", -50.0), ("rpg_min_rate_mbps", 0.0),
    ("dce_tcp_rtt_s", 0.0), ("dce_tcp_rtt_s", float("inf")),
    ("rpg_byte_reset", 0), ("rpg_byte_reset", 1000.5),
    ("rpg_threshold", 0), ("rpg_threshold", True),
    ("rpg_gd", 9), ("rpg_min_dec_fac", 101), ("rpg_min_dec_fac", -1),
    ("g", 0.0), ("g", 1.5), ("initial_alpha", 0.0), ("initial_alpha", 1.01),
    ("min_time_between_cnps_s", -1e-6), ("min_time_between_cnps_s", "4us"),
])
def test_bad_parameters_are_errors_naming_the_field(field, value):
    with pytest.raises(ValueError, match=rf"parameter {field} must be"):
        params(**{field: value})


def test_min_rate_above_line_rate_is_an_error():
    with pytest.raises(ValueError, match="rpg_min_rate_mbps"):
        params(line_rate_mbps=10.0, rpg_min_rate_mbps=20.0)


@pytest.mark.parametrize("kwargs, name", [
    ({"time_scale": 0}, "time_scale"),
    ({"rpg_time_reset": 0}, "rpg_time_reset"),
    ({"rpg_hai_rate": -1}, "rpg_hai_rate"),
    ({"dce_tcp_g": 1024}, "dce_tcp_g"),
    ({"initial_alpha_value": 0}, "initial_alpha_value"),
    ({"min_time_between_cnps": -2}, "min_time_between_cnps"),
    ({"rpg_timer": 300}, "rpg_timer"),
])
def test_scaled_names_the_bad_nic_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        DcqcnParams.scaled(20.0, **kwargs)


def test_nic_defaults_cover_every_scaled_parameter():
    # Every NIC name is accepted by scaled() and changes the result when changed.
    base = DcqcnParams.scaled(20.0, 20_000)
    changed = {"rpg_threshold": 2, "rpg_gd": 12, "rpg_min_dec_fac": 40, "rpg_byte_reset": 4096}
    for name in NIC_DEFAULTS:
        value = changed.get(name, NIC_DEFAULTS[name] - 1 if NIC_DEFAULTS[name] > 1 else 2)
        assert DcqcnParams.scaled(20.0, 20_000, **{name: value}) != base, name
