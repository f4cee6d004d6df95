"""DCQCN rate control for one RoCE queue pair: the sender's reaction point and the receiver's
notification point, as pure arithmetic driven by explicit times.

DCQCN (Zhu et al., "Congestion Control for Large-Scale RDMA Deployments", SIGCOMM 2015) has three
parts. Switches mark ECN CE on packets of a congested queue (the congestion point; the lab's
switches do that). The receiving NIC (notification point, `NotificationPoint`) answers a CE mark
with a CNP, at most one per QP every `min_time_between_cnps`. The sending NIC (reaction point,
`ReactionPoint`) keeps a current rate RC, a target rate RT and a congestion estimate alpha:

- on a CNP: RT = RC, RC = RC * (1 - alpha/2), alpha = (1 - g) * alpha + g, and the timers and the
  byte counter restart;
- every `dce_tcp_rtt` without a CNP: alpha = (1 - g) * alpha;
- every `rpg_time_reset` (timer) and every `rpg_byte_reset` bytes sent (byte counter) a rate
  increase event raises RC toward RT. While neither counter has counted more than
  `rpg_threshold` events since the last CNP it is fast recovery, RC = (RT + RC) / 2; once one
  has, additive increase, RT += R_AI first; once both have, hyper increase, RT += i * R_HAI
  first, i = min(timer events, byte events) - rpg_threshold. RC stays in [rpg_min_rate, line rate].

Parameter names are those NVIDIA/Mellanox ConnectX NICs expose (MLNX_OFED, mlxconfig), with
their documented defaults (`NIC_DEFAULTS`). `DcqcnParams` holds them in the lab's units: Mbit/s,
seconds, bytes, and plain fractions for the NIC's 10-bit fixed-point values.
Two NIC details are kept: the cut is alpha / 2**(rpg_gd - 10) (rpg_gd = 11 gives the paper's
alpha/2) and no single cut takes RC below rpg_min_dec_fac percent of itself. Not modelled:
rate_reduce_monitor_period (every CNP cuts at once), clamp_tgt_rate* (RT = RC on every CNP, as
in the paper) and rate_to_set_on_first_cnp.

A QP is unthrottled (no timers, bytes not counted) until its first CNP and again once RC is back
at line rate: with nothing left to recover, nothing needs waking (alpha keeps decaying). Every
method takes `now` in seconds on any monotonic clock; timer expiries are applied at their exact
due times, so the state after `advance(t)` is the same however often it was called before t.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from fabriclab.loading import excerpt

NIC_DEFAULTS = {
    # Rate increase (reaction point).
    "rpg_time_reset": 300,          # microseconds between timer-driven increase events
    "rpg_byte_reset": 32767,        # bytes sent between byte-counter-driven increase events
    "rpg_threshold": 1,             # events per counter before fast recovery ends
    "rpg_ai_rate": 5,               # Mbit/s added to RT per additive-increase event
    "rpg_hai_rate": 50,             # Mbit/s (times i) added to RT per hyper-increase event
    # Rate decrease (reaction point).
    "rpg_min_rate": 1,              # Mbit/s floor of RC
    "rpg_gd": 11,                   # log2 of the alpha divisor in 1024ths: 11 -> alpha/2
    "rpg_min_dec_fac": 50,          # percent: one cut keeps at least this share of RC
    # Alpha (reaction point).
    "dce_tcp_g": 1019,              # 1024ths; the EWMA gain is g = (1024 - dce_tcp_g) / 1024
    "dce_tcp_rtt": 1,               # microseconds between alpha updates
    "initial_alpha_value": 1023,    # 1024ths; alpha before the first CNP
    # CNP generation (notification point).
    "min_time_between_cnps": 4,     # microseconds between two CNPs of one QP
}
"""ConnectX defaults in the NIC's own units (microseconds, Mbit/s, bytes, 1024ths)."""

_NIC_MBPS = ("rpg_ai_rate", "rpg_hai_rate", "rpg_min_rate")

# Each increase halves RC's gap to RT and never closes it exactly in floating point, so near
# line rate a gap this small (relative to it) counts as recovered.
_RECOVERED = 1e-12


@dataclass(frozen=True)
class DcqcnParams:
    """DCQCN parameters of one NIC port in lab units (defaults: a ConnectX port at 400 Gbit/s).

    Use `DcqcnParams.scaled(line_rate_mbps, time_scale)` to get the NIC's defaults (or a NIC
    configuration) stretched to a lab that runs `time_scale` times slower than the hardware.
    """

    line_rate_mbps: float = 400_000.0
    rpg_time_reset_s: float = NIC_DEFAULTS["rpg_time_reset"] * 1e-6
    rpg_byte_reset: int = NIC_DEFAULTS["rpg_byte_reset"]
    rpg_threshold: int = NIC_DEFAULTS["rpg_threshold"]
    rpg_ai_rate_mbps: float = float(NIC_DEFAULTS["rpg_ai_rate"])
    rpg_hai_rate_mbps: float = float(NIC_DEFAULTS["rpg_hai_rate"])
    rpg_min_rate_mbps: float = float(NIC_DEFAULTS["rpg_min_rate"])
    rpg_gd: int = NIC_DEFAULTS["rpg_gd"]
    rpg_min_dec_fac: float = float(NIC_DEFAULTS["rpg_min_dec_fac"])
    g: float = (1024 - NIC_DEFAULTS["dce_tcp_g"]) / 1024
    dce_tcp_rtt_s: float = NIC_DEFAULTS["dce_tcp_rtt"] * 1e-6
    initial_alpha: float = NIC_DEFAULTS["initial_alpha_value"] / 1024
    min_time_between_cnps_s: float = NIC_DEFAULTS["min_time_between_cnps"] * 1e-6

    def __post_init__(self):
        for name in ("line_rate_mbps", "rpg_time_reset_s", "rpg_ai_rate_mbps",
                     "rpg_hai_rate_mbps", "rpg_min_rate_mbps", "dce_tcp_rtt_s"):
            _require(name, getattr(self, name), lambda v: v > 0, "a number > 0")
        _require("rpg_byte_reset", self.rpg_byte_reset, lambda v: v > 0, "a whole number > 0",
                 integer=True)
        _require("rpg_threshold", self.rpg_threshold, lambda v: v >= 1, "a whole number >= 1",
                 integer=True)
        # Below 10 a cut could exceed RC itself (alpha/2**(gd-10) > 1).
        _require("rpg_gd", self.rpg_gd, lambda v: v >= 10, "a whole number >= 10", integer=True)
        _require("rpg_min_dec_fac", self.rpg_min_dec_fac, lambda v: 0 <= v <= 100,
                 "a percentage in [0, 100]")
        _require("g", self.g, lambda v: 0 < v <= 1, "a fraction in (0, 1]")
        _require("initial_alpha", self.initial_alpha, lambda v: 0 < v <= 1,
                 "a fraction in (0, 1]")
        # Zero is a valid NIC setting here: a CNP for every CE-marked packet.
        _require("min_time_between_cnps_s", self.min_time_between_cnps_s, lambda v: v >= 0,
                 "a number >= 0")
        if self.rpg_min_rate_mbps > self.line_rate_mbps:
            raise ValueError(f"DCQCN parameter rpg_min_rate_mbps ({self.rpg_min_rate_mbps}) "
                             f"exceeds line_rate_mbps ({self.line_rate_mbps})")

    @classmethod
    def scaled(cls, line_rate_mbps, time_scale=1.0, **nic):
        """Parameters for a lab link of `line_rate_mbps` standing in for hardware `time_scale`
        times faster (the spec's real_host_rate / host_rate).

        `nic` overrides `NIC_DEFAULTS` by NIC name and in NIC units. Timers stretch by
        `time_scale`; rate steps and the floor shrink by it, so each keeps its share of the line
        rate; byte counts stay as they are, because rate x time is unchanged by the scaling.
        At x20000 the defaults become: increase timer 6 s, alpha period 20 ms, CNP gap 80 ms, and
        the 32767-byte counter fires every 13 ms at line rate, so bytes drive most increases.
        """
        _require("time_scale", time_scale, lambda v: v > 0, "a number > 0")
        unknown = sorted(set(nic) - set(NIC_DEFAULTS))
        if unknown:
            raise ValueError(f"unknown DCQCN NIC parameter {excerpt(unknown[0])}; known: "
                             + ", ".join(NIC_DEFAULTS))
        v = {**NIC_DEFAULTS, **nic}
        # Checked in NIC units first, so that a message names the field the caller passed.
        for name in ("rpg_time_reset", "dce_tcp_rtt") + _NIC_MBPS:
            _require(name, v[name], lambda x: x > 0, "a number > 0")
        _require("min_time_between_cnps", v["min_time_between_cnps"], lambda x: x >= 0,
                 "a number >= 0")
        _require("dce_tcp_g", v["dce_tcp_g"], lambda x: 0 <= x <= 1023,
                 "a whole number in [0, 1023]", integer=True)
        _require("initial_alpha_value", v["initial_alpha_value"], lambda x: 1 <= x <= 1023,
                 "a whole number in [1, 1023]", integer=True)
        return cls(
            line_rate_mbps=line_rate_mbps,
            rpg_time_reset_s=v["rpg_time_reset"] * 1e-6 * time_scale,
            rpg_byte_reset=v["rpg_byte_reset"],
            rpg_threshold=v["rpg_threshold"],
            rpg_ai_rate_mbps=v["rpg_ai_rate"] / time_scale,
            rpg_hai_rate_mbps=v["rpg_hai_rate"] / time_scale,
            rpg_min_rate_mbps=v["rpg_min_rate"] / time_scale,
            rpg_gd=v["rpg_gd"],
            rpg_min_dec_fac=v["rpg_min_dec_fac"],
            g=(1024 - v["dce_tcp_g"]) / 1024,
            dce_tcp_rtt_s=v["dce_tcp_rtt"] * 1e-6 * time_scale,
            initial_alpha=v["initial_alpha_value"] / 1024,
            min_time_between_cnps_s=v["min_time_between_cnps"] * 1e-6 * time_scale,
        )

    def to_dict(self):
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _require(name, value, ok, what, integer=False):
    """Raise ValueError naming `name` unless `value` is a finite number (an int if `integer`)
    for which `ok` holds."""
    kinds = (int,) if integer else (int, float)
    if (isinstance(value, bool) or not isinstance(value, kinds)
            or not math.isfinite(value) or not ok(value)):
        raise ValueError(f"DCQCN parameter {name} must be {what}, got {excerpt(value)}")


def _expiries(anchor, period, now):
    """How many of the instants anchor + n*period (n >= 1) are <= now.

    Computed from `now` alone, with the same comparison the timer loop uses, so that it is the
    same number however the time up to `now` was stepped through.
    """
    n = max(0, int((now - anchor) // period))
    while anchor + (n + 1) * period <= now:
        n += 1
    while n > 0 and anchor + n * period > now:
        n -= 1
    return n


class MonotonicTime:
    """Refuses time going backwards: a caller mixing clocks would silently corrupt the timers
    (DCQCN's, and SPX CC's RTT windows)."""

    def __init__(self):
        self.now = None

    def tick(self, now):
        if isinstance(now, bool) or not isinstance(now, (int, float)) or not math.isfinite(now):
            raise ValueError(f"time must be a finite number of seconds, got {excerpt(now)}")
        if self.now is not None and now < self.now:
            raise ValueError(f"time went backwards: {now} after {self.now}")
        self.now = now


class ReactionPoint:
    """The sender side of DCQCN for one QP (or flow): its sending rate and how it evolves."""

    def __init__(self, params=None):
        self.params = params if params is not None else DcqcnParams()
        self._clock = MonotonicTime()
        self._rc = self.params.line_rate_mbps
        self._rt = self.params.line_rate_mbps
        self._throttled = False
        # Alpha since the last CNP is alpha0 * (1 - g)**k for k alpha-timer expiries; computing
        # it from k keeps it exact and cheap however long the QP has been idle.
        self._alpha0 = self.params.initial_alpha
        self._alpha_anchor = None
        self._alpha_k = 0
        self._inc_anchor = None      # time of the last CNP: the increase timer's origin
        self._inc_n = 0              # increase-timer expiries applied since then
        self._time_stage = 0         # timer-driven increase events since the last CNP
        self._byte_stage = 0         # byte-counter-driven increase events since the last CNP
        self._bytes = 0              # bytes sent toward the next byte-counter event
        self._counters = {"cnps": 0, "rate_decreases": 0, "fast_recovery": 0,
                          "additive_increase": 0, "hyper_increase": 0}

    # -- state ------------------------------------------------------------------------------------

    @property
    def rate_mbps(self):
        """The current rate RC: what the QP may send at now."""
        return self._rc

    @property
    def target_rate_mbps(self):
        """The target rate RT that increases climb toward."""
        return self._rt

    @property
    def alpha(self):
        """The congestion estimate as of the last time given to this object."""
        return self._alpha0 * (1 - self.params.g) ** self._alpha_k

    @property
    def throttled(self):
        """True from a CNP until RC is back at line rate."""
        return self._throttled

    @property
    def counters(self):
        """CNPs handled, cuts that lowered RC, and rate increase events per stage."""
        return dict(self._counters)

    # -- events -----------------------------------------------------------------------------------

    def advance(self, now):
        """Apply every timer expiry due at or before `now`, each at its own due time."""
        self._clock.tick(now)
        if self._alpha_anchor is not None:
            self._alpha_k = _expiries(self._alpha_anchor, self.params.dce_tcp_rtt_s, now)
        period = self.params.rpg_time_reset_s
        while self._throttled and self._inc_anchor + (self._inc_n + 1) * period <= now:
            self._inc_n += 1
            self._time_stage += 1
            self._increase()

    def next_event(self, now):
        """Advance to `now`, then return when the rate next changes by itself (the increase
        timer's next expiry), or None while the QP is unthrottled.

        Alpha's timer needs no wake-up: alpha is computed for whatever time comes next.
        """
        self.advance(now)
        if not self._throttled:
            return None
        return self._inc_anchor + (self._inc_n + 1) * self.params.rpg_time_reset_s

    def on_cnp(self, now):
        """A CNP arrived at `now` (after any timer expiry due at the same instant): cut RC."""
        self.advance(now)
        p = self.params
        alpha = self.alpha
        factor = max(1 - alpha / 2 ** (p.rpg_gd - 10), p.rpg_min_dec_fac / 100)
        new_rc = max(self._rc * factor, p.rpg_min_rate_mbps)
        self._rt = self._rc
        self._counters["cnps"] += 1
        if new_rc < self._rc:
            self._counters["rate_decreases"] += 1
        self._rc = new_rc
        # The update just made is the alpha timer's fresh origin: the paper resets it on a CNP.
        self._alpha0 = (1 - p.g) * alpha + p.g
        self._alpha_anchor = now
        self._alpha_k = 0
        self._inc_anchor = now
        self._inc_n = 0
        self._time_stage = 0
        self._byte_stage = 0
        self._bytes = 0
        self._throttled = True

    def on_sent(self, nbytes, now):
        """The QP sent `nbytes` (wire bytes, as the NIC counts them) at `now`."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"nbytes must be a whole number >= 0, got {excerpt(nbytes)}")
        self.advance(now)
        if not self._throttled:
            return
        self._bytes += nbytes
        reset = self.params.rpg_byte_reset
        while self._throttled and self._bytes >= reset:
            self._bytes -= reset
            self._byte_stage += 1
            self._increase()

    # -- arithmetic -------------------------------------------------------------------------------

    def _increase(self):
        """One rate increase event, in the stage the two event counters select."""
        p = self.params
        f = p.rpg_threshold
        if max(self._time_stage, self._byte_stage) <= f:
            self._counters["fast_recovery"] += 1
        elif min(self._time_stage, self._byte_stage) <= f:
            self._counters["additive_increase"] += 1
            self._rt = min(self._rt + p.rpg_ai_rate_mbps, p.line_rate_mbps)
        else:
            self._counters["hyper_increase"] += 1
            i = min(self._time_stage, self._byte_stage) - f
            self._rt = min(self._rt + i * p.rpg_hai_rate_mbps, p.line_rate_mbps)
        self._rc = min((self._rt + self._rc) / 2, p.line_rate_mbps)
        if p.line_rate_mbps - self._rc <= _RECOVERED * p.line_rate_mbps:
            self._rc = self._rt = p.line_rate_mbps
            self._throttled = False
            self._bytes = 0


class NotificationPoint:
    """The receiver side of DCQCN for one QP: which CE-marked arrivals earn a CNP."""

    def __init__(self, params=None):
        self.params = params if params is not None else DcqcnParams()
        self._clock = MonotonicTime()
        self._last_cnp = None
        self._counters = {"ce_packets": 0, "cnps_sent": 0}

    @property
    def counters(self):
        """CE-marked packets seen and CNPs sent."""
        return dict(self._counters)

    def on_ce(self, now):
        """A CE-marked packet of this QP arrived at `now`; True if a CNP should be sent now.

        At most one CNP per `min_time_between_cnps`: a CE mark arriving exactly that long after
        the last CNP earns a new one.
        """
        self._clock.tick(now)
        self._counters["ce_packets"] += 1
        gap = self.params.min_time_between_cnps_s
        if self._last_cnp is not None and now - self._last_cnp < gap:
            return False
        self._last_cnp = now
        self._counters["cnps_sent"] += 1
        return True
