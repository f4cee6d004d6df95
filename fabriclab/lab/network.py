"""The one module that speaks Mininet: turns a Fabric into running hosts, OVS switches and links.

Mininet's camelCase API stays in here. Every resource is written to the run record before it is
created, so a killed run can be cleaned up exactly. Link shaping and host addressing are applied by
the lab itself (not Mininet's TCLink, which silently ignores qdiscs the kernel lacks).
"""

from __future__ import annotations

import os
import re
import subprocess

from mininet.link import Link
from mininet.log import setLogLevel
from mininet.net import Mininet
from mininet.node import Host, OVSSwitch, RemoteController

from fabriclab.errors import LabError
from fabriclab.lab.runstate import OVS_PID_KEY, OVS_RUN_KEY
from fabriclab.system.shaping import as_script, queued_commands, rate_command, shaping_commands
from fabriclab.lab.teardown import delete_bridges, delete_link_group


class LabSwitch(OVSSwitch):
    """An OVS bridge tagged with the run that owns it (so `clean` never touches anyone else's)."""

    def __init__(self, name, run_id=None, **params):
        self.run_id = run_id
        super().__init__(name, **params)

    def bridgeOpts(self):
        return (super().bridgeOpts() + f" external_ids:{OVS_RUN_KEY}={self.run_id}"
                f" external_ids:{OVS_PID_KEY}={os.getpid()}")


class LabLink(Link):
    """A veth pair created inside the run's link group, both ends in one `ip link add`: however
    early a build is killed, every interface it made carries the lab's mark for `clean`, which
    deletes by group and never by name. (Mininet tags nothing and makes the pair first.)"""

    def __init__(self, node1, node2, group=None, **params):
        if group is None:
            raise LabError("a lab link needs the run's link group")
        self.group = group
        super().__init__(node1, node2, **params)

    def makeIntfPair(self, intfname1, intfname2, addr1=None, addr2=None, node1=None, node2=None,
                     deleteIntfs=True):
        # Mininet's contract (mininet.util.makeIntfPair): the first end is made by node1's shell
        # (in its namespace), the peer goes to node2's; nothing of the same name is deleted first
        # (check_free refused the build if a name was taken).
        run = node1.cmd if node1 else _quiet
        mac1 = f" address {addr1}" if addr1 else ""
        mac2 = f" address {addr2}" if addr2 else ""
        out = run(f"ip link add name {intfname1}{mac1} group {self.group} type veth peer name "
                  f"{intfname2}{mac2} group {self.group} netns {node2.pid if node2 else 1}")
        if out.strip():
            raise LabError(f"cannot create the veth pair {intfname1}/{intfname2}: {out.strip()[:200]}")


def _quiet(command):
    return subprocess.run(command.split(), capture_output=True, text=True).stderr


def planned_resources(fabric):
    """Bridge names and root-namespace interface names a fabric will create."""
    bridges = sorted(fabric.switches)
    intfs = sorted({intf for s in fabric.switches for intf in fabric.switch_ports(s).values()})
    return bridges, intfs


def check_free(fabric, run_records):
    """Refuse to build over names that already exist, naming the run that owns them."""
    existing = set(subprocess.run(["ovs-vsctl", "--timeout=10", "list-br"], capture_output=True,
                                  text=True).stdout.split())
    bridges, intfs = planned_resources(fabric)
    taken = [b for b in bridges if b in existing]
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    present = {line.split(":")[1].strip().split("@")[0] for line in links.splitlines() if ":" in line}
    taken += [i for i in intfs if i in present]
    if taken:
        owners = [r.id for r in run_records if set(taken) & (set(r.data["bridges"]) | set(r.data["interfaces"]))]
        owner = f" (owned by run {', '.join(owners)})" if owners else ""
        raise LabError(f"{len(taken)} names this fabric needs already exist, e.g. {taken[0]}{owner}; "
                       f"stop that fabric or run `fabriclab clean`")


def host_setup_script(host, mtu):
    """Shell lines that give each host port its address, its own routing table and no offloads.

    A port answers for one /32 and reaches its plane's 10.<plane>.0.0/16 on-link (the controller
    answers ARP). A rule per source address sends traffic bound to a port out of that port, as on a
    multi-NIC training host, and nowhere else: its table ends in `unreachable`, so traffic from a
    plane-1 address never leaks into plane 2 through the host. Unbound traffic uses the host's
    first port of each plane.
    """
    lines = [
        "sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1",
        "sysctl -qw net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0",
    ]
    for table, port in enumerate(host.ports, start=100):
        lines += [
            f"sysctl -qw net.ipv4.conf.{port.intf}.rp_filter=0",
            f"ethtool -K {port.intf} tx off rx off sg off tso off gso off gro off >/dev/null 2>&1 || true",
            f"ip link set {port.intf} address {port.mac} mtu {mtu}",
            f"ip addr add {port.ip}/32 dev {port.intf}",
            f"ip link set {port.intf} up",
            f"ip route add unreachable default table {table}",
            f"ip rule add from {port.ip} table {table} priority {table}",
        ] + port_routes(host, port)
    return "\n".join(lines)


def port_routes(host, port):
    """The routes through one host port: its plane on-link in the port's own table and, for the
    first port of its plane, in the main table. The kernel deletes them when the port goes down,
    so a cable that comes back up needs them again (`set_link`)."""
    table = 100 + host.ports.index(port)
    net = f"10.{port.plane}.0.0/16"
    lines = [f"ip route replace {net} dev {port.intf} src {port.ip} table {table}"]
    if next(p for p in host.ports if p.plane == port.plane) == port:
        lines.append(f"ip route replace {net} dev {port.intf} src {port.ip}")
    return lines


class LabController(RemoteController):
    """The lab's controller, already listening when Mininet hears of it (fabriclab.lab.controller
    waits for its port). Mininet's own check telnets to the port and decodes the bytes as UTF-8;
    the controller answers with an OpenFlow hello whose random transaction id is not always
    valid UTF-8, and then Mininet raises UnicodeDecodeError."""

    def checkListening(self):
        pass


def new_network(controller_port, verbose=False):
    """An empty Mininet network whose switches will connect to the lab's controller."""
    setLogLevel("info" if verbose else "warning")
    net = Mininet(topo=None, build=False, controller=None, autoSetMacs=False, autoStaticArp=False,
                  waitConnected=False)
    net.addController(LabController("c0", ip="127.0.0.1", port=controller_port))
    return net


def populate(net, fabric, run, datapath="user", delay=False):
    """Create and start every node and link of `fabric` in `net`, shaped and addressed.

    `datapath` is Mininet's OVS mode: 'user' (datapath_type=netdev) or 'kernel'. `delay`: put the
    spec's link delays on every port (netem; the caller checked the kernel has it). The caller owns
    teardown (`stop(net)`), including when this raises half way.
    """
    for controller in net.controllers:
        run.add_process(controller.pid, "controller-shell", f"mininet:{controller.name}")
    for host in fabric.hosts.values():
        node = net.addHost(host.name, cls=Host, ip=None)
        run.add_process(node.pid, "host-shell", f"mininet:{host.name}")
    for switch in fabric.switches.values():
        node = net.addSwitch(switch.name, cls=LabSwitch, run_id=run.id, dpid=f"{switch.dpid:016x}",
                             datapath=datapath, protocols="OpenFlow13,OpenFlow15", failMode="secure",
                             reconnectms=1000)
        run.add_process(node.pid, "switch-shell", f"mininet:{switch.name}")
    for link in fabric.links:
        params = dict(intfName1=link.a_intf, intfName2=link.b_intf, port2=link.b_port)
        if link.kind == "fabric":
            params["port1"] = link.a_port
        net.addLink(link.a, link.b, cls=LabLink, group=run.data["link_group"], **params)
    net.build()
    net.start()

    # Switch side: offloads off (the userspace datapath forwards what AF_PACKET hands it, so a
    # partial checksum would reach the far end unfinished), the MTU, and shaping on every port.
    # One `ip` and one `tc` process for all ports (-batch); the ethtool calls run in parallel.
    # With the queue model on, every port gets its class tree with a pause gate instead.
    shape = queued_commands if fabric.spec.queues is not None else shaping_commands
    ip_lines, tc_lines, intfs = [], [], []
    for switch in fabric.switches:
        for intf in fabric.switch_ports(switch).values():
            intfs.append(intf)
            link = _link_of(fabric, intf)
            ip_lines.append(f"link set {intf} mtu {fabric.spec.mtu} group {run.data['link_group']}")
            tc_lines += [" ".join(cmd[1:]) for cmd in shape(
                intf, link.rate_mbps, fabric.buffer_bytes(switch), fabric.spec.mtu,
                delay_ms=fabric.spec.lab_delay_ms(link.kind) if delay else 0.0)]
    _batch(["ip", "-batch", "-"], ip_lines, "switch port MTU")
    _batch(["tc", "-batch", "-"], tc_lines, "switch port shaping")
    offload = "\n".join(f"ethtool -K {i} tx off rx off sg off tso off gso off gro off >/dev/null 2>&1 &"
                        for i in intfs)
    _root_script(offload + "\nwait", "switch port offloads")

    # Every host configures itself at once (send to all shells, then collect).
    started = []
    for host in fabric.hosts.values():
        node = net.get(host.name)
        script = host_setup_script(host, fabric.spec.mtu)
        for port in host.ports:
            script += "\n" + as_script(shape(port.intf, fabric.spec.host_rate_mbps,
                                             fabric.buffer_bytes(host.name), fabric.spec.mtu,
                                             delay_ms=fabric.spec.lab_delay_ms("host") if delay else 0.0))
        node.sendCmd("(set -e\n" + script + "\n) 2>&1; echo __rc=$?")
        started.append((host, node))
    for host, node in started:
        _check_output(node, node.waitOutput(), "host set-up")
        # Tell Mininet the addresses we configured (bookkeeping only), so its own commands
        # (`pingall`, `h1 ping h2`) know them.
        for port in host.ports:
            intf = node.nameToIntf[port.intf]
            intf.ip, intf.prefixLen, intf.mac = port.ip, 32, port.mac


def _link_of(fabric, intf):
    for link in fabric.links:
        if intf in (link.a_intf, link.b_intf):
            return link
    raise KeyError(intf)


def _batch(argv, lines, what):
    """Feed many `ip`/`tc` commands to one process; the first failure is reported."""
    proc = subprocess.run(argv, input="\n".join(lines) + "\n", capture_output=True, text=True)
    if proc.returncode != 0:
        first = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[0]
        raise LabError(f"{what} failed: {first}")


def _root_script(script, what):
    proc = subprocess.run(["bash", "-c", "set -e\n" + script], capture_output=True, text=True)
    if proc.returncode != 0:
        first = (proc.stderr.strip().splitlines() or ["exit code %d" % proc.returncode])[0]
        raise LabError(f"{what} failed: {first}")


def _check_output(node, out, what):
    """Raise with the failing line if a `(set -e ...) ; echo __rc=$?` script did not exit 0."""
    # The node's interactive shell echoes a '> ' continuation prompt per line of the script.
    out = re.sub(r"(?m)^(> )+", "", out)
    codes = re.findall(r"__rc=(\d+)", out)
    if not codes or codes[-1] != "0":
        detail = [line for line in out.splitlines() if line.strip() and "__rc=" not in line]
        raise LabError(f"{what} failed on {node.name}: {detail[-1] if detail else out.strip()}")


def set_link(net, link, up, fabric=None):
    """Bring a cable down or up by its switch-side (and host-side) interfaces, as pulling it would.
    A host port coming back up gets its routes again (`fabric` names the port)."""
    state = "up" if up else "down"
    for node_name, intf in ((link.a, link.a_intf), (link.b, link.b_intf)):
        net.get(node_name).cmd(f"ip link set {intf} {state}")
    if up and link.kind == "host" and fabric is not None:
        host = fabric.hosts[link.a]
        port = next(p for p in host.ports if p.intf == link.a_intf)
        net.get(host.name).cmd("; ".join(port_routes(host, port)))


def set_rate(net, link, rate_mbps, mtu, nodes=None):
    """Reshape both ends of a cable to `rate_mbps` (a degraded or restored link), or only the
    ends on `nodes` (a slow receiver: the leaf's port towards the NIC)."""
    for node_name, intf in ((link.a, link.a_intf), (link.b, link.b_intf)):
        if nodes is not None and node_name not in nodes:
            continue
        out = net.get(node_name).cmd(" ".join(rate_command(intf, rate_mbps, mtu)) + "; echo __rc=$?")
        _check_output(net.get(node_name), out, f"changing the rate of {intf}")


def stop(net, link_group):
    """Stop everything Mininet started for this network (hosts, switches, links, controller).

    Faster than Mininet's own stop, which deletes every interface through a shell round trip:
    the run's root-namespace veths go in one batched `ip link del group` (a veth's peer goes
    with it), all bridges in one ovs-vsctl call, and a host's namespace with its shell.
    """
    if net is None:
        return
    delete_link_group(link_group)        # every veth was created in it (LabLink)
    delete_bridges([s.name for s in net.switches])
    # Mininet's RemoteController is a node with a shell of its own that stop() leaves running.
    for node in net.hosts + net.switches + net.controllers:
        node.terminate()
