"""`fabriclab export containerlab` without containerlab: every shipped shape's topology checked
against containerlab's published schema (vendored), the same nodes, cables, interfaces, port
numbers and controller as the lab, and bad input refused in one line."""

import json
import re

import pytest
import yaml

from fabriclab.cli.main import main
from fabriclab.errors import LabError
from fabriclab.export import containerlab
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import load_spec


@pytest.mark.parametrize("spec", ["tiny", "default", "parallel_links", "spectrumx_fig16", "meta_ai_zone", "meta_dc"])
def test_the_topology_is_the_fabric_and_valid_containerlab(spec, tmp_path):
    fabric = Fabric(load_spec(spec))
    path = containerlab.export(fabric, tmp_path, routing="eecmp")
    data = yaml.safe_load(path.read_text())
    containerlab.validate(data)
    nodes = data["topology"]["nodes"]
    assert set(nodes) == {"ctl", *fabric.switches, *fabric.hosts}
    assert all(n["kind"] == "linux" for n in nodes.values())
    assert data["topology"]["kinds"]["linux"]["image"] == containerlab.DEFAULT_IMAGE
    # every cable once, between the interfaces the lab names (at most 15 characters, Linux's limit)
    ends = [e for link in data["topology"]["links"] for e in link["endpoints"]]
    assert len(data["topology"]["links"]) == len(fabric.links) and len(set(ends)) == len(ends)
    assert sorted(ends) == sorted(f"{n}:{i}" for k in fabric.links for n, i in ((k.a, k.a_intf), (k.b, k.b_intf)))
    assert all(len(e.split(":")[1]) <= 15 for e in ends)
    # management addresses: distinct, inside the subnet, the controller's where the switches look
    addresses = [n["mgmt-ipv4"] for n in nodes.values()]
    assert len(set(addresses)) == len(addresses) and all(a.startswith("172.20.30.") for a in addresses)
    ctl = nodes["ctl"]
    assert f"--listen {ctl['mgmt-ipv4']}" in ctl["cmd"] and "--app eecmp" in ctl["cmd"]
    for name, switch in fabric.switches.items():
        run = " ".join(nodes[name]["exec"])
        assert f"tcp:{ctl['mgmt-ipv4']}:6653" in run and f"datapath-id={switch.dpid:016x}" in run
        for number, intf in fabric.switch_ports(name).items():
            assert f"set interface {intf} ofport_request={number}" in run
    host = next(iter(fabric.hosts.values()))
    run = " ".join(nodes[host.name]["exec"])
    assert all(f"ip addr add {p.ip}/32 dev {p.intf}" in run for p in host.ports)
    assert f"rate {fabric.spec.host_rate_mbps * 1000:.0f}kbit" in run
    # the controller's input, bound into its container
    assert json.loads((tmp_path / "run" / "fabric.json").read_text())["spec"]["name"] == fabric.spec.name


def test_the_schema_catches_what_containerlab_would_refuse(tmp_path):
    data = containerlab.topology(Fabric(load_spec("tiny")))
    containerlab.validate(data)
    bad = json.loads(json.dumps(data))
    bad["topology"]["nodes"]["l1"]["colour"] = "red"
    with pytest.raises(LabError, match="containerlab topology invalid at topology/nodes/l1"):
        containerlab.validate(bad)
    bad = json.loads(json.dumps(data))
    bad["name"] = "no spaces allowed"
    with pytest.raises(LabError, match="invalid at name"):
        containerlab.validate(bad)


def test_the_vendored_schema_is_unchanged_and_read_as_ecmascript_means_it():
    raw = containerlab.SCHEMA.read_text()
    assert "\\\\p{N}\\\\p{L}" in raw                           # the file stays containerlab's
    assert "BSD" in (containerlab.SCHEMA.parent / "README.md").read_text()
    assert "Nokia" in (containerlab.SCHEMA.parent / "LICENSE").read_text()
    # the one translated construct: a letter or number in an interface zone (eth0%vrf1)
    patterns = re.findall(r'"pattern": "((?:[^"\\\\]|\\\\.)*)"', json.dumps(containerlab.schema()))
    assert patterns and not any("\\\\p{" in p for p in patterns)
    assert sum(p.count("[^\\\\W_]") for p in patterns) == 5
    zone = re.compile(containerlab.schema()["definitions"]["ipv4-addr"]["pattern"])
    assert zone.match("10.0.0.1%vrf1") and not zone.match("10.0.0.1%vrf_1")


def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys):
    assert main(["export", "containerlab", "tiny", "--out", str(tmp_path / "a"), "--routing", "nope"]) == 2
    assert main(["export", "containerlab", "tiny", "--out", str(tmp_path / "b"), "--mgmt-subnet", "10.0.0.0/30"]) == 2
    assert main(["export", "containerlab", "tiny", "--out", str(tmp_path / "c"), "--mgmt-subnet", "fd00::/64"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and "holds 1 nodes; the fabric has 7" in err[1] and "must be IPv4" in err[2]
    assert not any((tmp_path / d).exists() for d in "abc")
    with pytest.raises(LabError, match="is not a network"):
        containerlab.management(Fabric(load_spec("tiny")), "10.0.0.1/24")
    assert main(["export", "containerlab", "tiny", "--out", str(tmp_path / "ok")]) == 0
    assert "checked against containerlab's schema" in capsys.readouterr().out


def test_the_controller_listens_on_one_address_only():
    from fabriclab.apps import control

    parser = control.argument_parser({"ecmp": None})
    base = ["--app", "ecmp", "--run-dir", "/tmp", "--port", "6653"]
    assert parser.parse_args(base).listen == "127.0.0.1"
    assert parser.parse_args(base + ["--listen", "172.20.30.2"]).listen == "172.20.30.2"
    for bad in ("0.0.0.0", "::", "ctl"):
        with pytest.raises(SystemExit):
            parser.parse_args(base + ["--listen", bad])
