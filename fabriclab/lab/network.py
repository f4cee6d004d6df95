"""The one module that speaks Mininet: turns a Fabric into running hosts, OVS switches and links.

Mininet's camelCase API stays in here. Every resource is written to the run record before it is
created, so a killed run can be cleaned up exactly. Link shaping and host addressing are applied by
the lab itself (not Mininet's TCLink, which silently ignores qdiscs the kernel lacks).
"""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import time

from mininet.link import Link
from mininet.log import setLogLevel
from mininet.net import Mininet
from mininet.node import Host, OVSSwitch, RemoteController

from fabriclab.errors import EnvironmentProblem, LabError
from fabriclab.lab.runstate import OVS_PID_KEY, OVS_RUN_KEY
from fabriclab.system import offloads
from fabriclab.system.shaping import delay_change_command, queued_commands, rate_command, shaping_commands
from fabriclab.lab.teardown import delete_bridges, delete_link_group


class QuickShell:
    """A node (mixed in before Mininet's class) whose shell starts without the round trips Mininet
    makes while it builds the node: `ready_shells` waits for every node's at once. 305 nodes'
    shells, one after another, took about 1.5 s of 32x16x8's bring-up. Mininet's startShell reads
    until the first prompt and then runs a set-up command, and a switch brings its `lo` up right
    after: until ready_shells, read() says "prompt" at once and every command is kept, in order
    (each answers "", which is what they answer when they succeed)."""

    _starting = False
    _held = None          # the commands its start held back, until ready_shells runs them

    def startShell(self, mnopts=None):
        if getattr(self, "isRemote", False):
            # another machine's node (RemoteMixin) talks to its shell right after this returns
            return super().startShell(mnopts)
        self._starting, self._held = True, []
        return super().startShell(mnopts)

    def read(self, size=1024):
        return chr(127) if self._starting else super().read(size)

    def cmd(self, *args, **kwargs):
        if self._starting:
            self._held.append((args, kwargs))
            return ""
        return super().cmd(*args, **kwargs)


def ready_shells(nodes, timeout_s=60.0):
    """Wait for every QuickShell node's first prompt at once, then run what each one's start held
    back (all sent, then all collected). LabError naming a node whose shell never prompted."""
    waiting = {node.stdout.fileno(): node for node in nodes
               if isinstance(node, QuickShell) and node._held is not None}
    for node in waiting.values():
        node._starting = False
    poller = select.poll()
    for fd in waiting:
        poller.register(fd, select.POLLIN)
    deadline = time.monotonic() + timeout_s
    while waiting:
        left = deadline - time.monotonic()
        if left <= 0:
            raise LabError(f"the shell of {sorted(n.name for n in waiting.values())[0]} did not start "
                           f"within {timeout_s:.0f} s")
        for fd, _event in poller.poll(min(left, 1.0) * 1000):
            node = waiting[fd]
            if node.read(1024).endswith(chr(127)):
                poller.unregister(fd)
                del waiting[fd]
    held = [node for node in nodes if isinstance(node, QuickShell) and node._held]
    while held:
        for node in held:
            args, kwargs = node._held[0]
            node.sendCmd(*args, **kwargs)
        for node in held:
            node.waitOutput()
            node._held.pop(0)
        held = [node for node in held if node._held]
    for node in nodes:
        if isinstance(node, QuickShell):
            node._held = None


class LabHost(QuickShell, Host):
    """A Mininet host whose shell starts with the others (QuickShell)."""


class LabSwitch(QuickShell, OVSSwitch):
    """An OVS bridge tagged with the run that owns it (so `clean` never touches anyone else's)."""

    def __init__(self, name, run_id=None, owner_pid=None, **params):
        self.run_id = run_id
        self.owner_pid = owner_pid or os.getpid()    # on another machine: the run's member there
        super().__init__(name, **params)

    def bridgeOpts(self):
        return (super().bridgeOpts() + f" external_ids:{OVS_RUN_KEY}={self.run_id}"
                f" external_ids:{OVS_PID_KEY}={self.owner_pid}")

    @classmethod
    def batchStartup(cls, switches, run=None):
        """Every bridge in one ovs-vsctl transaction (a few past ARG_MAX) when they were made with
        batch=True: ovs-vsctl waits for ovs-vswitchd to reconfigure after each transaction, and
        that reconfiguration grows with the bridges it already has (48 bridges one by one took
        27 s, 0.57 s each). A failure stops the build in one line."""
        batched = [s for s in switches if s.batch]     # another machine's start one by one, there
        return super().batchStartup(batched, run=_vsctl_batch) if batched else []


def _vsctl_batch(command, shell=True):
    proc = subprocess.run(command, shell=shell, capture_output=True, text=True)
    if proc.returncode != 0:
        first = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[0]
        raise LabError(f"creating the switches failed: {first[:200]}")
    return proc.stdout, proc.stderr, proc.returncode


class LabLink(Link):
    """A veth pair created inside the run's link group, both ends in one `ip link add`: however
    early a build is killed, every interface it made carries the lab's mark for `clean`, which
    deletes by group and never by name. (Mininet tags nothing and makes the pair first.)"""

    def __init__(self, node1, node2, group=None, premade=False, **params):
        if group is None:
            raise LabError("a lab link needs the run's link group")
        self.group = group
        self.premade = premade           # made already, with the others (`make_veths`)
        # A switch's end: up=None, or Mininet brings it up with an `ifconfig` of its own (4 s of
        # a 768-link build); populate brings every switch port up in one `ip -batch` before the
        # bridges take them.
        for side, node in (("params1", node1), ("params2", node2)):
            if isinstance(node, OVSSwitch):
                params[side] = {**(params.get(side) or {}), "up": None}
        super().__init__(node1, node2, **params)

    def makeIntfPair(self, intfname1, intfname2, addr1=None, addr2=None, node1=None, node2=None,
                     deleteIntfs=True):
        if not self.premade:
            make_veth(self.group, intfname1, intfname2, addr1, addr2, node1, node2)


def make_veths(group, pairs):
    """Every veth pair of a one-machine fabric in one `ip -batch` from here: [(name1, pid of the
    node whose namespace it goes to, name2, pid)], each pair in link group `group` as it is made
    (768 pairs through the nodes' shells, one `ip` each, took 2.5 s)."""
    _batch(["ip", "-batch", "-"], [f"link add name {a} group {group} netns {pid_a} type veth peer name {b} "
                                   f"group {group} netns {pid_b}" for a, pid_a, b, pid_b in pairs], "veth pairs")


def make_veth(group, intfname1, intfname2, addr1=None, addr2=None, node1=None, node2=None):
    """A veth pair in link group `group`, made in one `ip link add`. Mininet's contract
    (mininet.util.makeIntfPair): the first end is made by node1's shell (in its namespace, on its
    machine), the peer goes to node2's; nothing of the same name is deleted first (check_free
    refused the build if a name was taken)."""
    run = node1.cmd if node1 else _quiet
    mac1 = f" address {addr1}" if addr1 else ""
    mac2 = f" address {addr2}" if addr2 else ""
    out = run(f"ip link add name {intfname1}{mac1} group {group} type veth peer name "
              f"{intfname2}{mac2} group {group} netns {node2.pid if node2 else 1}")
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
    """Refuse to build over names that already exist, naming the run that owns them. An
    EnvironmentProblem: no fabric can come up until they are gone (`reproduce` stops at it
    rather than fail every draw alike)."""
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
        raise EnvironmentProblem(f"{len(taken)} names this fabric needs already exist, e.g. {taken[0]}{owner}; "
                                 f"stop that fabric or run `fabriclab clean`")


def controller_connections(bridges):
    """Open vSwitch's side of each bridge's controller connection, for an error that says why a
    switch never reached the controller: {bridge: 'connected' or 'state=BACKOFF, last_error=...'}.
    Empty where OVS cannot be asked."""
    def listing(*args):
        proc = subprocess.run(["ovs-vsctl", "--timeout=5", "--format=json", *args],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise ValueError("ovs-vsctl failed")        # not "no such bridge": OVS was not asked
        return json.loads(proc.stdout)["data"]
    try:
        rows = [(name, c) for name, c in listing("--columns=name,controller", "list", "bridge") if name in bridges]
        owner = {c[1]: name for name, c in rows if c[0] == "uuid"}
        found = {name: "no controller set" for name, _ in rows}
        for uuid, connected, status in listing("--columns=_uuid,is_connected,status", "list", "controller"):
            name = owner.get(uuid[1])
            if name is not None:
                pairs = dict(status[1]) if status[0] == "map" else {}
                found[name] = "connected" if connected else ", ".join(
                    f"{k}={pairs[k]}" for k in ("state", "last_error", "sec_since_disconnect")
                    if k in pairs) or "not connected"
    except (OSError, ValueError, IndexError, TypeError, subprocess.SubprocessError):
        return {}
    return {name: found.get(name, "no such bridge") for name in bridges}


def host_setup(host, mtu):
    """What each host port needs: its address, its own routing table and no offloads.

    A port answers for one /32 and reaches its plane's 10.<plane>.0.0/16 on-link (the controller
    answers ARP). A rule per source address sends traffic bound to a port out of that port, as on a
    multi-NIC training host, and nowhere else: its table ends in `unreachable`, so traffic from a
    plane-1 address never leaks into plane 2 through the host. Unbound traffic uses the host's
    first port of each plane.

    Returns ({sysctl key, slash-separated: value}, [interfaces whose offloads go off], [`ip`
    commands, without the `ip`]): host_setup_script writes them a command a line, host_setup_batch
    in three processes.
    """
    sysctls = {"net/ipv6/conf/all/disable_ipv6": 1, "net/ipv6/conf/default/disable_ipv6": 1,
               "net/ipv4/conf/all/rp_filter": 0, "net/ipv4/conf/default/rp_filter": 0}
    ip = []
    for table, port in enumerate(host.ports, start=100):
        sysctls[f"net/ipv4/conf/{port.intf}/rp_filter"] = 0
        ip += [
            f"link set {port.intf} address {port.mac} mtu {mtu}",
            f"addr add {port.ip}/32 dev {port.intf}",
            f"link set {port.intf} up",
            f"route add unreachable default table {table}",
            f"rule add from {port.ip} table {table} priority {table}",
        ] + [line.removeprefix("ip ") for line in port_routes(host, port)]
    return sysctls, [port.intf for port in host.ports], ip


def host_setup_script(host, mtu):
    """host_setup as shell lines, one command each (what containerlab's exec runs)."""
    sysctls, intfs, ip = host_setup(host, mtu)
    return "\n".join([
        "sysctl -qw " + " ".join(f"{key}={value}" for key, value in sysctls.items()),
        *(f"ethtool -K {intf} {offloads.ETHTOOL_OFF} >/dev/null 2>&1 || true" for intf in intfs),
        *(f"ip {line}" for line in ip)])


# A node's shell reads its script through a terminal, which cuts a line at 4,095 bytes: each
# batched command keeps a line of its own (a here-document), however many ports a host has.
BATCH_END = "FABRICLAB_BATCH_END"


def host_setup_batch(host, mtu, tc_lines):
    """host_setup and the ports' `tc` commands (without the `tc`) as a shell script of three
    processes: the sysctls are the shell's own writes to /proc, the `ip` and `tc` commands one
    -batch each. A command a process cost 14 processes a single-port host, 3,600 for 32x16x8's."""
    sysctls, intfs, ip = host_setup(host, mtu)

    def batch(tool, lines):
        return "\n".join([f"{tool} -batch - <<'{BATCH_END}'", *lines, BATCH_END])
    return "\n".join([
        *(f"echo {value} > /proc/sys/{key}" for key, value in sysctls.items()),
        *(f"ethtool -K {intf} {offloads.ETHTOOL_OFF} >/dev/null 2>&1 || true" for intf in intfs),
        batch("ip", ip), *([batch("tc", tc_lines)] if tc_lines else [])])


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


def new_network(controller_port, verbose=False, controller_ip="127.0.0.1"):
    """An empty Mininet network whose switches will connect to the lab's controller at
    `controller_ip` (loopback; in a cluster every machine's loopback port leads to it over SSH)."""
    setLogLevel("info" if verbose else "warning")
    net = Mininet(topo=None, build=False, controller=None, autoSetMacs=False, autoStaticArp=False,
                  waitConnected=False)
    net.addController(LabController("c0", ip=controller_ip, port=controller_port))
    return net


def populate(net, fabric, run, datapath="user", delay=False, cluster=None, placement=None):
    """Create and start every node and link of `fabric` in `net`, shaped and addressed.

    `datapath` is Mininet's OVS mode: 'user' (datapath_type=netdev) or 'kernel'. `delay`: put the
    spec's link delays on every port (netem; the caller checked the kernel has it). With `cluster`
    (a fabriclab.system.spread.Spread, connected: fabriclab.cluster.cluster.Cluster) and `placement` ({node: machine 1..N}, a Split's
    machine_of) the nodes run on their machines and cables between machines are tunnels. The
    caller owns teardown (`stop(net)`, and the cluster's `close`), including when this raises.
    """
    machine_of = (lambda name: cluster.machines[placement[name] - 1]) if cluster else (lambda name: None)
    remote_switch = cluster.switch_class(LabSwitch) if cluster else None
    for controller in net.controllers:
        run.add_process(controller.pid, "controller-shell", f"mininet:{controller.name}")
    for host in fabric.hosts.values():
        machine = machine_of(host.name)
        if machine is None or machine.local:
            node = net.addHost(host.name, cls=LabHost, ip=None)
        else:
            node = net.addHost(host.name, cls=cluster.host_class, machine=machine, ip=None)
            cluster.record(machine, process={"pid": node.pid, "role": "host-shell", "match": f"mininet:{host.name}"})
        if cluster:
            cluster.place(host.name, machine)
        # Here, the shell or the SSH session that carries it: both end with the run.
        run.add_process(node.shell.pid, "host-shell", f"mininet:{host.name}")
    for switch in fabric.switches.values():
        machine = machine_of(switch.name)
        params = dict(run_id=run.id, dpid=f"{switch.dpid:016x}", datapath=datapath,
                      protocols="OpenFlow13,OpenFlow15", failMode="secure", reconnectms=1000)
        if machine is None or machine.local:
            node = net.addSwitch(switch.name, cls=LabSwitch, batch=True, **params)
        else:
            cluster.record(machine, bridges=[switch.name],
                           interfaces=sorted(fabric.switch_ports(switch.name).values()))
            params["datapath"] = machine.datapath
            node = net.addSwitch(switch.name, cls=remote_switch, machine=machine,
                                 owner_pid=cluster.member_pid(machine), **params)
            cluster.record(machine, process={"pid": node.pid, "role": "switch-shell",
                                             "match": f"mininet:{switch.name}"})
        if cluster:
            cluster.place(switch.name, machine)
        run.add_process(node.shell.pid, "switch-shell", f"mininet:{switch.name}")
    ready_shells([*net.hosts, *net.switches])
    group = run.data["link_group"]
    crossing = 0
    if not cluster:
        make_veths(group, [(link.a_intf, net.get(link.a).pid, link.b_intf, net.get(link.b).pid)
                           for link in fabric.links])
    for link in fabric.links:
        params = dict(intfName1=link.a_intf, intfName2=link.b_intf, port2=link.b_port)
        if link.kind == "fabric":
            params["port1"] = link.a_port
        if cluster:
            vni = None
            if placement[link.a] != placement[link.b]:
                vni, crossing = vxlan_id(group, crossing), crossing + 1
            net.addLink(link.a, link.b, cls=cluster.link_class, group=group, vni=vni,
                        cluster=cluster, make_veth=make_veth, **params)
        else:
            net.addLink(link.a, link.b, cls=LabLink, group=group, premade=True, **params)
    net.build()
    # Switch side: the MTU, the run's link group and up, before the bridges take the ports (one
    # `ip -batch` here; another machine's in its own, below); then offloads off (the userspace
    # datapath forwards what AF_PACKET hands it, so a partial checksum would reach the far end
    # unfinished) and shaping on every port. One `ip` and one `tc` process for all ports
    # (-batch); the offloads by ioctl here (system/offloads.py), by parallel ethtools on another
    # machine. With the queue model on, every port gets its class tree with a pause gate instead.
    # In a cluster, each machine does its own switches' ports.
    shape = queued_commands if fabric.spec.queues is not None else shaping_commands
    ports = {}                # machine (None: this one) -> (ip lines, tc lines, interfaces)
    link_of = {intf: link for link in fabric.links for intf in (link.a_intf, link.b_intf)}
    for switch in fabric.switches:
        machine = machine_of(switch)
        ip_lines, tc_lines, intfs = ports.setdefault(None if machine is None or machine.local else machine,
                                                     ([], [], []))
        for intf in fabric.switch_ports(switch).values():
            intfs.append(intf)
            link = link_of[intf]
            ip_lines.append(f"link set {intf} mtu {fabric.spec.mtu} group {run.data['link_group']} up")
            tc_lines += [" ".join(cmd[1:]) for cmd in shape(
                intf, link.rate_mbps, fabric.buffer_bytes(switch), fabric.spec.mtu,
                delay_ms=fabric.spec.lab_delay_ms(link.kind) if delay else 0.0)]
    if None in ports:
        _batch(["ip", "-batch", "-"], ports[None][0], "switch port MTU")
    net.start()
    for machine, (ip_lines, tc_lines, intfs) in ports.items():
        if machine is None:
            _batch(["tc", "-batch", "-"], tc_lines, "switch port shaping")
            offloads.turn_off(intfs)
        else:
            offload = "\n".join(f"ethtool -K {i} {offloads.ETHTOOL_OFF} >/dev/null 2>&1 &"
                                for i in intfs) + "\nwait"
            cluster.root_run(machine, "ip -batch -", "switch port MTU", stdin_text="\n".join(ip_lines) + "\n")
            cluster.root_run(machine, "tc -batch -", "switch port shaping", stdin_text="\n".join(tc_lines) + "\n")
            cluster.root_run(machine, offload, "switch port offloads")

    # Every host configures itself at once (send to all shells, then collect).
    started = []
    for host in fabric.hosts.values():
        node = net.get(host.name)
        tc_lines = [" ".join(cmd[1:]) for port in host.ports for cmd in shape(
            port.intf, fabric.spec.host_rate_mbps, fabric.buffer_bytes(host.name), fabric.spec.mtu,
            delay_ms=fabric.spec.lab_delay_ms("host") if delay else 0.0)]
        script = host_setup_batch(host, fabric.spec.mtu, tc_lines)
        node.sendCmd("(set -e\n" + script + "\n) 2>&1; echo __rc=$?")
        started.append((host, node))
    for host, node in started:
        _check_output(node, node.waitOutput(), "host set-up")
        # Tell Mininet the addresses we configured (bookkeeping only), so its own commands
        # (`pingall`, `h1 ping h2`) know them.
        for port in host.ports:
            intf = node.nameToIntf[port.intf]
            intf.ip, intf.prefixLen, intf.mac = port.ip, 32, port.mac


MAX_CROSSING = 0xFFF


def vxlan_id(group, index):
    """The VXLAN network id of a run's `index`th cable between machines: from its link group, so
    two runs between the same machines rarely meet (the kernel refuses a duplicate if they do)."""
    if index >= MAX_CROSSING:
        raise LabError(f"more than {MAX_CROSSING} cables cross machines; split the fabric another way")
    return (group & 0xFFF) << 12 | (index + 1)


def _batch(argv, lines, what):
    """Feed many `ip`/`tc` commands to one process; the first failure is reported."""
    proc = subprocess.run(argv, input="\n".join(lines) + "\n", capture_output=True, text=True)
    if proc.returncode != 0:
        first = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[0]
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


def set_delay(net, node_name, intf, delay_ms):
    """Change the netem delay at the root of one port (a latency fault, or its end)."""
    node = net.get(node_name)
    out = node.cmd(" ".join(delay_change_command(intf, delay_ms)) + "; echo __rc=$?")
    _check_output(node, out, f"changing the delay of {intf}")


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
