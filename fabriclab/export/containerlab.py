"""A spec's fabric as a containerlab topology (`*.clab.yml`), for running it as containers.

    fabriclab export containerlab default --out clab/          # clab/default.clab.yml, clab/run/
    cd clab && sudo containerlab deploy -t default.clab.yml

Every node is a `linux` container of the image containerlab/Dockerfile builds (Debian 12, Open
vSwitch, fabriclab): the controller (`ctl`) runs the chosen routing app on its management address;
each switch runs Open vSwitch's userspace datapath with one bridge named as the lab names it, the
same datapath id, port numbers and OpenFlow versions, and that controller; each host configures its
ports as a lab host does (addresses, per-port routing tables). Every cable is a veth link between
the same interfaces the lab uses, shaped by the same tc commands on both ends (rates and buffers
of the spec). The management network is containerlab's, with fixed addresses: the controller at
the subnet's first usable address, then the switches and the hosts. The controller reads the
fabric from run/fabric.json, bound into its container.
"""

from __future__ import annotations

import ipaddress
import json
import pathlib
import shlex

from fabriclab.apps import DEFAULT_ROUTING
from fabriclab.errors import LabError
from fabriclab.loading import clip, excerpt

SCHEMA = pathlib.Path(__file__).resolve().parent / "schema" / "clab.schema.json"
DEFAULT_IMAGE = "fabriclab-lab:latest"
DEFAULT_SUBNET = "172.20.30.0/24"
OPENFLOW_PORT = 6653
VENV = "/opt/fabriclab/venv"
RUN_DIR = "/fabriclab/run"
CONTROLLER = "ctl"


def _sh(argv):
    """One exec entry: a command line containerlab runs in the node, through sh."""
    line = argv if isinstance(argv, str) else " ".join(shlex.quote(a) for a in argv)
    return f"sh -c {shlex.quote(line)}"


def management(fabric, subnet):
    """{node: address} on the management subnet: controller, switches, hosts, in that order."""
    try:
        net = ipaddress.ip_network(subnet, strict=True)
    except ValueError:
        raise LabError(f"management subnet {excerpt(subnet)} is not a network like {DEFAULT_SUBNET}") from None
    if net.version != 4:
        raise LabError(f"management subnet {excerpt(subnet)} must be IPv4")
    names = [CONTROLLER, *fabric.switches, *fabric.hosts]
    usable = net.num_addresses - 3            # network, broadcast and containerlab's gateway (.1)
    if len(names) > usable:
        raise LabError(f"management subnet {clip(subnet)} holds {max(usable, 0)} nodes; the fabric has "
                       f"{len(names)}: choose a larger one")
    return {name: str(net.network_address + 2 + i) for i, name in enumerate(names)}


def switch_exec(fabric, name, controller_ip):
    """Start Open vSwitch in the switch's container, make its bridge as the lab does, shape its ports."""
    from fabriclab.system.shaping import shaping_commands

    switch = fabric.switches[name]
    ports = fabric.switch_ports(name)                       # {OpenFlow port: interface}
    bridge = [
        "ovs-vsctl", "--may-exist", "add-br", name, "--", "set", "bridge", name, "datapath_type=netdev",
        "protocols=OpenFlow13,OpenFlow15", "fail_mode=secure", f"other-config:datapath-id={switch.dpid:016x}"]
    for number, intf in sorted(ports.items()):
        bridge += ["--", "--may-exist", "add-port", name, intf, "--", "set", "interface", intf,
                   f"ofport_request={number}"]
    lines = ["/usr/share/openvswitch/scripts/ovs-ctl start --system-id=random --no-ovs-vswitchd",
             "/usr/share/openvswitch/scripts/ovs-ctl start --system-id=random --no-ovsdb-server", bridge]
    for intf in ports.values():
        link = next(k for k in fabric.links if intf in (k.a_intf, k.b_intf))
        lines.append(f"ip link set {intf} mtu {fabric.spec.mtu} up")
        lines.append(f"ethtool -K {intf} tx off rx off sg off tso off gso off gro off >/dev/null 2>&1 || true")
        lines += shaping_commands(intf, link.rate_mbps, fabric.buffer_bytes(name), fabric.spec.mtu)
    lines.append(["ovs-vsctl", "set-controller", name, f"tcp:{controller_ip}:{OPENFLOW_PORT}"])
    return [_sh(line) for line in lines]


def host_exec(fabric, name):
    """The lab's host set-up (addresses, routing tables, no offloads) and its NICs' shaping."""
    from fabriclab.lab.network import host_setup_script
    from fabriclab.system.shaping import shaping_commands

    host = fabric.hosts[name]
    lines = host_setup_script(host, fabric.spec.mtu).splitlines()
    for port in host.ports:
        lines += shaping_commands(port.intf, fabric.spec.host_rate_mbps, fabric.buffer_bytes(name),
                                  fabric.spec.mtu)
    return [_sh(line) for line in lines]


def topology(fabric, routing=DEFAULT_ROUTING, image=DEFAULT_IMAGE, subnet=DEFAULT_SUBNET, run_dir="run"):
    """The containerlab topology (a dict, as the file's YAML holds it)."""
    from fabriclab.lab.controller import check_app

    routing = check_app(routing)
    app, options = routing.name, dict(routing.settings)
    addresses = management(fabric, subnet)
    name = f"fabriclab-{fabric.spec.name}".replace("_", "-")
    nodes = {CONTROLLER: {
        "kind": "linux", "mgmt-ipv4": addresses[CONTROLLER], "binds": [f"{run_dir}:{RUN_DIR}"],
        "labels": {"fabriclab-role": "controller"},
        "cmd": " ".join(shlex.quote(a) for a in [
            f"{VENV}/bin/python", "-m", "fabriclab.apps.runner", "--app", app, "--run-dir", RUN_DIR,
            "--port", str(OPENFLOW_PORT), "--listen", addresses[CONTROLLER], "--options", json.dumps(options),
            "--run-id", name])}}
    for switch in fabric.switches.values():
        nodes[switch.name] = {"kind": "linux", "mgmt-ipv4": addresses[switch.name],
                              "labels": {"fabriclab-role": switch.role, "fabriclab-plane": str(switch.plane)},
                              "exec": switch_exec(fabric, switch.name, addresses[CONTROLLER])}
    for host in fabric.hosts.values():
        nodes[host.name] = {"kind": "linux", "mgmt-ipv4": addresses[host.name],
                            "labels": {"fabriclab-role": "host"}, "exec": host_exec(fabric, host.name)}
    links = [{"endpoints": [f"{link.a}:{link.a_intf}", f"{link.b}:{link.b_intf}"], "mtu": fabric.spec.mtu}
             for link in fabric.links]
    return {"name": name,
            "mgmt": {"network": name, "ipv4-subnet": subnet},
            "topology": {"kinds": {"linux": {"image": image}}, "nodes": nodes, "links": links}}


# The schema's patterns are ECMAScript's: `[\p{N}\p{L}]` (a letter or number, in an interface
# zone) is the only construct Python's re lacks, and `[^\W_]` means the same there.
_ECMA_CLASS, _PYTHON_CLASS = "[\\p{N}\\p{L}]", "[^\\W_]"


def _python_patterns(node):
    if isinstance(node, dict):
        return {(k.replace(_ECMA_CLASS, _PYTHON_CLASS) if isinstance(k, str) else k):
                (v.replace(_ECMA_CLASS, _PYTHON_CLASS) if k == "pattern" and isinstance(v, str) else _python_patterns(v))
                for k, v in node.items()}
    if isinstance(node, list):
        return [_python_patterns(v) for v in node]
    return node


def schema():
    """containerlab's schema (vendored, unchanged on disk), its patterns readable by Python's re."""
    return _python_patterns(json.loads(SCHEMA.read_text()))


def validate(data):
    """Check a topology against containerlab's published schema; LabError naming the first problem."""
    import jsonschema

    error = jsonschema.exceptions.best_match(jsonschema.Draft7Validator(schema()).iter_errors(data))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "the topology"
        raise LabError(f"containerlab topology invalid at {where}: {clip(error.message, 120)}")


def export(fabric, out, routing=DEFAULT_ROUTING, image=DEFAULT_IMAGE, subnet=DEFAULT_SUBNET):
    """Write OUT/<spec>.clab.yml and OUT/run/fabric.json; returns the topology file's path."""
    import yaml

    from fabriclab.apps.control import FABRIC_FILE

    data = topology(fabric, routing, image, subnet)
    validate(data)
    out = pathlib.Path(out)
    try:
        (out / "run").mkdir(parents=True, exist_ok=True)
        (out / "run" / FABRIC_FILE).write_text(fabric.to_json())
        path = out / f"{fabric.spec.name}.clab.yml"
        path.write_text(f"# fabriclab export containerlab {fabric.spec.name} --routing {routing}: "
                        f"`sudo containerlab deploy -t {path.name}` here\n"
                        + yaml.safe_dump(data, sort_keys=False, width=120))
    except OSError as exc:
        raise LabError(f"cannot write the topology into {clip(out)}: {exc.strerror}") from None
    return path
