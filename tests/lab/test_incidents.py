"""The two incidents of seed 000 section 6.4, replayed by the shipped scenarios, each found by the
lab's own telemetry and not by the scenario file: a spine's buffer cut by its lossless drop
counters (and the latency monitor's lost lossless probes), a spine's raised port-to-port latency
by the latency monitor against a baseline run (`compare --baseline`'s rule).

The latency fault needs netem: on a kernel without it the scenario is refused in one line before
anything is built. The fault's netem change itself is the full-kernel tier's
(test_kernel_qdiscs.py); the whole incident runs only where netem is native (the VM)."""

import pathlib
import re

import pytest

from fabriclab.errors import LabError
from fabriclab.measure.pingmesh import regressions
from fabriclab.system import doctor
from fabriclab.workflows import scenario

from .tier import check_mechanism

pytestmark = pytest.mark.lab

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "scenarios"


def dropping_switches(run):
    """The switches whose lossless class the queue model counted drops for (the report's ports)."""
    return {row["node"] for row in run["queues"]["report"]["ports"]
            if row["class"] == "lossless" and (row.get("drops") or row.get("lossless_drops"))}


def test_the_buffer_incident_is_named_by_the_drop_counters(lab_for, run_plan, tmp_path, figure):
    sc = scenario.load(EXAMPLES / "incident_buffer.yaml")
    lab = lab_for(sc.spec_path(), sc.routings[0])
    (run,) = run_plan(scenario.to_plan(sc), lab=lab, out=tmp_path / "incident").doc["runs"]
    culprits = dropping_switches(run)
    cut = run["queues"]["cut_drops"]
    print(f"switches dropping lossless traffic: {sorted(culprits)}; {cut}")
    print(f"job: {run['jobs']['bursty'].get('valid')}, invalid: {run['invalid']}")
    # The Gather's incast makes h1's leaf pause the spines, so s2's port towards it fills past
    # its cut in every run: over 13 runs here on 2026-12-02 s2 dropped 150-337 lossless packets,
    # all at s2-eth1, and no other switch dropped any. (A 1 MiB AlltoAll, the scenario before,
    # filled half of s2's buffer only when ECMP collided there: 0 in two of three CI runs.)
    assert culprits == {"s2"} and len(cut) >= 1, cut
    assert all(re.match(r"lossless drop: s2-eth\d+ \(s2\) dropped \d+ at a buffer cut$", line) for line in cut)
    figure("incident-buffer: lossless packets dropped at s2's cut",
           sum(r.get("drops", 0) for r in run["queues"]["report"]["ports"]
               if r["class"] == "lossless" and r["node"] == "s2"))
    assert not any("over its headroom" in reason for reason in run["invalid"])
    assert not lab.injected()["buffer_cuts"]                 # the run gave the buffer back
    latency = run["telemetry"]["latency"]
    lost = {(p["src"], p["dst"]): p["loaded"]["lost"] for p in latency["pairs"] if p["class"] == "lossless"}
    print(f"lossless probes lost, loaded: {lost}")
    # The same fabric without the cut drops nothing: the cut is the cause.
    sc.faults = []
    (healthy,) = run_plan(scenario.to_plan(sc), lab=lab, out=tmp_path / "healthy").doc["runs"]
    assert dropping_switches(healthy) == set() and healthy["queues"]["cut_drops"] == []


# Not in the full-kernel tier: its guest's emulated CPU sets every ping's RTT. There (2026-12-02)
# loaded RTTs read 215-236 ms under an AlltoAll, 390-440 ms under half-rate all-pairs and 170-660
# ms at 5% load, on both planes alike, moving by a fifth or more between runs without a fault;
# the fault's 20 ms was never found. Where the kernel has netem natively (the VM) it runs in full;
# elsewhere it checks the one-line refusal.
def test_the_latency_incident_is_named_by_the_latency_monitor(lab_for, run_plan, tmp_path, record_property, figure):
    sc = scenario.load(EXAMPLES / "incident_latency.yaml")
    delay = doctor.mechanisms(doctor.probe())["delay"].mechanism
    check_mechanism(record_property, "delay", delay, "netem")
    if delay != "netem":
        with pytest.raises(LabError, match="this kernel has no netem") as err:
            run_plan(scenario.to_plan(sc), out=tmp_path / "refused")
        assert "\n" not in str(err.value)
        assert not (tmp_path / "refused").exists()          # refused before anything was built
        return
    lab = lab_for(sc.spec_path(), sc.routings[0])
    faults, sc.faults = sc.faults, []
    (base,) = run_plan(scenario.to_plan(sc), lab=lab, out=tmp_path / "baseline").doc["runs"]
    sc.faults = faults
    (slow,) = run_plan(scenario.to_plan(sc), lab=lab, out=tmp_path / "incident").doc["runs"]
    # 20 ms more per round trip on ~10 ms of cables: far past 50 % on real cores (not yet measured)
    for before, after in zip(base["telemetry"]["latency"]["pairs"], slow["telemetry"]["latency"]["pairs"]):
        print(f"{after['src']} -> {after['dst']} {after['class']}: loaded p50 {before['loaded']['p50_ms']} -> "
              f"{after['loaded']['p50_ms']} ms (n {before['loaded']['n']} -> {after['loaded']['n']}, lost "
              f"{after['loaded']['lost']})")
    print(f"events: {slow['events']}")
    found = regressions(base["telemetry"]["latency"], slow["telemetry"]["latency"], 0.5)
    for s in found["slowed"]:
        print(f"slowed {s['src']} -> {s['dst']} {s['class']} {s['phase']}: {s['base_ms']} -> {s['new_ms']} ms")
    print(f"must cross: {found['must_cross']}; culprits: {found['culprits']}")
    assert found["must_cross"] == ["p1s1"] and found["culprits"] == ["p1s1"]
    assert {s["src"][-2:] for s in found["slowed"]} == {"p1"}        # plane 1's pairs only
    spine = slow["telemetry"]["latency"]["switches"]["p1s1"]["lossless"]["must"]["loaded"]["p50_ms"]
    before = base["telemetry"]["latency"]["switches"]["p1s1"]["lossless"]["must"]["loaded"]["p50_ms"]
    # two crossings of p1s1 per round trip, 10 ms each in the lab
    assert figure("incident-latency: p1s1's loaded p50 gained, ms", spine - before) > 10
