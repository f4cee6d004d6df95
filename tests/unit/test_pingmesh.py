"""The latency monitor's pure parts: pairing host ports and what they cross, ping's output read
back, the percentiles and per-switch summary, the regression rule of `compare --baseline`, and
its settings in a scenario's metrics."""

import math

import pytest

from fabriclab.errors import LabError
from fabriclab.lab import probepairs
from fabriclab.measure import pingmesh
from fabriclab.measure.pingmesh import parse_ping, percentile, regressions, summarize
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import load_spec
from fabriclab.workflows.plan import Metrics

PING = """PING 10.1.2.1 (10.1.2.1) from 10.1.1.1 : 56(84) bytes of data.
[1764637200.100000] 64 bytes from 10.1.2.1: icmp_seq=1 ttl=62 time=10.4 ms
[1764637200.300000] no answer yet for icmp_seq=2
[1764637200.350000] 64 bytes from 10.1.2.1: icmp_seq=2 ttl=62 time=250 ms
[1764637200.500000] no answer yet for icmp_seq=3
[1764637200.600000] 64 bytes from 10.1.2.1: icmp_seq=4 ttl=62 time=12.06 ms
garbage line
--- 10.1.2.1 ping statistics ---
4 packets transmitted, 3 received, 25% packet loss, time 602ms
"""


def test_ping_output_becomes_samples_with_late_answers_kept_and_losses_marked():
    assert parse_ping(PING) == [(1764637200.1, 1, 10.4), (1764637200.35, 2, 250.0), (1764637200.5, 3, None),
                                (1764637200.6, 4, 12.06)]
    assert parse_ping("") == [] and parse_ping("ping: connect: Network is unreachable") == []


def test_percentiles_interpolate_between_ranks():
    assert percentile([], 50) is None
    assert percentile([5.0], 99) == 5.0
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile(list(range(101)), 90) == 90
    assert pingmesh.stats([1.0, 3.0], lost=2) == {"n": 2, "lost": 2, "p50_ms": 2.0, "p90_ms": 2.8, "p99_ms": 2.98,
                                                  "max_ms": 3.0}


def probe(src, dst, cls, must, may=()):
    return {"src": src, "dst": dst, "class": cls, "must": set(must), "may": set(may)}


def test_the_summary_splits_samples_by_phase_and_gathers_them_per_switch():
    probes = [probe("h1-n0", "h3-n0", "lossless", {"l1", "l2", "s1"}),
              probe("h1-n0", "h5-n0", "lossless", {"l1", "l3"}, {"s1", "s2"})]
    samples = [[(9.0, 1, 1.0), (9.5, 2, 2.0), (10.5, 3, 5.0), (11.0, 4, None), (12.5, 5, 99.0)],
               [(9.0, 1, 3.0), (10.2, 2, 7.0)]]
    out = summarize(probes, samples, origin=10.0, end=12.0)
    first, second = out["pairs"]
    assert first["unloaded"]["n"] == 2 and first["unloaded"]["p50_ms"] == 1.5
    assert first["loaded"] == {"n": 1, "lost": 1, "p50_ms": 5.0, "p90_ms": 5.0, "p99_ms": 5.0, "max_ms": 5.0}
    assert first["must"] == ["l1", "l2", "s1"] and second["may"] == ["s1", "s2"]
    s1 = out["switches"]["s1"]["lossless"]
    assert s1["must"]["loaded"]["n"] == 1 and s1["may"]["loaded"]["p50_ms"] == 7.0
    assert out["switches"]["l1"]["lossless"]["must"]["unloaded"]["n"] == 3          # both pairs' samples
    assert "s2" in out["switches"] and "must" not in out["switches"]["s2"]["lossless"]
    # samples between the jobs' launch and the origin (agents starting) are in neither phase
    quiet = summarize(probes, samples, origin=10.0, end=12.0, quiet_end=9.2)["pairs"][0]
    assert quiet["unloaded"]["n"] == 1 and quiet["loaded"]["n"] == 1 and quiet["loaded"]["lost"] == 1


def row(src, dst, must, unloaded, loaded, cls="lossless"):
    return {"src": src, "dst": dst, "class": cls, "must": must, "may": [],
            "unloaded": {"p50_ms": unloaded}, "loaded": {"p50_ms": loaded}}


def test_the_regression_rule_names_the_switches_every_slowed_pair_must_cross():
    base = {"pairs": [row("a", "b", ["l1", "s1", "l2"], 10, 20), row("a", "c", ["l1", "s1", "l3"], 10, 20),
                      row("b", "c", ["l2", "s2", "l3"], 10, 20), row("x", "y", ["l9"], 10, 20)]}
    new = {"pairs": [row("a", "b", ["l1", "s1", "l2"], 15, 21), row("a", "c", ["l1", "s1", "l3"], 10, 30),
                     row("b", "c", ["l2", "s2", "l3"], 11, 23)]}
    found = regressions(base, new, 0.2)
    assert [(s["src"], s["dst"], s["phase"], s["change"]) for s in found["slowed"]] == [
        ("a", "b", "unloaded", 0.5), ("a", "c", "loaded", 0.5)]
    assert found["must_cross"] == ["l1", "s1"]
    assert found["culprits"] == ["l1", "s1"]                          # b-c kept its latency: l2, l3 spared
    assert regressions(base, new, 0.6)["slowed"] == []
    assert regressions(base, new, 0.6)["must_cross"] == []
    extra = row("d", "e", ["l1"], 10, 20)                             # kept its latency, through l1
    spared = regressions({"pairs": [*base["pairs"], extra]}, {"pairs": [*new["pairs"], extra]}, 0.2)
    assert spared["must_cross"] == ["l1", "s1"] and spared["culprits"] == ["s1"]


@pytest.mark.parametrize("threshold", [0, -0.1, math.nan, math.inf, True, "0.2"])
def test_a_bad_threshold_is_refused(threshold):
    with pytest.raises(LabError, match="latency threshold"):
        regressions({"pairs": []}, {"pairs": []}, threshold)


def test_default_pairs_pair_each_leaf_once_and_cross_every_switch():
    for name in ("default", "tiny", "incast"):
        fabric = Fabric(load_spec(name))
        pairs = probepairs.default_pairs(fabric)
        leaves = {s for s, sw in fabric.switches.items() if sw.role == "leaf"}
        assert len(pairs) == len(leaves) * (len(leaves) - 1) // 2, name
        assert {p.leaf for pair in pairs for p in pair} == leaves
        assert probepairs.covered(fabric, pairs) == set(fabric.switches), name
        assert all(a.plane == b.plane and a.leaf != b.leaf for a, b in pairs)


def test_a_pair_must_cross_its_leaves_and_may_cross_each_spine():
    fabric = Fabric(load_spec("default"))                # 4 leaves x 4 spines
    a, b = fabric.host_port("h1"), fabric.host_port("h5")
    must, may = probepairs.crossings(fabric, a, b)
    assert must == {a.leaf, b.leaf} and may == {"s1", "s2", "s3", "s4"}
    must, may = probepairs.crossings(fabric, a, b, down=frozenset(
        link.key for link in fabric.fabric_links if link.b in ("s2", "s3", "s4")))
    assert must == {a.leaf, b.leaf, "s1"} and may == set()


@pytest.mark.parametrize("names, words", [
    ([["h1", "h99"]], "no host or host port 'h99'"),
    ([["h1", "h1"]], "both ends are on h1"),
    ([["h1"]], "pairs[0] must be [A, B]"),
    ("h1-h2", "a list of [A, B]"),
])
def test_chosen_pairs_are_checked_in_one_line(names, words):
    with pytest.raises(LabError, match=r"^.*" + words.replace("[", r"\[").replace("]", r"\]")):
        probepairs.chosen_pairs(Fabric(load_spec("default")), names)


def test_probes_carry_each_class_dscp_in_the_tos_byte():
    fabric = Fabric(load_spec("incast"))
    out = probepairs.probes(fabric, [["h1", "h5"]])
    assert [(p["class"], p["tos"]) for p in out] == [("lossless", 26 << 2), ("lossy", 0)]
    assert out[0]["src_ip"] == fabric.host_port("h1").ip and out[0]["must"] == {"l1", "l2"}


@pytest.mark.parametrize("changes, words", [
    ({"pingmesh_ms": 5}, "pingmesh_ms is 0 (off)"), ({"pingmesh_ms": math.nan}, "pingmesh_ms is 0"),
    ({"pingmesh_ms": True}, "pingmesh_ms"), ({"pingmesh_pairs": [["h1", "h2"]]}, "needs metrics.pingmesh_ms"),
    ({"pingmesh_ms": 50, "pingmesh_pairs": [["h1"]]}, "a list of [A, B]")])
def test_the_monitor_settings_are_checked(changes, words):
    with pytest.raises(LabError) as err:
        Metrics(**changes).check()
    assert words in str(err.value)
    Metrics(pingmesh_ms=50, pingmesh_pairs=(("h1", "h5"),)).check()


def test_the_prober_refuses_a_short_interval_or_too_many_probes():
    with pytest.raises(LabError, match="at least 10 ms"):
        pingmesh.Pingmesh([{}], 2)
    with pytest.raises(LabError, match="1 to 64 probes"):
        pingmesh.Pingmesh([{}] * 65, 100)
    mesh = pingmesh.Pingmesh([{"src_ns": 42, "src_ip": "10.1.1.1", "dst_ip": "10.1.2.1", "tos": 104}], 100)
    argv = mesh.argv(mesh.probes[0])
    assert argv[:2] == ["nsenter", "--net=/proc/42/ns/net"] and argv[2] == "ping"
    assert argv[argv.index("-Q") + 1] == "104" and argv[argv.index("-i") + 1] == "0.100" and "-D" in argv


def test_the_report_shows_each_switch_rtt_over_the_pairs_that_must_cross_it():
    from fabriclab.results import report

    probes = [probe("h1-n0", "h3-n0", "lossless", {"l1", "l2"}, {"s1"})]
    latency = {"interval_ms": 50.0, **summarize(probes, [[(1.0, 1, 2.0), (3.0, 2, 4.0), (3.5, 3, None)]], 2.0, 4.0)}
    lines = report._latency(latency)
    assert lines[0] == "### Latency monitor" and lines[2].startswith("1 pairs probed every 50 ms")
    assert "| l1 | lossless | 1 | 2.00 | 1 | 4.00 | 4.00 | 1 |" in lines
    assert not any(line.startswith("| s1 ") for line in lines)       # only may-cross pairs: no row
    assert report._latency(None) == []


def latency_doc(p1s1_ms):
    """A scenario document whose one run has the latency monitor: plane 1's three pairs at
    `p1s1_ms` loaded, plane 2's at 8 ms."""
    from tests.unit import resultdocs as rd

    fabric = Fabric(load_spec("incident_planes"))
    probes = [p for p in probepairs.probes(fabric) if p["class"] == "lossless"]
    samples = [[(1.0, 1, 8.0), (3.0, 2, p1s1_ms if p["src"].endswith("p1") else 8.0)] for p in probes]
    run = rd.run("ecmp r1", {"bursty": rd.collective_job(50.0)})
    run["telemetry"]["latency"] = {"interval_ms": 50.0, "dscp": probepairs.dscps(fabric.spec),
                                   **summarize(probes, samples, 2.0, 4.0)}
    return rd.doc("scenario", [run])


def test_compare_against_a_baseline_names_the_slowed_spine_and_exits_1(tmp_path, capsys):
    from fabriclab.cli import main
    from fabriclab.results import compare
    from tests.unit import resultdocs as rd

    rd.write(tmp_path / "before", latency_doc(8.0))
    rd.write(tmp_path / "after", latency_doc(28.0))
    (found,) = compare.latency_regressions(tmp_path / "before", [tmp_path / "after"], 0.2)
    assert found["must_cross"] == ["p1s1"] and found["culprits"] == ["p1s1"] and len(found["slowed"]) == 3
    assert compare.latency_regressions(tmp_path / "before", [tmp_path / "before"], 0.2) == []
    assert main.main(["compare", str(tmp_path / "after"), "--baseline", str(tmp_path / "before")]) == 1
    out = capsys.readouterr().out
    assert "every one must cross p1s1; suspects: p1s1" in out and "(+250%)" in out
    assert main.main(["compare", str(tmp_path / "before"), "--baseline", str(tmp_path / "before")]) == 0
    assert "no pair slower than the baseline by more than 20%" in capsys.readouterr().out
    assert main.main(["compare", str(tmp_path / "after"), "--baseline", str(tmp_path / "after"),
                      "--latency-threshold", "-1"]) == 2
    rd.write(tmp_path / "none", rd.doc("scenario", [rd.run("ecmp r1", {"bursty": rd.collective_job(50.0)})]))
    with pytest.raises(LabError, match="no run measured latency"):
        compare.latency_regressions(tmp_path / "none", [tmp_path / "after"], 0.2)
