"""One fabric over several machines, through Mininet's cluster edition (mininet.examples.cluster).

Mininet's RemoteMixin runs a node's shell over SSH on another machine, and RemoteLink joins nodes
on two machines with a tunnel. The lab extends both rather than writing a second cluster:

- `ClusterNode` (a RemoteMixin) reaches a machine with the ssh options of the lab's inventory, as
  root, through one SSH connection per machine that the lab owns (a foreground ControlMaster), never
  through `sudo` (Mininet's default, which lab machines need not have).
- `VxlanLink` (a RemoteLink) makes a cable between machines a VXLAN tunnel over the cluster's
  private network (Mininet's own choices: `ssh -w` carries 1.3 Mbit/s into a TCG guest; gretap is
  missing from some kernels). Both ends are created in their machine's root namespace, in the
  run's link group, and a host's end moves into the host's namespace (the tunnel's socket stays
  in the root namespace). A cable within one machine is the lab's veth pair, as on one machine.
- `Member`: on every other machine, a process of the lab's own (fabriclab.lab.member) keeps that
  machine's part of the run on record while the run lives and removes it when the run's SSH
  connection ends, however it ends.

`Machine` is one machine of an inventory: its name, the address of its private network (where the
tunnels and the controller's OpenFlow go, never every interface), and how to reach it.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import re
import shlex
import subprocess
import threading
import time

from mininet.examples.cluster import RemoteLink, RemoteMixin
from mininet.node import Host

from fabriclab.errors import LabError
from fabriclab.loading import excerpt
from fabriclab.system.fleet import VXLAN_OVERHEAD

VXLAN_PORT = 4789
MEMBER_MODULE = "fabriclab.lab.member"
CONNECT_TIMEOUT_S = 120.0
# The ssh options an inventory may give (ansible_ssh_common_args): how to authenticate and whom to
# trust, nothing that runs a command (ProxyCommand, LocalCommand) or forwards anything.
SSH_OPTIONS = {"userknownhostsfile", "stricthostkeychecking", "identitiesonly", "identityfile", "batchmode",
               "connecttimeout", "loglevel", "port", "serveraliveinterval", "serveralivecountmax"}
_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,252}")


class Machine:
    """One machine of the cluster: `local` (this one) or reached over SSH as `user@host`."""

    def __init__(self, name, private_ip, local=False, host=None, user="root", ssh_options=(), python=None):
        self.name, self.private_ip, self.local = name, private_ip, local
        self.host, self.user, self.python = host, user, python
        self.ssh_options = list(ssh_options)
        self.control_path = None          # set by Cluster.connect: the lab's own SSH connection
        self.datapath = None              # and the OVS datapath its switches use there

    @classmethod
    def from_hostvars(cls, name, hv):
        """A Machine from an inventory's host variables, each checked (the inventory is input)."""
        where = f"inventory machine {excerpt(name)}"
        ip = hv.get("fabriclab_private_ip")
        try:
            private = ipaddress.IPv4Address(ip if isinstance(ip, str) else "")
        except ValueError:
            raise LabError(f"{where}: fabriclab_private_ip must be the IPv4 address of its private network, "
                           f"got {excerpt(ip)}") from None
        if private.is_loopback or private.is_unspecified or private.is_multicast:
            raise LabError(f"{where}: fabriclab_private_ip {private} is not an address other machines reach")
        venv, project = hv.get("venv_dir"), hv.get("project_dir")
        python = f"{venv}/bin/python" if isinstance(venv, str) else f"{project}/.venv/bin/python"
        if hv.get("ansible_connection") == "local":
            return cls(name, str(private), local=True, python=python)
        host = hv.get("ansible_host", name)
        user = hv.get("ansible_user", "root")
        if not isinstance(host, str) or not _HOST.fullmatch(host):
            raise LabError(f"{where}: ansible_host must be a host name or address, got {excerpt(host)}")
        if not isinstance(user, str) or not _USER.fullmatch(user):
            raise LabError(f"{where}: ansible_user must be a user name, got {excerpt(user)}")
        options = _ssh_options(hv.get("ansible_ssh_common_args", ""), where)
        key = hv.get("ansible_ssh_private_key_file")
        if key is not None:
            if not isinstance(key, str) or not key.startswith("/"):
                raise LabError(f"{where}: ansible_ssh_private_key_file must be an absolute path, got {excerpt(key)}")
            options += ["-i", key]
        return cls(name, str(private), host=host, user=user, ssh_options=options, python=python)

    def ssh_argv(self, tty=False):
        """ssh to this machine through the lab's connection (once `Cluster.connect` made it)."""
        mux = ["-o", f"ControlPath={self.control_path}", "-o", "ControlMaster=no"] if self.control_path else []
        return ["ssh", "-q", *self.ssh_options, *mux, "-tt" if tty else "-T", f"{self.user}@{self.host}"]

    def run(self, command, stdin_text=None, timeout=120.0):
        """A shell command in this machine's root namespace, as root: CompletedProcess (text)."""
        argv = ["bash", "-c", command] if self.local else [*self.ssh_argv(), command]
        return subprocess.run(argv, input=stdin_text, capture_output=True, text=True, timeout=timeout,
                              stdin=None if stdin_text is not None else subprocess.DEVNULL)

    def __repr__(self):
        return f"Machine({self.name})"


def machines_from_inventory(path):
    """The machines of an ansible inventory, this one (ansible_connection=local) first."""
    from fabriclab.system.inventory import machines

    found = [Machine.from_hostvars(name, hv) for name, hv in machines(path)]
    here = [m for m in found if m.local]
    if len(here) != 1:
        raise LabError(f"a fabric over several machines runs from one of them: the inventory must name exactly one "
                       f"machine with ansible_connection=local (it names {len(here)})")
    return here + [m for m in found if not m.local]


def _ssh_options(text, where):
    """`-o Name=Value` pairs of the allowed names, and `-i PATH`; anything else refused."""
    if not isinstance(text, str):
        raise LabError(f"{where}: ansible_ssh_common_args must be a string")
    try:
        words = shlex.split(text)
    except ValueError:
        raise LabError(f"{where}: ansible_ssh_common_args cannot be split: {excerpt(text)}") from None
    options = []
    while words:
        flag = words.pop(0)
        value = words.pop(0) if words else None
        if flag == "-i" and value and value.startswith("/"):
            options += ["-i", value]
            continue
        name = (value or "").partition("=")[0].lower()
        if flag != "-o" or name not in SSH_OPTIONS:
            raise LabError(f"{where}: ssh option {excerpt(' '.join(filter(None, (flag, value))))} is not one "
                           f"the lab passes on (allowed: -i PATH, -o with {', '.join(sorted(SSH_OPTIONS))})")
        options += ["-o", value]
    return options


def _size(limit):
    return f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit} bytes"


# -- Mininet's cluster classes, with the lab's connection ------------------------------------------

class ClusterNode(RemoteMixin):
    """A RemoteMixin whose commands reach its machine through the lab's SSH connection as root."""

    def __init__(self, name, machine=None, **params):
        self.machine = machine
        super().__init__(name, server=machine.name, user=machine.user, serverIP=machine.private_ip, **params)

    def _popen(self, cmd, sudo=True, tt=True, **params):
        # RemoteMixin's own prefixes `sudo -E` and its `sudo -u user ssh`; the lab is root on both
        # ends. As there, the process leaves our process group: Ctrl-C here is the lab's to handle.
        if isinstance(cmd, str):
            cmd = cmd.split()
        if self.isRemote:
            cmd = self.machine.ssh_argv(tty=tt) + cmd
        params.update(preexec_fn=self._ignoreSignal)
        return super(RemoteMixin, self)._popen(cmd, **params)

    def addIntf(self, intf, port=None, moveIntfFn=None):
        # The lab makes every interface where it belongs (a veth's peer in its namespace, a tunnel
        # end moved by VxlanLink); Mininet's default mover would run `ip` on this machine.
        return super(RemoteMixin, self).addIntf(intf, port=port, moveIntfFn=lambda *_: True)


class ClusterHost(ClusterNode, Host):
    pass


def cluster_switch_class(base):
    """The lab's switch class (a tagged OVSSwitch) as a node of another machine."""
    return type("Cluster" + base.__name__, (ClusterNode, base), {})


class VxlanLink(RemoteLink):
    """A cable: a veth pair on one machine, a VXLAN tunnel between two (Mininet's RemoteLink with a
    tunnel the lab's kernels all have). Every interface joins the run's link group."""

    def __init__(self, node1, node2, group=None, vni=None, cluster=None, make_veth=None, **params):
        if group is None or cluster is None or make_veth is None:
            raise LabError("a cluster link needs the run's link group, its cluster and the veth maker")
        self.group, self.vni, self.cluster, self.make_veth = group, vni, cluster, make_veth
        super().__init__(node1, node2, **params)

    def makeIntfPair(self, intfname1, intfname2, addr1=None, addr2=None, node1=None, node2=None,
                     deleteIntfs=True):
        node1 = self.node1 if node1 is None else node1
        node2 = self.node2 if node2 is None else node2
        m1, m2 = self.cluster.machine_of_node(node1), self.cluster.machine_of_node(node2)
        if m1 is m2:
            return self.make_veth(self.group, intfname1, intfname2, addr1, addr2, node1, node2)
        self.tunnel = True
        for node, machine, peer, intf, mac in ((node1, m1, m2, intfname1, addr1), (node2, m2, m1, intfname2, addr2)):
            lines = [f"ip link add name {intf}{f' address {mac}' if mac else ''} group {self.group} "
                     f"type vxlan id {self.vni} local {machine.private_ip} remote {peer.private_ip} "
                     f"dstport {VXLAN_PORT} nolearning"]
            if node.inNamespace:
                lines.append(f"ip link set {intf} netns {node.pid}")
            self.cluster.root_run(machine, "\n".join(lines), f"the tunnel end {intf} on {machine.name}")
        return None

    def stop(self):
        # The run's teardown deletes its link group on every machine at once.
        self.tunnel = None


class Cluster:
    """The machines a fabric runs on (machine 1, this one, first) and the lab's SSH connections."""

    def __init__(self, machines, run):
        if not machines or not machines[0].local or any(m.local for m in machines[1:]):
            raise LabError("a cluster runs from its first machine: the inventory must have exactly one machine "
                           "with ansible_connection=local")
        self.machines = machines
        self.run = run
        self.masters = {}            # machine name -> ssh ControlMaster Popen
        self.members = {}            # machine name -> Member
        self.helpers = {}            # (machine name, key) -> a long-lived helper there (close())
        self._start_s = {}           # machine name -> seconds an agent takes to start there
        self._helpers_lock = threading.Lock()
        self._placed = {}            # node name -> Machine

    # -- connections ---------------------------------------------------------------------------
    def connect(self):
        """One SSH connection per other machine (every shell and tunnel command rides on it), and
        that machine's run member. Recorded before it starts, so `clean` ends what a kill left."""
        for machine in self.machines[1:]:
            machine.control_path = str(self.run.path(f"ssh-{machine.name[:24]}"))
            argv = ["ssh", "-q", *machine.ssh_options, "-o", f"ControlPath={machine.control_path}",
                    "-o", "ControlMaster=yes", "-o", "ControlPersist=no", "-N", f"{machine.user}@{machine.host}"]
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, start_new_session=True)
            self.run.add_process(proc.pid, "ssh-master", machine.control_path)
            self.masters[machine.name] = proc
            self._wait_master(machine, proc)
            # Its own kernel's datapath where it has Open vSwitch's module (userspace switching
            # polls, which a slow machine cannot spare), the userspace one otherwise.
            loaded = machine.run("test -d /sys/module/openvswitch", timeout=60).returncode == 0
            machine.datapath = "kernel" if loaded else "user"
            self.members[machine.name] = Member(machine, self.run)

    def _wait_master(self, machine, proc):
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                why = proc.stderr.read().decode(errors="replace").strip().splitlines()
                raise LabError(f"cannot reach machine {machine.name} over SSH ({machine.user}@{machine.host}): "
                               f"{(why or ['ssh exit ' + str(proc.returncode)])[-1][:200]}")
            check = subprocess.run(["ssh", "-o", f"ControlPath={machine.control_path}", "-O", "check",
                                    f"{machine.user}@{machine.host}"], capture_output=True, text=True)
            if check.returncode == 0:
                return
            time.sleep(0.2)
        raise LabError(f"cannot reach machine {machine.name} over SSH within {CONNECT_TIMEOUT_S:.0f} s")

    def agent_start_s(self, machine, module):
        """Seconds `module` takes to start on `machine` over the connection (SSH, that machine's
        Python, its imports), measured once: launchers that give their agents a common start time
        leave them this long (an emulated guest takes seconds, a real machine a fraction of one)."""
        if machine.name not in self._start_s:
            t0 = time.monotonic()
            proc = machine.run(shlex.join([machine.python, "-c", f"import {module}"]), timeout=300)
            if proc.returncode != 0:
                why = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
                raise LabError(f"machine {machine.name} cannot start {module}: {why[:200]}")
            self._start_s[machine.name] = time.monotonic() - t0
        return self._start_s[machine.name]

    def helper(self, machine, key, start):
        """The run's helper `key` on `machine` (an object with close()), made by `start()` on first
        use and closed with the cluster: the counter reader a snapshot or a live view asks."""
        with self._helpers_lock:
            if (machine.name, key) not in self.helpers:
                self.helpers[(machine.name, key)] = start()
            return self.helpers[(machine.name, key)]

    def close(self):
        """End the helpers, the members (each removes its machine's part of the run) and the
        connections."""
        with self._helpers_lock:
            helpers, self.helpers = list(self.helpers.values()), {}
        for helper in helpers:
            helper.close()
        for member in self.members.values():
            member.finish()
        self.members = {}
        for proc in self.masters.values():
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.masters = {}

    # -- placement -----------------------------------------------------------------------------
    def place(self, node_name, machine):
        self._placed[node_name] = machine

    def machine_of_node(self, node):
        return self._placed.get(node.name, self.machines[0])

    def root_run(self, machine, script, what, stdin_text=None):
        """Run `script` (shell lines, `set -e`) in `machine`'s root namespace as root, on its SSH
        connection; LabError with the last line it printed when it fails."""
        proc = machine.run("set -e\n" + script, stdin_text=stdin_text)
        if proc.returncode != 0:
            lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
            raise LabError(f"{what} failed on {machine.name}: {(lines or ['exit code ' + str(proc.returncode)])[-1][:200]}")

    def machine_of_name(self, name):
        """The Machine a node of the fabric runs on."""
        return self._placed.get(name, self.machines[0])

    def remote_machines(self, names):
        """The machines other than this one that the nodes `names` run on."""
        found = {self.machine_of_name(n).name: self.machine_of_name(n) for n in names}
        return [m for m in self.machines[1:] if m.name in found]

    def push(self, machine, path, text, remove=()):
        """Write `text` at `path` on `machine`: an agent's input goes to the same path there as here
        (the run's folder exists on every machine, made by its member). The files `remove` (an
        earlier run's outputs) go first, so a stale one is never read back for a new one."""
        gone = "".join(f"rm -f {shlex.quote(str(p))}; " for p in remove)
        self.root_run(machine, f"mkdir -p {shlex.quote(str(path.parent))}; {gone}cat > {shlex.quote(str(path))}",
                      f"copying {path.name}", stdin_text=text)

    def pull(self, machine, path, limit, binary=False):
        """The text (bytes if `binary`) of `path` on `machine` (an agent's output there), at most
        `limit` bytes. It travels as base64, so a binary file (a tensor) comes back unchanged."""
        where = f"copying {path.name} back from {machine.name}"
        proc = machine.run(f"set -o pipefail; head -c {int(limit) + 1} {shlex.quote(str(path))} | base64 -w0",
                           timeout=300)
        if proc.returncode != 0:
            why = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
            raise LabError(f"{where}: {why[:200]}")
        try:
            data = base64.b64decode(proc.stdout.strip(), validate=True)
        except ValueError:
            raise LabError(f"{where}: not what was sent") from None
        if len(data) > limit:
            raise LabError(f"{where}: larger than {_size(limit)}")
        if binary:
            return data
        try:
            return data.decode()
        except UnicodeDecodeError:
            raise LabError(f"{where}: not UTF-8 text") from None

    def forward(self, machine, socket_path):
        """Connections to the Unix socket `socket_path` on `machine` reach the same path here, over
        the lab's SSH connection (a collective's agents report to their launcher through it)."""
        self.root_run(machine, f"mkdir -p {shlex.quote(str(socket_path.parent))}; rm -f {shlex.quote(str(socket_path))}",
                      "making a forwarded socket's folder")
        self._forwarding("forward", machine, f"{socket_path}:{socket_path}", str(socket_path))

    def unforward(self, machine, socket_path):
        self._forwarding("cancel", machine, f"{socket_path}:{socket_path}", str(socket_path))
        self.root_run(machine, f"rm -f {shlex.quote(str(socket_path))}", "removing a forwarded socket")

    def forward_controller(self, port):
        """OpenFlow over the lab's SSH connections: every other machine's 127.0.0.1:`port` reaches
        this machine's, where the controller listens on loopback only. A switch there connects to
        the same address as one here, and its OpenFlow rides SSH, encrypted, on no open port."""
        for machine in self.machines[1:]:
            self._forwarding("forward", machine, f"127.0.0.1:{port}:127.0.0.1:{port}", f"the controller's port {port}")

    def _forwarding(self, op, machine, spec, what):
        proc = subprocess.run(["ssh", "-S", machine.control_path, "-O", op, "-R", spec,
                               f"{machine.user}@{machine.host}"], capture_output=True, text=True, timeout=60)
        if proc.returncode != 0 and op == "forward":
            raise LabError(f"cannot forward {what} from {machine.name}: "
                           f"{(proc.stderr.strip() or 'ssh exit ' + str(proc.returncode))[:200]}")

    def record(self, machine, **what):
        """Tell `machine`'s member of something the run made there (bridges, a process)."""
        if not machine.local:
            self.members[machine.name].send(what)

    def underlay_mtu(self, machine, peer):
        """The MTU of the interface `machine` reaches `peer`'s private address through."""
        proc = machine.run(f"dev=$(ip -o route get {peer.private_ip} | grep -o 'dev [^ ]*' | cut -d' ' -f2); "
                           "cat /sys/class/net/$dev/mtu", timeout=60)
        try:
            return int(proc.stdout.strip())
        except ValueError:
            raise LabError(f"machine {machine.name} has no route to {peer.name} ({peer.private_ip}): "
                           f"{(proc.stderr.strip() or 'no answer')[:200]}") from None

    def check_mtu(self, fabric_mtu):
        """A tunnel adds 50 bytes: the private network must carry the fabric's MTU plus that."""
        for machine in self.machines:
            for peer in self.machines:
                if peer is machine:
                    continue
                mtu = self.underlay_mtu(machine, peer)
                if mtu - VXLAN_OVERHEAD < fabric_mtu:
                    raise LabError(f"the private network from {machine.name} to {peer.name} has MTU {mtu}: a "
                                   f"tunnel through it carries {mtu - VXLAN_OVERHEAD} bytes, the fabric needs "
                                   f"{fabric_mtu}; set its MTU to at least {fabric_mtu + VXLAN_OVERHEAD}")


class Member:
    """This run's member on another machine: started over the lab's SSH connection, it records what
    the run makes there and removes it when its input ends (the run stopped, or was killed and its
    connection dropped)."""

    def __init__(self, machine, run):
        self.machine = machine
        command = shlex.join([machine.python, "-m", MEMBER_MODULE, "--run-id", run.id,
                              "--link-group", str(run.data["link_group"])])
        self.proc = subprocess.Popen([*machine.ssh_argv(), command], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)
        first = self.proc.stdout.readline().split()
        if first[:1] != ["ready"]:
            err = self.proc.stderr.read().strip().splitlines() if self.proc.poll() is not None else []
            raise LabError(f"machine {machine.name}: the lab's member did not start: "
                           f"{(err or first or ['no answer'])[-1][:200]}")
        self.pid = int(first[1])

    def send(self, what):
        self.proc.stdin.write(json.dumps(what) + "\n")
        self.proc.stdin.flush()

    def finish(self, timeout=60.0):
        """Close its input and wait for its report of what it removed."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.proc.stdout.read().strip()
