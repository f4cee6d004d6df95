"""The machines one fabric runs on and the lab's connections to them (Mininet's cluster edition).

`Cluster(machines)` is handed to `Lab(spec, split=..., cluster=...)`; the lab calls `connect(run)`
as it starts, which opens one SSH connection per other machine (every shell and tunnel command
rides on it) and starts the run's member there (member.py), which removes that machine's part of
the run when the connection ends, however it ends.

The lab, the measurements and the traffic engine below never import this folder: they receive the
Cluster and call it through the methods fabriclab.system.spread.Spread names (the node classes to
build with, the queue model, loss stage, counter reader and port sampler across machines).
"""

from __future__ import annotations

import base64
import shlex
import subprocess
import threading
import time

from fabriclab.cluster import remotecounters, remoteloss, remotequeues, remotesampler
from fabriclab.cluster.member import Member
from fabriclab.cluster.nodes import ClusterHost, VxlanLink, cluster_switch_class
from fabriclab.errors import LabError
from fabriclab.system.fleet import VXLAN_OVERHEAD

CONNECT_TIMEOUT_S = 120.0


def _size(limit):
    return f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit} bytes"


class Cluster:
    """The machines a fabric runs on (machine 1, this one, first) and the lab's SSH connections."""

    def __init__(self, machines):
        machines = list(machines)
        if not machines or not machines[0].local or any(m.local for m in machines[1:]):
            raise LabError("a cluster runs from its first machine: the inventory must have exactly one machine "
                           "with ansible_connection=local")
        self.machines = machines
        self.run = None              # the run it serves, from connect()
        self.masters = {}            # machine name -> ssh ControlMaster Popen
        self.members = {}            # machine name -> Member
        self.helpers = {}            # (machine name, key) -> a long-lived helper there (close())
        self._start_s = {}           # (machine name, module) -> seconds it takes to start there
        self._helpers_lock = threading.Lock()
        self._placed = {}            # node name -> Machine

    # -- connections ---------------------------------------------------------------------------
    def connect(self, run):
        """One SSH connection per other machine (every shell and tunnel command rides on it), and
        that machine's run member, for `run` (a RunState). Recorded before it starts, so `clean`
        ends what a kill left."""
        if self.run is not None:
            raise LabError("a cluster serves one run at a time: make a new Cluster for another lab")
        self.run = run
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
        key = (machine.name, module)
        if key not in self._start_s:
            t0 = time.monotonic()
            proc = machine.run(shlex.join([machine.python, "-c", f"import {module}"]), timeout=300)
            if proc.returncode != 0:
                why = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
                raise LabError(f"machine {machine.name} cannot start {module}: {why[:200]}")
            self._start_s[key] = time.monotonic() - t0
        return self._start_s[key]

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
        self.run = None

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

    # -- what the layers below call (fabriclab.system.spread.Spread) -----------------------------
    host_class = ClusterHost
    link_class = VxlanLink

    def switch_class(self, base):
        """The lab's switch class as a node of another machine."""
        return cluster_switch_class(base)

    def member_pid(self, machine):
        """The pid of the run's member on `machine` (it owns what the run makes there)."""
        return self.members[machine.name].pid

    def queue_model(self, fabric, net, ecn_mechanism, tunnels):
        """The queue model across every machine: this one's, with the others' as its peers."""
        return remotequeues.model_across(fabric, net, self.run, self, self.machine_of_name, ecn_mechanism, tunnels)

    def loss_stage(self, machine):
        """The run's loss stage on `machine` (random loss on the ports there)."""
        return remoteloss.stage_on(self, machine, self.run.id)

    def loss_counters(self):
        """{(node, intf): (dropped, passed)} of every other machine's loss stage."""
        return remoteloss.counters(self)

    def read_counters(self, machine, pairs, drops=False, states=False):
        """One reading of `pairs` [(intf, counter)] on `machine`, by the run's counter reader there."""
        return remotecounters.read(self, machine, pairs, drops, states)

    def read_counters_all(self, by_machine, drops=False):
        """{machine name: reading} for {machine name: (Machine, pairs)}, the machines read at once."""
        return remotecounters.read_all(self, by_machine, drops)

    def clock_offset_s(self, machine):
        """`machine`'s wall clock minus this one's, s."""
        return remotecounters.clock_offset_s(self, machine)

    def port_sampler(self, machine, pairs, interval_s):
        """A sampler of `pairs` on `machine` every `interval_s`, recorded with the run's member."""
        def record(pid):
            self.record(machine, process={"pid": pid, "role": "port-sampler", "match": remotesampler.MODULE})
        return remotesampler.RemoteSampler(machine, pairs, interval_s, record)
