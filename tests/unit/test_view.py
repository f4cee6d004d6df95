"""The fabric view of a finished run, without a network: the layout by tier and plane, the
frames a results folder yields (rates, queues, links down), and the self-contained page."""

import json
import re

import pytest

from fabriclab.errors import LabError
from fabriclab.measure import portsampler
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import load_spec
from fabriclab.view import frames, layout, page
from tests.unit import resultdocs


def fabric(name):
    return Fabric(load_spec(name))


@pytest.mark.parametrize("spec", ["tiny", "default", "routing", "spectrumx_fig16", "multiplane_pfc",
                                  "rail_optimized"])
def test_every_node_and_cable_is_drawn_once_by_tier(spec):
    fab = fabric(spec)
    lay = layout.layout(fab)
    ids = [n["id"] for n in lay["nodes"]]
    assert sorted(ids) == sorted([*fab.switches, *fab.hosts])
    assert len({link["id"] for link in lay["links"]}) == len(fab.links) == len(lay["links"])
    y = {role: {n["y"] for n in lay["nodes"] if n["role"] == role} for role in ("spine", "leaf", "host")}
    assert max(y["spine"]) < min(y["leaf"]) < max(y["leaf"]) + 1 <= min(y["host"])
    for n in lay["nodes"]:
        assert 0 < n["x"] < lay["width"] and 0 < n["y"] < lay["height"]
    hosts = sorted((n for n in lay["nodes"] if n["role"] == "host"), key=lambda n: n["x"])
    assert [n["id"] for n in hosts] == [f"h{i}" for i in range(1, len(hosts) + 1)]
    # planes side by side: every switch of plane p left of every switch of plane p + 1
    planes = fab.spec.planes
    for p in range(1, planes):
        left = max(n["x"] for n in lay["nodes"] if n["plane"] == p)
        right = min(n["x"] for n in lay["nodes"] if n["plane"] == p + 1)
        assert left < right
    # no two switches on one spot
    spots = [(n["x"], n["y"]) for n in lay["nodes"]]
    assert len(set(spots)) == len(spots)


def test_two_nics_of_a_host_on_one_leaf_are_two_cables():
    from fabriclab.topologies.spec import spec_from_dict

    spec = spec_from_dict({"name": "two-nics", "kind": "leafspine", "leaves": 2, "spines": 1,
                           "hosts_per_leaf": 1, "nics_per_host": 2, "host_rate": "10Mbit",
                           "fabric_rate": "10Mbit", "buffers": {"host": "64KiB", "leaf": "64KiB",
                                                                "spine": "64KiB"}})
    lay = layout.layout(Fabric(spec))
    host_links = [link for link in lay["links"] if link["kind"] == "host"]
    assert len(host_links) == 4 and len({link["id"] for link in host_links}) == 4
    assert {link["label"] for link in host_links} == {"h1-l1", "h2-l2"}      # what events name


def test_a_rail_groups_hosts_sit_under_its_rail_leaves():
    lay = layout.layout(fabric("rail_optimized"))
    x = {n["id"]: n["x"] for n in lay["nodes"]}
    # group 1 (h1-h4) under l1-l2, group 2 (h5-h8) under l3-l4
    assert max(x[f"h{i}"] for i in range(1, 5)) < min(x[f"h{i}"] for i in range(5, 9))
    assert max(x["l1"], x["l2"]) < min(x["l3"], x["l4"])
    assert min(x[f"h{i}"] for i in range(1, 5)) < x["l1"] < x["l2"] < max(x[f"h{i}"] for i in range(1, 5))


@pytest.mark.parametrize("spec", ["tiny", "spectrumx_fig16"])
def test_every_sampled_column_is_one_direction_of_one_drawn_cable(spec):
    fab = fabric(spec)
    dirs = frames.directions(fab)
    cols = portsampler.columns(fab)
    assert set(dirs) == {c.name for c in cols}
    drawn = {link["id"] for link in layout.layout(fab)["links"]}
    per_cable = {}
    for ident, way, _egress in dirs.values():
        per_cable.setdefault(ident, []).append(way)
    assert set(per_cable) == drawn and all(sorted(w) == ["down", "up"] for w in per_cable.values())
    host = next(p for h in fab.hosts.values() for p in h.ports)
    # a NIC's sending direction queues at the NIC's own port; its receiving one at the leaf's
    assert dirs[f"{host.intf}>{host.leaf}"][2] == host.intf
    assert dirs[f"{host.leaf}>{host.intf}"][2] == f"{host.leaf}-eth{host.leaf_port}"


@pytest.mark.parametrize("count, most, expect", [(0, 5, []), (3, 5, [(0, 1), (1, 2), (2, 3)]),
                                                 (10, 5, [(0, 2), (2, 4), (4, 6), (6, 8), (8, 10)]),
                                                 (11, 5, [(0, 3), (3, 6), (6, 9), (9, 11)])])
def test_frames_cover_every_bin_in_whole_bins(count, most, expect):
    edges = frames.frame_edges(count, most)
    assert edges == expect and len(edges) <= most


def test_links_down_come_from_link_and_switch_events():
    fab = fabric("tiny")
    run = {"events": [{"event": "link_down", "target": "l1-s1, l2-s2", "t_s": 1.0},
                      {"event": "link_up", "target": "l1-s1", "t_s": 2.0},
                      {"event": "switch_down", "target": "s2", "t_s": 3.0},
                      {"event": "controller_programmed", "target": "ecmp", "t_s": 3.1},
                      {"event": "link_up", "target": "l1-s2", "t_s": 4.0}]}
    assert frames.down_intervals(run, fab) == [("l1-s1", 1.0, 2.0), ("l2-s2", 1.0, None),
                                              ("l1-s2", 3.0, 4.0)]


def results_folder(tmp_path, queues=True):
    folder = tmp_path / "run"
    doc = resultdocs.write(folder, resultdocs.scenario_doc(), dip=(1.0, 2.0))
    first = doc["runs"][0]
    first["events"] = [{"event": "link_down", "target": "l1-s1", "t_s": 1.0},
                       {"event": "link_up", "target": "l1-s1", "t_s": 1.5}]
    if queues:
        first["files"]["queues_csv"] = "queues-first.csv"
        rows = ["t_s,port,node,peer,role,class,occ,held,tx_bytes,marks,drops,pause_tx,paused"]
        for i in range(40):
            t = 0.1 * i + 0.01
            occ = 5000 if 10 <= i < 12 else 100
            rows.append(f"{t:.3f},l1-eth2,l1,s1,leaf,lossless,{occ},0,{i * 1000},{i // 10},0,{i // 20},"
                        f"{int(i == 11)}")
            rows.append(f"{t:.3f},l1-eth2,l1,s1,leaf,control,7,0,0,0,0,0,0")
        (folder / "queues-first.csv").write_text("\n".join(rows) + "\n")
    (folder / "results.json").write_text(json.dumps(doc))
    return folder, doc


def test_a_run_becomes_frames_of_rates_queues_and_downs(tmp_path):
    folder, doc = results_folder(tmp_path)
    fab = page.fabric_of(doc)
    data = frames.run_frames(folder, doc["runs"][0], fab, max_frames=20)
    assert len(data["t"]) == 20 and data["t"][-1] == pytest.approx(3.8)      # a frame's first bin
    up = data["rates"]["l1-s1"]["up"]
    assert up[0] == pytest.approx(80.0) and up[5] == 0.0 and up[-1] == pytest.approx(80.0)
    # the CSV's l2>s2#2 is no cable of tiny (one link per pair): skipped, not drawn on l2-s2
    assert "l2-s2" not in data["rates"] and not any("#" in ident for ident in data["rates"])
    q = data["queues"]["l1-s1"]["up"]              # l1-eth2: l1's port towards s1
    assert q["occ"][5] == 5007 and q["occ"][0] == 107 and q["high"][-1] == 5007
    assert q["marks"][-1] == 3 and q["pause_tx"][-1] == 1 and q["paused"][5] == 1
    assert "down" not in data["queues"]["l1-s1"]   # an idle port is left out
    assert data["down"] == [["l1-s1", 1.0, 1.5]]
    assert [f[1] for f in data["faults"]][:2] == [f["label"] for f in doc["runs"][0]["faults"]][:2]


def test_the_page_stands_alone_and_carries_every_element(tmp_path):
    folder, doc = results_folder(tmp_path)
    text = page.render(folder, doc)
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)     # nothing fetched
    assert "<script>" in text and "<style>" in text
    payload = re.search(r'<script type="application/json" id="fabric-data">(.*?)</script>', text,
                        re.S).group(1)
    data = json.loads(payload.replace("<\\/", "</"))
    assert {n["id"] for n in data["layout"]["nodes"]} == {"l1", "l2", "s1", "s2", "h1", "h2"}
    assert [r["label"] for r in data["runs"]] == [r["label"] for r in doc["runs"]]
    assert data["runs"][0]["jobs"][0]["busbw"] == "71.50 Mbit/s"
    assert "host links 10.0 Mbit/s" in text and "time scale x40000" in text
    path = page.write(folder)
    assert path == folder / "view.html" and path.read_text() == text


def test_a_label_cannot_close_the_data_script(tmp_path):
    folder, doc = results_folder(tmp_path, queues=False)
    doc["runs"][0]["label"] = "</script><script>alert(1)</script>"
    text = page.render(folder, doc)
    assert text.count("</script>") == 2


def test_what_cannot_be_drawn_is_one_line(tmp_path):
    folder, doc = results_folder(tmp_path, queues=False)
    broken = dict(doc, spec=None)
    with pytest.raises(LabError, match="no spec") as err:
        page.render(folder, broken)
    assert "\n" not in str(err.value)
    for r in doc["runs"]:
        (folder / r["files"]["links_csv"]).unlink()
    with pytest.raises(LabError, match="no run with a links CSV"):
        page.render(folder, doc)
    (folder / "queues.csv").write_text("t_s,port\n0,x\n")
    run = dict(doc["runs"][0], files={"links_csv": "missing.csv"})
    assert frames.run_frames(folder, run, page.fabric_of(doc)) is None
    with pytest.raises(LabError, match="unreadable queues CSV"):
        frames.read_queues(folder / "queues.csv")


@pytest.mark.parametrize("bad", ["nan", "inf"])
def test_a_non_finite_sample_is_refused_in_one_line(tmp_path, bad):
    folder, doc = results_folder(tmp_path, queues=False)
    csv_path = folder / doc["runs"][0]["files"]["links_csv"]
    lines = csv_path.read_text().splitlines()
    lines[3] = lines[3].rsplit(",", 1)[0] + "," + bad
    csv_path.write_text("\n".join(lines) + "\n")
    with pytest.raises(LabError, match="not a finite number") as err:
        page.render(folder, doc)
    assert "\n" not in str(err.value)
    queues = folder / "q.csv"
    queues.write_text("t_s,port,node,peer,role,class,occ,held,tx_bytes,marks,drops,pause_tx,paused\n"
                      f"0.1,l1-eth2,l1,s1,leaf,lossless,{bad},0,0,0,0,0,0\n")
    with pytest.raises(LabError, match="unreadable queues CSV"):
        frames.read_queues(queues)
