"""Spreading one fabric over several machines: where each node goes, which cables cross, and the
one-line refusals (topologies/split.py, `fabriclab check --split`)."""

import json

import pytest

from fabriclab.cli.main import main
from fabriclab.errors import SpecError
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import load_spec
from fabriclab.topologies.split import Split, SplitSpec, load_split, parse_split


def split(spec, text):
    return Split(Fabric(load_spec(spec)), parse_split(text))


def crossing(s):
    return sorted(link.label for link in s.boundary)


def test_by_leaf_keeps_racks_whole_and_cuts_only_uplinks():
    s = split("default", "leaf:2")      # 4 leaves x 4 spines, 2 hosts a leaf
    assert [s.machine_of[f"l{i}"] for i in range(1, 5)] == [1, 1, 2, 2]
    assert [s.machine_of[f"s{i}"] for i in range(1, 5)] == [1, 2, 1, 2]
    assert all(s.machine_of[h.name] == s.machine_of[h.ports[0].leaf] for h in s.fabric.hosts.values())
    # every leaf has one uplink to each spine; half the spines sit on the other machine
    assert all(link.kind == "fabric" for link in s.boundary) and len(s.boundary) == 8
    assert crossing(s) == sorted(f"l{leaf}-s{spine}" for leaf in (1, 2) for spine in (2, 4)) + \
        sorted(f"l{leaf}-s{spine}" for leaf in (3, 4) for spine in (1, 3))


def test_by_leaf_keeps_a_pods_spines_with_its_leaves():
    s = split("meta_dc", "leaf:2")      # 2 pods of 2x2, 2 super-spines
    pods = {name: sw.pod for name, sw in s.fabric.switches.items()}
    assert all(s.machine_of[n] == p for n, p in pods.items() if p)
    # only spine to super-spine cables cross: pod 1's s2 to ss2 and pod 2's s3 to ss1
    assert crossing(s) == ["s2-ss2", "s3-ss1"]
    assert split("meta_dc", "pod:2").machine_of == s.machine_of


def test_by_plane_puts_a_plane_on_one_machine_and_host_cables_cross():
    s = split("multiplane_pfc", "plane:2")       # 4 planes, 4 hosts
    machine_of_plane = {1: 1, 2: 1, 3: 2, 4: 2}
    assert all(s.machine_of[n] == machine_of_plane[sw.plane] for n, sw in s.fabric.switches.items())
    assert [s.machine_of[f"h{i}"] for i in range(1, 5)] == [1, 1, 2, 2]
    assert all(link.kind == "host" for link in s.boundary)
    # every host has one port per plane; those to planes on the other machine cross: half of them
    hosts = s.fabric.hosts.values()
    assert len(s.boundary) == sum(1 for h in hosts for p in h.ports
                                  if machine_of_plane[p.plane] != s.machine_of[h.name]) == 8
    assert split("multiplane_pfc", "plane:4").summary()["boundary_host_links"] == 12


def test_rail_groups_stay_together_by_leaf():
    s = split("rail_optimized", "leaf:2")
    assert s.summary()["boundary_host_links"] == 0


def test_summary_counts_what_each_machine_forwards():
    s = split("default", "leaf:2").summary()
    assert s["boundary_links"] == 8 and s["boundary_mbps"] == 8 * 20
    for m in s["machines"]:
        # 2 leaves (2 host + 4 uplink ports each) and 2 spines (4 ports each), all at 20 Mbit/s
        assert (m["switches"], m["hosts"], m["switch_ports"], m["forwarding_mbps"]) == (4, 4, 20, 400.0)
        assert m["boundary_links"] == 8 and m["boundary_mbps"] == 160
    assert sum(m["hosts"] for m in s["machines"]) == 8


def test_explicit_split_from_a_file(tmp_path):
    path = tmp_path / "two.yaml"
    path.write_text("machines: 2\nplace:\n  1: [l1, s1]\n  2: [l2, s2, h1]\n")
    s = Split(Fabric(load_spec("tiny")), load_split(path))
    assert s.machine_of == {"l1": 1, "s1": 1, "l2": 2, "s2": 2, "h1": 2, "h2": 2}
    # h1's cable to l1 crosses, as do both leaves' uplinks to the other machine's spine
    assert crossing(s) == ["h1-l1", "l1-s2", "l2-s1"]


@pytest.mark.parametrize("text, message", [
    ("machines: 2\nplace: {1: [l1, s1], 2: [l2]}\n", "1 switch(es) not placed, e.g. s2"),
    ("machines: 2\nplace: {1: [l1, s1, s2], 2: [l2, l1]}\n", "'l1' is placed on machines 1 and 2"),
    ("machines: 2\nplace: {1: [l1, s1, s2], 3: [l2]}\n", "a machine of place must be in [1, 2], got 3"),
    ("machines: 2\nplace: {1: [l1, s1, s2, l2, zz9]}\n", "no switch or host 'zz9'"),
    ("machines: 2\nplace: {1: [l1, s1, s2, l2]}\n", "machine 2 of 2 would hold no switch"),
    ("machines: 1\nplace: {1: [l1]}\n", "machines must be in [2, 64], got 1"),
    ("machines: 2\nplace: {1: l1}\n", "place.1 must be a list of switch and host names"),
    ("machines: 2\nplaces: {}\n", "unknown key 'places'"),
    ("[1, 2]\n", "must be a mapping"),
])
def test_bad_split_files_are_one_line_errors(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as caught:
        Split(Fabric(load_spec("tiny")), load_split(path))
    assert message in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("spec, text, message", [
    ("tiny", "leaf", "expected leaf:N, plane:N, pod:N or a split file"),
    ("tiny", "rack:2", "expected leaf:N"),
    ("tiny", "leaf:two", "N must be a whole number"),
    ("tiny", "leaf:3", "2 leaves cannot fill 3 machines"),
    ("tiny", "leaf:1", "machines must be 2..64"),
    ("tiny", "plane:2", "1 plane(s) cannot fill 2 machines"),
    ("tiny", "pod:2", "pods are a threetier spec's zones"),
    ("meta_dc", "pod:3", "2 pods cannot fill 3 machines"),
    ("tiny", "missing.yaml", "cannot read split file"),
])
def test_bad_splits_are_one_line_errors(spec, text, message):
    with pytest.raises(SpecError) as caught:
        split(spec, text)
    assert message in str(caught.value), str(caught.value)


def test_check_shows_the_split(capsys):
    assert main(["check", "meta_dc", "--split", "pod:2"]) == 0
    out = capsys.readouterr().out
    assert "meta_dc split by pod over 2 machines: 2 cables cross (0 of them host cables), 20 Mbit/s" in out
    assert main(["check", "tiny", "--split", "leaf:2", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)[0]["split"]
    assert doc["by"] == "leaf" and doc["boundary_links"] == 2
    assert {b["link"] for b in doc["boundary"]} == {"l1-s2", "l2-s1"}
    assert main(["check", "tiny", "--split", "plane:2"]) == 2
    assert "1 plane(s) cannot fill 2 machines" in capsys.readouterr().err


def test_splitspec_is_plain_data():
    assert SplitSpec("leaf", 2) == parse_split("leaf:2")
    with pytest.raises(SpecError, match="by must be one of leaf, plane, pod, explicit, got 'rack'"):
        Split(Fabric(load_spec("tiny")), SplitSpec("rack", 2))
