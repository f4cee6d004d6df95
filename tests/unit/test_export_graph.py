"""`export fabric` and `export graph`: the fabric as JSON for a controller of one's own, and as
mermaid, Graphviz dot and diagrams.net sources. Each is checked against the Fabric it came from,
on a leaf/spine, a 3-tier, a multiplane and a parallel-links spec."""

import json
import re
import xml.etree.ElementTree as ET

import pytest

from fabriclab.cli.main import main
from fabriclab.export import graph, topology
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import load_spec

SPECS = ("tiny", "ecmp_tiers", "multiplane_pfc", "parallel_links")


@pytest.fixture(params=SPECS)
def fabric(request):
    return Fabric(load_spec(request.param))


def test_the_topology_names_every_port_at_both_ends_of_every_cable(fabric):
    doc = json.loads(topology.to_json(fabric))
    assert (doc["format"], doc["version"], doc["name"]) == ("fabriclab-topology", 1, fabric.spec.name)
    switches = {s["name"]: s for s in doc["switches"]}
    assert {n: s["dpid"] for n, s in switches.items()} == {n: s.dpid for n, s in fabric.switches.items()}
    assert all(int(s["dpid_hex"], 16) == s["dpid"] for s in switches.values())
    for s in switches.values():                                   # OpenFlow port numbers are unique per switch
        assert len({p["port"] for p in s["ports"]}) == len(s["ports"])
    assert len(doc["links"]) == len(fabric.links)
    for link in doc["links"]:
        for end, peer in (("a", "b"), ("b", "a")):
            if link[end] in switches:
                (port,) = [p for p in switches[link[end]]["ports"] if p["port"] == link[f"{end}_port"]]
                assert (port["peer"], port["peer_intf"]) == (link[peer], link[f"{peer}_intf"])
                assert port["peer_port"] == link[f"{peer}_port"]
    hosts = {h["name"]: h for h in doc["hosts"]}
    for name, host in fabric.hosts.items():
        assert [(p["ip"], p["mac"], p["leaf"], p["leaf_port"]) for p in hosts[name]["ports"]] == \
            [(p.ip, p.mac, p.leaf, p.leaf_port) for p in host.ports]
        for p in host.ports:                                      # the leaf's port leads back to the host
            (leaf_port,) = [q for q in switches[p.leaf]["ports"] if q["port"] == p.leaf_port]
            assert (leaf_port["peer"], leaf_port["peer_intf"], leaf_port["peer_port"]) == (name, p.intf, None)


def test_mermaid_and_dot_draw_every_node_once_and_every_cable(fabric):
    names = [*fabric.switches, *fabric.hosts]
    text = graph.render(fabric, "mermaid")
    assert text.startswith("```mermaid\ngraph TB\n") and text.endswith("```\n")
    assert sorted(re.findall(r"^    (\S+?)\(?\[", text, re.M)) == sorted(names)
    assert len(re.findall(r"^  \S+ ---", text, re.M)) == len(fabric.links)
    dot = graph.render(fabric, "dot")
    assert dot.count("{") == dot.count("}") and dot.startswith(f"graph {fabric.spec.name} {{")
    assert sorted(re.findall(r'^  "([^"]+)" \[shape', dot, re.M)) == sorted(names)
    edges = re.findall(r'^  "([^"]+)" -- "([^"]+)"', dot, re.M)
    assert sorted(map(sorted, edges)) == sorted(sorted((link.a, link.b)) for link in fabric.links)
    # written from the higher tier down: dot ranks an edge's first node above its second
    tier = {**{n: {"super_spine": 0, "spine": 1, "leaf": 2}[s.role] for n, s in fabric.switches.items()},
            **{h: 3 for h in fabric.hosts}}
    assert all(tier[a] < tier[b] for a, b in edges)


def test_drawio_is_a_diagrams_net_file_with_a_vertex_per_node_and_an_edge_per_cable(fabric):
    root = ET.fromstring(graph.render(fabric, "drawio"))
    assert root.tag == "mxfile"
    cells = root.findall("./diagram/mxGraphModel/root/mxCell")
    vertices = {c.get("id"): c for c in cells if c.get("vertex") == "1"}
    edges = [c for c in cells if c.get("edge") == "1"]
    assert sorted(c.get("value") for c in vertices.values()) == sorted([*fabric.switches, *fabric.hosts])
    assert len(edges) == len(fabric.links) and len({c.get("id") for c in edges}) == len(edges)
    assert all(e.get("source") in vertices and e.get("target") in vertices for e in edges)
    assert all(float(v.find("mxGeometry").get("x")) >= 0 for v in vertices.values())


def test_the_verbs_write_to_a_file_or_say_what_is_wrong_in_one_line(tmp_path, capsys):
    out = tmp_path / "f.json"
    assert main(["export", "fabric", "tiny", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["name"] == "tiny"
    assert main(["export", "graph", "tiny", "--format", "dot"]) == 0
    assert capsys.readouterr().out.splitlines()[1].startswith("graph tiny {")
    assert main(["export", "graph", "tiny", "--out", str(tmp_path / "no" / "such" / "g.md")]) == 2
    err = capsys.readouterr().err
    assert "cannot write" in err and "No such file or directory" in err and len(err.strip().splitlines()) == 1
