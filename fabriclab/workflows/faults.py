"""Faults on a timeline: what a scenario file's `faults:` list means, checked before anything is
built, and the thread that applies it to a running lab.

    faults:
      - {at: 1.0, link_down: l1-s1, for: 0.5}          # down at 1 s, back up at 1.5 s
      - {at: 1.0, flap: l1-s2, count: 3, down: 0.2, up: 0.3}
      - {at: 0.5, random_flaps: fabric, mtbf: 4, duration: 0.3, until: 5, seed: 7}
      - {at: 2.0, degrade: l2-s1, rate_mbps: 2, for: 1}
      - {at: 2.0, slow_receiver: h3, fraction: 0.25, for: 1}
      - {at: 1.0, switch_down: s2, for: 1}
      - {at: 1.0, buffer: s1, fraction: 0.5, for: 2}    # s1's ports keep half their buffer
      - {at: 1.0, latency: s1, us: 2, for: 2}           # 2 us (real) more through s1
      - {at: 3.0, controller_restart: true}

`at` counts seconds from the timeline's origin: the moment the measured jobs' agents are up and
their first iteration starts. A fault without `for` lasts until the run ends (the lab restores the
fabric between runs). Random flaps follow seed 002 section 6.6: every chosen link fails as a
Poisson process with the given mean time between failures, and each failure lasts `duration`.
"""

from __future__ import annotations

import re
import threading
import time

from fabriclab.errors import LabError
from fabriclab.loading import excerpt, number, whole
from fabriclab.workflows import faultkinds
from fabriclab.workflows.faultkinds.random_flaps import flap_times as random_flap_times
from fabriclab.workflows.faultsteps import Fault, Step, split_link

__all__ = ["BOUNDS", "KINDS", "MAX_STEPS", "Fault", "Step", "Timeline", "apply", "check", "describe", "parse",
           "parse_link_event", "prepare", "random_flap_times", "resolve", "split_link", "steps"]

# kind -> (the target's meaning, {parameter: (type, required)}): each kind's module says (faultkinds/)
KINDS = {name: (mod.TARGET, mod.PARAMS) for name, mod in faultkinds.kinds().items()}
MAX_STEPS = 10_000
MAX_TIME_S = 86_400.0                # a fault's times: within a day of the traffic's start
# Each parameter's physical range: (low, high], or [low, high] for the whole numbers.
BOUNDS = {"for": (0, MAX_TIME_S), "down": (0, MAX_TIME_S), "up": (0, MAX_TIME_S),
          "duration": (0, MAX_TIME_S), "until": (0, MAX_TIME_S), "mtbf": (0, MAX_TIME_S),
          "count": (1, MAX_STEPS // 2), "seed": (0, (1 << 32) - 1), "rate_mbps": (0, 1e6),
          "fraction": (0, 1), "us": (0, 1e6)}
# The command line's short form of a link fault: A-B@SECONDS, or A-B#N@SECONDS for parallel member N.
_LINK_EVENT = re.compile(r"^([A-Za-z0-9]+-[A-Za-z0-9]+(?:#[0-9]+)?)@([0-9]+(?:\.[0-9]*)?|\.[0-9]+)$")


def parse(entries):
    """[Fault] from a scenario's `faults:` list; LabError naming the entry and field."""
    if entries is None:
        return []
    if not isinstance(entries, list):
        raise LabError("scenario: faults must be a list of {at: SECONDS, KIND: TARGET, ...}")
    return [_parse_one(i, entry) for i, entry in enumerate(entries)]


def _parse_one(index, entry):
    where = f"scenario: faults[{index}]"
    if not isinstance(entry, dict):
        raise LabError(f"{where} must be a mapping like {{at: 1.0, link_down: l1-s1}}")
    kinds = [k for k in entry if k in KINDS]
    if len(kinds) != 1:
        raise LabError(f"{where} needs exactly one of {', '.join(KINDS)}; got keys {', '.join(map(str, entry))}")
    kind = kinds[0]
    meaning, allowed = KINDS[kind]
    unknown = set(entry) - {"at", kind} - set(allowed)
    if unknown:
        raise LabError(f"{where} ({kind}): unknown field {excerpt(sorted(unknown)[0])} "
                       f"(allowed: at, {', '.join(allowed) or 'nothing else'})")
    at = float(number(entry.get("at"), f"{where}.at", 0.0, MAX_TIME_S))
    params = {}
    for name, (kind_type, required) in allowed.items():
        if name not in entry:
            if required:
                raise LabError(f"{where} ({kind}): missing {name}")
            continue
        low, high = BOUNDS[name]
        if kind_type is int:
            params[name] = whole(entry[name], f"{where}.{name}", low, high)
        else:
            params[name] = float(number(entry[name], f"{where}.{name}", low, high, low_open=True))
    target = entry[kind]
    faultkinds.kind(kind).check_entry(target, at, params, where)
    for name in ("fraction",):
        if name in params and params[name] > 1:
            raise LabError(f"{where}.{name} must be in (0, 1], got {params[name]:g}")
    return Fault(index, kind, target, at, params)


def parse_link_event(text, up):
    """`l1-s1@2.5` (or `l1-s1#2@2.5`: parallel member 2) -> a link_down (or link_up) Fault at 2.5 s."""
    m = _LINK_EVENT.match(text) if isinstance(text, str) else None
    if not m:
        raise LabError(f"bad link event {excerpt(str(text)[:40])}: expected NODE-NODE@SECONDS, e.g. l1-s1@2 "
                       f"(or l1-s1#2@2 for the second parallel link)")
    split_link(m.group(1))               # a member numbered from 0 is refused here
    return Fault(0, "link_up" if up else "link_down", m.group(1), float(m.group(2)), {})


def resolve(fault, lab):
    """Check a fault against the lab's fabric (nodes, links, hosts) without touching it; returns
    the links a link fault names, [] otherwise."""
    try:
        return faultkinds.kind(fault.kind).resolve(fault, lab)
    except LabError as exc:
        raise LabError(f"scenario: faults[{fault.index}] ({fault.kind}): {exc}") from None


def check(faults, lab):
    """What `steps` refuses (a target the fabric lacks, more than MAX_STEPS steps), counting the
    steps without making them: checking a plan's runs makes none of their timelines."""
    total = 0
    for fault in faults:
        links = resolve(fault, lab)
        try:
            total += faultkinds.kind(fault.kind).count(fault, links, MAX_STEPS - total)
        except LabError:
            raise LabError(_too_many(fault.index)) from None
        if total > MAX_STEPS:
            raise LabError(_too_many(fault.index))


def steps(faults, lab):
    """The timeline: every fault expanded by its kind into Lab operations at their times, sorted."""
    out = []
    for fault in faults:
        links = resolve(fault, lab)
        try:
            out += faultkinds.kind(fault.kind).steps(fault, links, MAX_STEPS - len(out))
        except LabError:
            raise LabError(_too_many(fault.index)) from None
        if len(out) > MAX_STEPS:
            raise LabError(_too_many(fault.index))
    return sorted(out, key=lambda s: s.t)


def _too_many(index):
    return (f"scenario: faults[{index}] expands to more than {MAX_STEPS} link changes; "
            f"raise mtbf or shorten the window")


def apply(lab, step):
    """Run one step on the lab (without waiting for the controller: the timeline keeps time)."""
    if step.action == "link":
        lab.set_links(*step.args, wait=False)
    elif step.action == "rate":
        lab.reshape_links(*step.args)
    elif step.action == "receiver":
        lab.slow_receiver(*step.args)
    elif step.action == "switch":
        name, up = step.args
        lab.set_switch(name, up, wait=False)
    elif step.action == "controller":
        lab.restart_controller()
    elif step.action == "loss":
        lab.set_loss(*step.args)
    elif step.action == "buffer":
        lab.cut_buffer(*step.args)
    elif step.action == "latency":
        lab.set_latency(*step.args)


def prepare(lab, steps_):
    """Ready what the steps will need, so none is late: the loss programs on every machine their
    links' ends run on (the first load on another machine of a cluster takes seconds)."""
    links = {link.key: link for step in steps_ if step.action == "loss" for link in step.args[0]}
    if links:
        lab.prepare_loss(list(links.values()))


def describe(step):
    """One step as a person reads it: `l1-s1 down`, `h3 receives at 0.25 of line rate`."""
    if step.action == "link":
        links, up = step.args
        return f"{', '.join(link.label for link in links)} {'up' if up else 'down'}"
    if step.action == "rate":
        links, rate = step.args
        return f"{', '.join(link.label for link in links)} " + (f"at {rate:g} Mbit/s" if rate else "rate restored")
    if step.action == "receiver":
        host, fraction = step.args
        return f"{host} receives at {fraction:g} of line rate" if fraction else f"{host} receives at line rate"
    if step.action == "switch":
        name, up = step.args
        return f"switch {name} {'up' if up else 'down'}"
    if step.action == "loss":
        links, fraction = step.args
        what = "every link" if len(links) > 4 else ", ".join(link.label for link in links)
        return f"{what} lose {fraction:.2%} of packets" if fraction else f"{what} lossless again"
    if step.action == "buffer":
        name, fraction = step.args
        return f"switch {name} buffer cut to {fraction:g}" if fraction else f"switch {name} buffer whole again"
    if step.action == "latency":
        target, us = step.args
        what = target if isinstance(target, str) else ", ".join(link.label for link in target)
        return f"{what} {us:g} us slower" if us else f"{what} latency back to the spec's"
    return "controller restarted"


class Timeline(threading.Thread):
    """Applies steps at origin + t (wall clock). `origin` is set by start_at(); stop() ends it
    early. Errors are kept and re-raised by join_checked()."""

    def __init__(self, lab, steps_):
        super().__init__(daemon=True, name="fault-timeline")
        self.lab, self.steps = lab, steps_
        self.origin = None
        self.applied = []          # (step, wall time applied)
        self.error = None
        self._go = threading.Event()
        self._halt = threading.Event()

    def start_at(self, origin):
        self.origin = origin
        self._go.set()

    def stop(self):
        self._halt.set()
        self._go.set()

    def run(self):
        self._go.wait()
        try:
            for step in self.steps:
                if self._halt.is_set():
                    return
                delay = self.origin + step.t - time.time()
                if delay > 0 and self._halt.wait(delay):
                    return
                began = time.time()          # when the fault struck, not when the call returned
                apply(self.lab, step)
                self.applied.append((step, began))
        except Exception as exc:               # noqa: BLE001 - re-raised by join_checked
            self.error = exc

    def join_checked(self, timeout=30.0):
        self.stop()
        self.join(timeout)
        if self.error is not None:
            raise LabError(f"fault timeline failed: {self.error}")
