"""SPX congestion control for one sender context (a QP, or a plane load balancer's context): the
rate rule as pure arithmetic driven by explicit times, and the RTT probe that feeds it.

Seed 002 (Spectrum-X, section 4.2, Figure 3; section 6.7) describes SPX CC in one paragraph:
collectives send synchronized bursts over a few high-rate flows; adaptive routing resolves a
transient burst within a sub-RTT, so the sender must not react to it. Switches therefore mark ECN
only when load balancing's capacity is exhausted (every member of the adaptive-routing group is
congested: the lab's "ar" ECN mode), the NIC reacts only to those marks, and RTT probes guide the
rate adjustment. DCQCN and Swift, it says, overreact to such bursts and fail to recover within a
collective. The paper gives no formula and no constant; the rule below is the lab's reading of
that paragraph, built from two published controllers whose parts it names:

- a CNP (the receiver saw a mark) cuts the rate multiplicatively, RC = RC * (1 - `cnp_cut`), at
  most once per RTT (the current smoothed RTT; `initial_rtt` before the first sample), as TCP
  and DCTCP react at most once per window: the marks of one round trip describe one congestion
  event (DCQCN instead cuts on every CNP its NP lets through, however close);
- every RTT sample (an `RttProbe` echo) is compared with a target, the lowest RTT seen so far
  (the base: the path without queues) plus `rtt_tolerance`:
  - at or below the target the rate rises additively, RC += `ai_rate`, up to line rate;
  - above it the rate falls gently, RC = RC * (1 - min(`delay_beta` * (rtt - target) / rtt,
    `max_delay_cut`)), at most once per RTT: Swift's delay-based decrease (Kumar et al.,
    SIGCOMM 2020, section 3.1), capped so that a burst the fabric absorbs costs little;
- RC stays in [`min_rate`, line rate]; there are no timers, so the rate only changes when a CNP
  or an RTT sample arrives (the rate cannot climb while nothing measures the path).

Numbers the paper does not give, and why these (all in a 400 Gbit/s port's real units;
`SpxParams.scaled` maps them onto a lab link the way `DcqcnParams.scaled` maps DCQCN's):

- cnp_cut 0.3: a mark means every eligible path is full, a real overload, so the cut is firm;
  but lighter than DCQCN's first cut (about 50% with alpha near 1), which is the overreaction
  the paper describes. 0.3 is CUBIC's decrease (RFC 8312, beta 0.7).
- ai_rate 4000 Mbit/s: 1% of line rate per RTT sample: from a 30% cut back to line rate in
  about 30 RTTs, ~150 us at a 5 us RTT, inside the ~335 us the paper gives the PLB to converge
  (6.7, Fig. 15c).
- rtt_tolerance 2 us: queueing the target allows above the base RTT, about 100 KB at 400 Gbit/s
  (a bit more than the lab's 64 KiB port buffer); the paper's loaded p99 is 8-9 us (6.2).
- delay_beta 0.2 and max_delay_cut 0.1: Swift's beta scale with a cap of 10% per RTT, "gentle"
  next to a CNP's 30%.
- initial_rtt 5 us: an unloaded two-tier RTT (6.2's loaded p99 is 8-9 us); it only spaces the
  cuts until a sample arrives.
- rtt_gain 0.125: TCP's smoothed-RTT gain (RFC 6298).
- min_rate 100 Mbit/s: a floor, as DCQCN's rpg_min_rate (which is 1 Mbit/s; SPX never needs
  to starve a sender to stop a PFC storm, since AR and PFC hold the burst).
- min_time_between_cnps 4 us: the receiving NIC's CNP spacing, ConnectX's default as in DCQCN
  (the notification point is the same hardware; `dcqcn.NotificationPoint` reads it from here).

Every method takes `now` in seconds on any monotonic clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from fabriclab.loading import excerpt
from fabriclab.traffic.dcqcn import MonotonicTime

NIC_DEFAULTS = {
    "cnp_cut": 0.3,            # fraction of RC a CNP removes (at most once per RTT)
    "ai_rate": 4000,           # Mbit/s added per RTT sample at or below the target
    "rtt_tolerance": 2.0,      # microseconds above the base RTT before delay decreases start
    "delay_beta": 0.2,         # Swift's beta: the delay decrease's scale
    "max_delay_cut": 0.1,      # the largest share of RC one delay decrease removes
    "initial_rtt": 5.0,        # microseconds: the once-per-RTT window before the first sample
    "rtt_gain": 0.125,         # the smoothed RTT's EWMA gain
    "min_rate": 100,           # Mbit/s floor of RC
    "min_time_between_cnps": 4,  # microseconds between two CNPs of one QP (the receiver's NP)
}
"""SPX CC's constants in a 400 Gbit/s port's real units (microseconds, Mbit/s, fractions)."""

_FRACTIONS = {"cnp_cut": (0, 1), "delay_beta": (0, 1), "max_delay_cut": (0, 1), "rtt_gain": (0, 1)}


@dataclass(frozen=True)
class SpxParams:
    """SPX CC parameters of one NIC port in lab units: Mbit/s, seconds, fractions (defaults: a
    400 Gbit/s port at real time). `SpxParams.scaled` stretches them to a lab link."""

    line_rate_mbps: float = 400_000.0
    cnp_cut: float = NIC_DEFAULTS["cnp_cut"]
    ai_rate_mbps: float = float(NIC_DEFAULTS["ai_rate"])
    rtt_tolerance_s: float = NIC_DEFAULTS["rtt_tolerance"] * 1e-6
    delay_beta: float = NIC_DEFAULTS["delay_beta"]
    max_delay_cut: float = NIC_DEFAULTS["max_delay_cut"]
    initial_rtt_s: float = NIC_DEFAULTS["initial_rtt"] * 1e-6
    rtt_gain: float = NIC_DEFAULTS["rtt_gain"]
    min_rate_mbps: float = float(NIC_DEFAULTS["min_rate"])
    min_time_between_cnps_s: float = NIC_DEFAULTS["min_time_between_cnps"] * 1e-6

    def __post_init__(self):
        for name in ("line_rate_mbps", "ai_rate_mbps", "initial_rtt_s", "min_rate_mbps"):
            _require(name, getattr(self, name), lambda v: v > 0, "a number > 0")
        for name in ("rtt_tolerance_s", "min_time_between_cnps_s"):
            _require(name, getattr(self, name), lambda v: v >= 0, "a number >= 0")
        for name, (low, high) in _FRACTIONS.items():
            _require(name, getattr(self, name), lambda v: low < v < high,
                     f"a fraction in ({low}, {high})")
        if self.min_rate_mbps > self.line_rate_mbps:
            raise ValueError(f"SPX parameter min_rate_mbps ({self.min_rate_mbps}) exceeds "
                             f"line_rate_mbps ({self.line_rate_mbps})")

    @classmethod
    def scaled(cls, line_rate_mbps, time_scale=1.0, **nic):
        """Parameters for a lab link of `line_rate_mbps` standing in for hardware `time_scale`
        times faster (the spec's real_host_rate / host_rate), as `DcqcnParams.scaled` does.

        `nic` overrides `NIC_DEFAULTS` by name and in real units. Times stretch by `time_scale`;
        rate steps and the floor shrink by it; fractions stay. At x66667 the 2 us tolerance is
        133 ms of lab time, which at the lab's 6 Mbit/s is the same ~100 KB of queue.
        """
        _require("time_scale", time_scale, lambda v: v > 0, "a number > 0")
        unknown = sorted(set(nic) - set(NIC_DEFAULTS))
        if unknown:
            raise ValueError(f"unknown SPX parameter {excerpt(unknown[0])}; known: "
                             + ", ".join(NIC_DEFAULTS))
        v = {**NIC_DEFAULTS, **nic}
        # Checked in real units first, so that a message names the field the caller passed.
        for name in ("ai_rate", "initial_rtt", "min_rate"):
            _require(name, v[name], lambda x: x > 0, "a number > 0")
        for name in ("rtt_tolerance", "min_time_between_cnps"):
            _require(name, v[name], lambda x: x >= 0, "a number >= 0")
        for name, (low, high) in _FRACTIONS.items():
            _require(name, v[name], lambda x: low < x < high, f"a fraction in ({low}, {high})")
        return cls(
            line_rate_mbps=line_rate_mbps,
            cnp_cut=v["cnp_cut"],
            ai_rate_mbps=v["ai_rate"] / time_scale,
            rtt_tolerance_s=v["rtt_tolerance"] * 1e-6 * time_scale,
            delay_beta=v["delay_beta"],
            max_delay_cut=v["max_delay_cut"],
            initial_rtt_s=v["initial_rtt"] * 1e-6 * time_scale,
            rtt_gain=v["rtt_gain"],
            min_rate_mbps=v["min_rate"] / time_scale,
            min_time_between_cnps_s=v["min_time_between_cnps"] * 1e-6 * time_scale,
        )

    def to_dict(self):
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _require(name, value, ok, what):
    """Raise ValueError naming `name` unless `value` is a finite number for which `ok` holds."""
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or not ok(value)):
        raise ValueError(f"SPX parameter {name} must be {what}, got {excerpt(value)}")


class ReactionPoint:
    """The sender side of SPX CC for one context: its rate and how CNPs and RTT samples move it.

    Same interface as `dcqcn.ReactionPoint` (rate_mbps, throttled, counters, advance,
    next_event, on_cnp, on_sent), plus `on_rtt` for the probes' samples."""

    def __init__(self, params=None):
        self.params = params if params is not None else SpxParams()
        self._clock = MonotonicTime()
        self._rc = self.params.line_rate_mbps
        self._srtt = None
        self._base = None
        self._last_cut = None          # the last CNP cut
        self._last_delay_cut = None    # the last delay decrease
        self._counters = {"cnps": 0, "rate_decreases": 0, "cnps_ignored": 0,
                          "rtt_samples": 0, "additive_increase": 0, "delay_decrease": 0}

    # -- state ------------------------------------------------------------------------------------

    @property
    def rate_mbps(self):
        """The current rate RC: what the context may send at now."""
        return self._rc

    @property
    def target_rate_mbps(self):
        """SPX climbs toward line rate (it keeps no target below it)."""
        return self.params.line_rate_mbps

    @property
    def throttled(self):
        """True while RC is below line rate."""
        return self._rc < self.params.line_rate_mbps

    @property
    def rtt_s(self):
        """The smoothed RTT, or `initial_rtt_s` before the first sample: the once-per-RTT
        window of the cuts."""
        return self._srtt if self._srtt is not None else self.params.initial_rtt_s

    @property
    def base_rtt_s(self):
        """The lowest RTT sample so far (None before the first)."""
        return self._base

    @property
    def target_rtt_s(self):
        """The RTT at or below which the rate rises (None before the first sample)."""
        return None if self._base is None else self._base + self.params.rtt_tolerance_s

    @property
    def counters(self):
        return dict(self._counters)

    # -- events -----------------------------------------------------------------------------------

    def advance(self, now):
        """SPX CC has no timers: only the clock moves."""
        self._clock.tick(now)

    def next_event(self, now):
        """None: the rate changes only on CNPs and RTT samples."""
        self.advance(now)
        return None

    def on_sent(self, nbytes, now):
        """Sent bytes do not move SPX's rate (kept for the reaction points' common interface)."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"nbytes must be a whole number >= 0, got {excerpt(nbytes)}")
        self.advance(now)

    def on_cnp(self, now):
        """A CNP arrived: cut RC by `cnp_cut`, unless a cut happened less than an RTT ago."""
        self.advance(now)
        self._counters["cnps"] += 1
        if self._last_cut is not None and now - self._last_cut < self.rtt_s:
            self._counters["cnps_ignored"] += 1
            return
        self._last_cut = now
        self._cut(1 - self.params.cnp_cut)

    def on_rtt(self, rtt_s, now):
        """An RTT sample (seconds) arrived at `now`: rise at or below the target, fall gently
        above it (at most once per RTT)."""
        if (isinstance(rtt_s, bool) or not isinstance(rtt_s, (int, float))
                or not math.isfinite(rtt_s) or rtt_s <= 0):
            raise ValueError(f"an RTT sample must be a number > 0 s, got {excerpt(rtt_s)}")
        self.advance(now)
        p = self.params
        self._counters["rtt_samples"] += 1
        self._base = rtt_s if self._base is None else min(self._base, rtt_s)
        self._srtt = (rtt_s if self._srtt is None
                      else (1 - p.rtt_gain) * self._srtt + p.rtt_gain * rtt_s)
        target = self._base + p.rtt_tolerance_s
        if rtt_s <= target:
            if self._rc < p.line_rate_mbps:
                self._counters["additive_increase"] += 1
                self._rc = min(self._rc + p.ai_rate_mbps, p.line_rate_mbps)
            return
        if self._last_delay_cut is not None and now - self._last_delay_cut < self.rtt_s:
            return
        self._last_delay_cut = now
        self._counters["delay_decrease"] += 1
        self._cut(1 - min(p.delay_beta * (rtt_s - target) / rtt_s, p.max_delay_cut))

    def _cut(self, factor):
        new_rc = max(self._rc * factor, self.params.min_rate_mbps)
        if new_rc < self._rc:
            self._counters["rate_decreases"] += 1
        self._rc = new_rc


class RttProbe:
    """RTT samples from probes: one probe in flight at a time, identified by a sequence number;
    its echo gives a sample (now - send time). A probe not echoed within `timeout_s` is given up
    (a later echo of it is ignored) so that the next one can go. With `every_bytes`, a probe
    goes only once the context has sent that many data bytes since the last one (`on_data`):
    probes then stay a small share of its packets however long the round trip."""

    def __init__(self, timeout_s, every_bytes=0):
        if (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))
                or not math.isfinite(timeout_s) or timeout_s <= 0):
            raise ValueError(f"RTT probe timeout must be a number > 0 s, got {excerpt(timeout_s)}")
        if isinstance(every_bytes, bool) or not isinstance(every_bytes, int) or every_bytes < 0:
            raise ValueError(f"RTT probe spacing must be a whole number of bytes >= 0, got {excerpt(every_bytes)}")
        self.timeout_s = timeout_s
        self.every_bytes = every_bytes
        self.data_bytes = 0              # sent by the context since the last probe
        self.outstanding = None
        self.sent_at = None
        self.next_seq = 1
        self.sent = self.echoes = self.lost = 0
        self.rtt_min = self.rtt_max = None
        self.rtt_sum = 0.0

    def on_data(self, nbytes):
        """The context sent `nbytes` of data."""
        self.data_bytes += nbytes

    def wants_probe(self, now):
        """Whether a probe should go now: none in flight (or the one in flight timed out) and
        `every_bytes` of data sent since the last one."""
        if self.outstanding is not None and now - self.sent_at >= self.timeout_s:
            self.outstanding = None
            self.lost += 1
        return self.outstanding is None and self.data_bytes >= self.every_bytes

    def probe_sent(self, now):
        """A probe left at `now`: its sequence number (the echo carries it back)."""
        seq = self.next_seq
        self.next_seq = seq % 0xFFFFFFFF + 1
        self.outstanding = seq
        self.sent_at = now
        self.sent += 1
        self.data_bytes = 0
        return seq

    def on_echo(self, seq, now):
        """The echo of probe `seq` arrived at `now`: the RTT sample in seconds, or None for an
        echo of a probe already given up (or never sent)."""
        if seq != self.outstanding or now < self.sent_at:
            return None
        self.outstanding = None
        rtt = now - self.sent_at
        if rtt <= 0:
            return None
        self.echoes += 1
        self.rtt_sum += rtt
        self.rtt_min = rtt if self.rtt_min is None else min(self.rtt_min, rtt)
        self.rtt_max = rtt if self.rtt_max is None else max(self.rtt_max, rtt)
        return rtt

    def summary(self):
        ms = (lambda v: None if v is None else round(v * 1e3, 3))
        return {"probes_sent": self.sent, "echoes": self.echoes, "lost": self.lost,
                "rtt_ms": {"min": ms(self.rtt_min), "max": ms(self.rtt_max),
                           "mean": ms(self.rtt_sum / self.echoes) if self.echoes else None}}
