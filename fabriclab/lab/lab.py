"""A running lab: spec -> fabric -> Mininet + OVS -> controller app, with one owner for teardown.

    with Lab(load_spec("default"), routing="ecmp") as lab:
        lab.link_down("l1", "s1")
        ...

Bring-up validates everything it can before creating anything (spec, app name, root, Open vSwitch,
free names), records each resource before making it, and tears everything down on any exit: an
exception, Ctrl-C, or SIGTERM (turned into an exception so `finally` runs). SIGKILL leaves the run
record for `fabriclab clean`.
"""

from __future__ import annotations

import functools
import math
import signal
import sys
import threading
import time

from fabriclab.loading import excerpt
from fabriclab.system import doctor

from fabriclab.lab import linkloss
from fabriclab.system.doctor import require_environment
from fabriclab.apps import DEFAULT_ROUTING, control, select_stage
from fabriclab.apps.paths import all_paths, ar_groups
from fabriclab.lab.controller import Controller, check_app, retarget
from fabriclab.errors import LabError, Terminated
from fabriclab.queues.agentproc import MODULE as PFC_AGENT_MODULE
from fabriclab.queues.datapath import remove_pins
from fabriclab.queues.config import SWITCH_ROLES
from fabriclab.queues.config import check_cut
from fabriclab.queues.model import QueueModel
from fabriclab.lab.runstate import RunState
from fabriclab.system.procs import stop_recorded
from fabriclab.lab import network as mininet_net
from fabriclab.topologies.fabric import MAX_LAB_NODES, Fabric, beyond_one_machine
from fabriclab.topologies.split import Split
from fabriclab.topologies.spec import MAX_LAB_DELAY_MS, FabricSpec

# Processes of a run that its own teardown steps end (the controller, Mininet's shells, the SSH
# connections of a cluster, which its members' reports come back on); every
# other recorded one was started by a job inside a host.
_FABRIC_ROLES = frozenset({"controller", "controller-shell", "host-shell", "switch-shell", "ssh-master"})


def _one_at_a_time(method):
    """Run a method that changes the fabric under the lab's fault lock: the prompt, the web view's
    buttons and a fault timeline act from their own threads, and two changes interleaved (a link
    reshaped while a restore walks the same table) would leave the lab's record and the fabric
    disagreeing."""
    @functools.wraps(method)
    def locked(self, *args, **kwargs):
        with self._fault_lock:
            return method(self, *args, **kwargs)
    return locked


def _ovs_view(switches):
    """What Open vSwitch says of the switches that never reached the controller."""
    view = mininet_net.controller_connections(switches)
    return "; Open vSwitch: " + ", ".join(f"{name} {state}" for name, state in view.items()) if view else ""


class Lab:
    def __init__(self, spec, routing=DEFAULT_ROUTING, verbose=False, datapath=None, split=None, cluster=None):
        """`split` (a SplitSpec) and `cluster` (a fabriclab.system.spread.Spread, not yet connected:
        fabriclab.cluster.cluster.Cluster(machines), this machine first) spread the fabric over
        several machines (Mininet's cluster edition)."""
        if not isinstance(spec, FabricSpec):
            raise TypeError("Lab takes a FabricSpec (see fabriclab.topologies.spec.load_spec)")
        routing = check_app(routing)         # the edge: everything below gets the parsed Routing
        if split is None and cluster is None:
            too_big = beyond_one_machine(spec)     # from the spec's counts, before naming a port
            if too_big:
                raise LabError(too_big)
        self.fabric = Fabric(spec)
        self.split = self.machines = self.cluster = self._spread = None
        if split is not None or cluster is not None:
            self._plan_cluster(split, cluster)
        self.jobs = {}               # announced to the controller (jobs.json): name -> placement
        self._jobs_lock = threading.Lock()   # concurrent launchers announce and retract jobs
        self._fault_lock = threading.RLock()  # one change to the fabric at a time (_one_at_a_time)
        self.routing = routing
        self.verbose = verbose
        self.datapath = datapath
        self.run = None
        self.net = None
        self.controller = None
        self.queues = None           # the QueueModel when the spec has a queues: section
        # What marks ECN ("red" | "bpf-clsact"; "none" without the queue model) and what delays
        # links ("netem" | "none"), as chosen at start from what the kernel has.
        self.ecn_mechanism = "none"
        self.delay_mechanism = "none"
        self.warnings = []           # one line each, printed to stderr when the lab starts
        self.timings = {}
        self.events = []             # every fault and repair, timestamped (see _log)
        self._down = {}              # link key -> Link taken down through the lab
        self._lossy = {}             # link key -> (Link, fraction) with random loss
        self._reshaped = {}          # (link key, nodes) -> (Link, nodes, Mbit/s) shaped off the spec's rate
        self._cut = {}               # switch -> the fraction of its buffer a buffer fault left it
        self._latency = {}           # target label -> ([(node, intf, Link)], real us added) by latency faults
        self._old_sigterm = None

    def _plan_cluster(self, split, cluster):
        """Check a spread over machines before anything is built: one machine per part of the
        split, what runs across machines today, and each machine's share within one lab's bounds."""
        machines = cluster.machines if cluster is not None else None
        if split is None or not machines:
            raise LabError("a fabric over several machines needs both a split and the machines (an inventory)")
        self.split = Split(self.fabric, split)
        if len(machines) != split.machines:
            raise LabError(f"the split has {split.machines} machines and the inventory {len(machines)}; "
                           f"give one machine per part")
        for row in self.split.machines():
            if row["switches"] + row["hosts"] > MAX_LAB_NODES:
                raise LabError(f"machine {row['machine']} of the split would hold {row['switches'] + row['hosts']} "
                               f"switches and hosts; one machine's lab builds at most {MAX_LAB_NODES}")
        self.machines = list(machines)
        self._spread = cluster       # connected, and kept as self.cluster, when the lab starts

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self, timeout=60.0):
        require_environment()
        if self.datapath is None:
            self.datapath = "kernel" if doctor.ovs_datapath_type(doctor.probe()) == "system" else "user"
        spec = self.fabric.spec
        if spec.queues is not None or spec.has_delay:
            self._choose_kernel_mechanisms(doctor.mechanisms(doctor.probe()))
        if (self.machines is not None and spec.queues is not None
                and any(spec.queues.ecn_for(role).mode == "ar" for role in SWITCH_ROLES)):
            raise LabError("queues.ecn mode ar compares the queues of a switch's ports in one data "
                           "path: it runs on one machine's fabric only (no split)")
        mininet_net.check_free(self.fabric, RunState.all())
        self._old_sigterm = signal.signal(signal.SIGTERM, _raise_terminated)
        t0 = time.monotonic()
        try:
            self.run = RunState.create(self.fabric.spec.name)
            self.run.plan(*mininet_net.planned_resources(self.fabric))
            if self.machines is not None:
                self.cluster = self._spread
                self.cluster.connect(self.run)
                self.cluster.check_mtu(spec.mtu)
            self.controller = Controller(self.routing, self.fabric, self.run)
            if self.controller.foreign and self.machines is not None:
                raise LabError("an os-ken app of one's own or an external controller runs on one machine's "
                               "fabric only (no split)")
            self.controller.start()
            if self.cluster is not None:
                # the other machines' switches reach it over SSH: it listens on loopback only
                self.cluster.forward_controller(self.controller.port)
            self.net = mininet_net.new_network(self.controller.port, self.verbose, controller_ip=self.controller.listen)
            mininet_net.populate(self.net, self.fabric, self.run, self.datapath,
                                 delay=self.delay_mechanism == "netem", cluster=self.cluster,
                                 placement=self.split.machine_of if self.split else None)
            if self.fabric.spec.queues is not None:
                self.queues = self._start_queues()
                self._write_ar_groups()
            self.timings["build_s"] = time.monotonic() - t0
            self.controller.wait_programmed(timeout=timeout, explain=self._explain)
            if self.queues is not None:
                self._ensure_ovs_buffers()
            self.timings["up_s"] = time.monotonic() - t0
        except BaseException:
            self.stop()
            raise
        return self

    def record_pfc_agent(self, pid):
        self.run.add_process(pid, "pfc-agent", PFC_AGENT_MODULE)

    def _start_queues(self):
        if self.cluster is None:
            return QueueModel(self.fabric, self.net, self.run.id, ecn_mechanism=self.ecn_mechanism,
                              record=self.record_pfc_agent).start()
        tunnels = {intf.name: link.vni for link in self.net.links if getattr(link, "tunnel", None)
                   for intf in (link.intf1, link.intf2)}
        return self.cluster.queue_model(self.fabric, self.net, self.ecn_mechanism, tunnels)

    def _write_ar_groups(self):
        """The queue model's "ar" ECN mode marks a packet only when every port adaptive routing
        could have chosen for it is deep: its groups, from the routes, less the cables that are down."""
        if isinstance(self.queues, QueueModel):
            down = {intf for link in self._down.values() for intf in (link.a_intf, link.b_intf)}
            self.queues.set_ar_groups(ar_groups(self.fabric, down))

    def _ensure_ovs_buffers(self):
        """Only the userspace datapath transmits through one shared packet socket: where a
        machine switches in userspace, its OVS gets deeper socket buffers (queues/ovsbuf.py)."""
        if self.datapath == "user":
            self.queues.ensure_ovs_buffers()
        for name, peer in self.queues.peers.items():
            machine = next(m for m in self.cluster.machines if m.name == name)
            if machine.datapath == "user":
                # OVS opens its transmit socket on the first packet it forwards there
                here = next(h for h in self.fabric.hosts if self.cluster.machine_of_name(h).local)
                there = next((h for h in self.fabric.hosts if self.cluster.machine_of_name(h) is machine), None)
                if there is not None:
                    self.net.get(here).cmd(f"ping -c 1 -W 2 {self.fabric.hosts[there].ports[0].ip}")
                peer.ensure_ovs_buffers()

    def _explain(self, switches):
        """What Open vSwitch here says of switches that never reached the controller; a switch on
        another machine is named with its machine."""
        if self.cluster is None:
            return _ovs_view(switches)
        here = [s for s in switches if self.cluster.machine_of_name(s).local]
        there = [f"{s} ({self.cluster.machine_of_name(s).name})" for s in switches if s not in here]
        return (_ovs_view(here) if here else "") + (f"; on other machines: {', '.join(there)}" if there else "")

    def _choose_kernel_mechanisms(self, mechs):
        """ECN marking and link delay for this spec on this kernel (doctor's choices); a spec that
        insists on RED where there is none is refused, a delay the kernel cannot add is a warning."""
        spec = self.fabric.spec
        if spec.queues is not None:
            ecn = mechs["ecn"]
            marker = spec.queues.ecn_marker
            if marker == "red" and ecn.mechanism != "red":
                raise LabError(f"spec {excerpt(spec.name)}: queues.ecn.marker is red, but this kernel cannot mark "
                               f"with RED ({ecn.note}); use marker auto or bpf")
            self.ecn_mechanism = "red" if ecn.mechanism == "red" and marker != "bpf" else "bpf-clsact"
        if spec.has_delay:
            if mechs["delay"].mechanism == "netem":
                self.delay_mechanism = "netem"
            else:
                self.delay_mechanism = "none"
                self._warn(f"this kernel cannot delay links ({mechs['delay'].note}): spec {excerpt(spec.name)} "
                           f"runs without its delay: {self.delay_text()}; results record delay: none")

    def link_delay_ms(self, kind):
        """The one-way delay the lab puts on a `kind` ('host' | 'fabric') cable: the spec's, scaled
        to lab time, where the kernel has netem; 0 where it does not."""
        return self.fabric.spec.lab_delay_ms(kind) if self.delay_mechanism == "netem" else 0.0

    def delay_text(self):
        spec = self.fabric.spec
        return ", ".join(f"{kind} {getattr(spec.delay, kind + '_us'):g} us real = "
                         f"{spec.lab_delay_ms(kind):g} ms lab" for kind in ("host", "fabric"))

    def _warn(self, line):
        self.warnings.append(line)
        print(f"fabriclab: warning: {line}", file=sys.stderr)

    def stop(self):
        t0 = time.monotonic()
        try:
            if self.run is not None:
                # The jobs' agents first: a job thread that a Ctrl-C left behind (sleeping, or in a
                # telemetry read) may not reach its own kill before this process exits, and an
                # agent outlives its host's shell and keeps the namespace.
                stop_recorded([p for p in self.run.data["processes"] if p["role"] not in _FABRIC_ROLES])
            if self.queues is not None:
                self.queues.stop()
                self.queues = None
            if self.net is not None:
                mininet_net.stop(self.net, self.run.data["link_group"])
                self.net = None
            linkloss.close(self)             # the loss programs (their filters left with the veths)
            if self.cluster is not None:
                self.cluster.close()             # each other machine's member removes its part
                self.cluster = None
            if self.controller is not None:
                self.controller.stop()
                self.controller = None
            if self.run is not None:
                remove_pins(self.run.id)         # the routing stage's maps (the links are gone)
                self.run.remove()
                self.run = None
        finally:
            if self._old_sigterm is not None:
                signal.signal(signal.SIGTERM, self._old_sigterm)
                self._old_sigterm = None
        self.timings["down_s"] = time.monotonic() - t0

    # -- routing --------------------------------------------------------------------------------------
    @_one_at_a_time
    def set_routing(self, routing, timeout=30.0):
        """Replace the controller with another routing app (or the same with other options) on
        the live fabric. The switches keep forwarding on the old entries until the new app
        connects and rewrites them: on a port of its own, so they connect at once rather than when
        their reconnect backoff ends (a cluster keeps the port its SSH forwards lead to)."""
        routing = check_app(routing)
        old = self.controller
        if old.external or routing.external:
            if routing != self.routing:
                raise LabError("the switches' controller address is set when the fabric is built: an external "
                               "controller is neither swapped in nor out on a live fabric")
        old.stop()
        select_stage.detach(self.fabric)
        remove_pins(target=select_stage.pins_for(self.run.id))
        self.controller = Controller(routing, self.fabric, self.run, listen=old.listen)
        if self.cluster is not None:
            # the other machines' switches reach the controller's port through their SSH forward
            self.controller.port = old.port
        self.controller.start()
        if self.controller.port != old.port:
            retarget(self.fabric.switches, self.controller.listen, self.controller.port)
        self.routing = routing
        self.controller.wait_programmed(timeout=timeout, explain=self._explain)
        with self._jobs_lock:
            self._write_jobs()
        return self.controller.status()

    def stage_stats(self):
        """Counters of the E-ECMP/flowlet selection stage (None when the app has none)."""
        return select_stage.read_stats(self.run.id)

    def te_placement(self):
        """The TE app's last placement (te-placement.json), or None for other apps."""
        return control.read_placement(control.RunFiles(self.run.dir).te_placement)

    def announce_job(self, name, pairs, wait_s=5.0):
        """Tell the controller a job's placement: [(source ip, destination ip, bytes)]. The TE
        app places the job's flows before this returns (bounded by `wait_s`)."""
        with self._jobs_lock:
            self.jobs[name] = control.Job.of(pairs)
            self._write_jobs()
        self._wait_te(lambda jobs: name in jobs, wait_s)

    def retract_job(self, name):
        with self._jobs_lock:
            if self.jobs.pop(name, None) is not None and self.run is not None:
                self._write_jobs()

    def _write_jobs(self):
        control.write_jobs(control.RunFiles(self.run.dir).jobs, self.jobs)

    def _wait_te(self, predicate, wait_s):
        if self.controller is None or self.controller.app != "te":
            return
        self.controller.wait(lambda s: s.te is not None and predicate(s.te.jobs) and s.programmed,
                             wait_s, "the TE app to place the announced job")

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False

    # -- nodes and links --------------------------------------------------------------------------
    def host(self, name):
        if name not in self.fabric.hosts:
            raise LabError(f"no host {excerpt(name)} in fabric {excerpt(self.fabric.spec.name)} "
                           f"(hosts: h1..h{len(self.fabric.hosts)})")
        return self.net.get(name)

    def resolve_link(self, node1, node2, member=None):
        for node in (node1, node2):
            if node not in self.fabric.switches and node not in self.fabric.hosts:
                raise LabError(f"no node {excerpt(node)} in fabric {excerpt(self.fabric.spec.name)}")
        links = self.fabric.find_link(node1, node2, member)
        if not links:
            raise LabError(f"no link between {node1} and {node2}"
                           + (f" with member {member + 1}" if member is not None else ""))
        return links

    def set_link(self, node1, node2, up, member=None, wait=True, timeout=10.0):
        """Take the link(s) between two nodes down or up; wait for the controller to reprogram."""
        links = self.resolve_link(node1, node2, member)
        self.set_links(links, up, wait, timeout, f"{node1}-{node2}")
        return links

    @_one_at_a_time
    def set_links(self, links, up, wait=True, timeout=10.0, what="the links", event=None):
        """Take resolved Link objects down or up (logged); wait for the controller when asked."""
        before = self.controller.snapshot().generation
        # Only links that change state move the controller (bringing up an up link is a no-op).
        changed = [link for link in links if (link.key in self._down) == up]
        for link in links:
            if up and self.queues is not None and link.key in self._down:
                self.queues.empty_queues((link.a_intf, link.b_intf))
            if self.queues is not None and (link.key in self._down) == up:
                self.queues.cables_down((link.a_intf, link.b_intf), not up)
            mininet_net.set_link(self.net, link, up, self.fabric)
            if up:
                self._down.pop(link.key, None)
            else:
                self._down[link.key] = link
        if changed and self.queues is not None:
            self._write_ar_groups()
        self._log(*(event or ("link_up" if up else "link_down", ", ".join(link.label for link in links))))
        keys = {link.key for link in changed if link.kind == "fabric"}
        if not (wait and keys) or self.controller.foreign:       # an os-ken app of one's own says nothing
            return

        def settled(status):
            return (status.programmed and status.generation > before
                    and (keys.isdisjoint(status.down_links) if up else keys <= status.down_links))
        self.controller.wait(settled, timeout, f"the controller to see {what} {'up' if up else 'down'}")

    def set_rate(self, node1, node2, rate_mbps, member=None):
        """Shape the link(s) between two nodes to rate_mbps (a degraded link); None restores the
        spec's rate. Routing does not change: a degraded link stays up, as a flaky optic does."""
        return self.reshape_links(self.resolve_link(node1, node2, member), rate_mbps)

    @_one_at_a_time
    def reshape_links(self, links, rate_mbps):
        """Shape resolved Link objects to rate_mbps (None: the spec's rate), logged."""
        if rate_mbps is not None and (isinstance(rate_mbps, bool) or not rate_mbps > 0):
            raise LabError(f"rate must be > 0 Mbit/s, got {excerpt(rate_mbps)}")
        for link in links:
            self._reshape(link, rate_mbps)
        self._log("degrade" if rate_mbps else "restore_rate", ", ".join(link.label for link in links),
                  rate_mbps=rate_mbps)
        return links

    def _reshape(self, link, rate_mbps, nodes=None):
        mininet_net.set_rate(self.net, link, rate_mbps or link.rate_mbps, self.fabric.spec.mtu, nodes)
        key = (link.key, nodes)
        if rate_mbps:
            self._reshaped[key] = (link, nodes, rate_mbps)
        else:
            self._reshaped.pop(key, None)

    @_one_at_a_time
    def prepare_loss(self, links):
        """Load the loss programs `links` will need on every machine, changing nothing: a timed
        loss fault is then not late by a first load (seconds on another machine)."""
        linkloss.load(self, links)

    @_one_at_a_time
    def set_loss(self, links, fraction):
        """Drop `fraction` of the packets at random in both directions of resolved Link objects
        (a BPF drop on each sending port, fabriclab.lab.linkloss); 0 ends it. Logged; `restore` ends it."""
        linkloss.set_loss(self, links, fraction)
        for link in links:
            if fraction:
                self._lossy[link.key] = (link, fraction)
            else:
                self._lossy.pop(link.key, None)
        self._log("loss" if fraction else "restore_loss", ", ".join(link.label for link in links),
                  fraction=fraction or None)
        return links

    @_one_at_a_time
    def slow_receiver(self, host, fraction):
        """Limit what a host's NICs receive to `fraction` of their rate (a slow receiver: the leaf
        port towards each NIC is shaped down); None or 1 restores it."""
        self.host(host)
        if fraction is not None and (isinstance(fraction, bool) or not 0 < fraction <= 1):
            raise LabError(f"slow receiver fraction must be in (0, 1], got {excerpt(fraction)}")
        restore = fraction is None or fraction == 1
        for port in self.fabric.hosts[host].ports:
            link = next(k for k in self.fabric.host_links if k.a_intf == port.intf)
            self._reshape(link, None if restore else link.rate_mbps * fraction, nodes=(link.b,))
        self._log("restore_receiver" if restore else "slow_receiver", host, fraction=fraction)

    @_one_at_a_time
    def set_switch(self, name, up, wait=True, timeout=10.0):
        """Fail a switch (every cable on it goes down at once, as a power loss would) or bring it
        back. A failed leaf cuts its hosts off."""
        if name not in self.fabric.switches:
            raise LabError(f"no switch {excerpt(name)} in fabric {excerpt(self.fabric.spec.name)}")
        links = [link for link in self.fabric.links if name in (link.a, link.b)]
        self.set_links(links, up, wait, timeout, f"switch {name}", ("switch_up" if up else "switch_down", name))
        return links

    @_one_at_a_time
    def cut_buffer(self, switch, fraction):
        """A buffer fault (seed 000, 6.4.2): every port of `switch` queues at most `fraction` of
        its buffer per class, and tail-drops the rest, the lossless class too; None or 1 restores
        the whole buffer. Needs the queue model. Logged; `restore` ends it. Returns the ports."""
        fraction = 1.0 if fraction is None else check_cut(fraction)
        if switch not in self.fabric.switches:
            raise LabError(f"no switch {excerpt(switch)} in fabric {excerpt(self.fabric.spec.name)}")
        if self.queues is None:
            raise LabError(f"a buffer fault cuts the queue model's buffers; spec {excerpt(self.fabric.spec.name)} "
                           f"has no queues: section")
        ports = self.queues.cut_buffer(switch, fraction)
        if fraction < 1:
            self._cut[switch] = fraction
        else:
            self._cut.pop(switch, None)
        self._log("buffer_cut" if fraction < 1 else "restore_buffer", switch,
                  fraction=fraction if fraction < 1 else None)
        return ports

    def latency_ports(self, target):
        """The ports a latency fault on `target` delays: a switch's name (each port it sends
        from: its port-to-port latency), or resolved Link objects (both ends: each way once), as
        [(node, interface, Link)]. LabError in one line, without touching the fabric, for a
        target the fabric lacks, a kernel without netem or a cable without a delay stage."""
        if isinstance(target, str):
            if target not in self.fabric.switches:
                raise LabError(f"no switch {excerpt(target)} in fabric {excerpt(self.fabric.spec.name)} "
                               f"(a latency fault takes a switch or a link)")
            ports = [(target, link.a_intf if link.a == target else link.b_intf, link)
                     for link in self.fabric.links if target in (link.a, link.b)]
        else:
            ports = [(node, intf, link) for link in target
                     for node, intf in ((link.a, link.a_intf), (link.b, link.b_intf))]
        spec = self.fabric.spec
        mechanism = self.delay_mechanism if self.net is not None else \
            doctor.mechanisms(doctor.probe())["delay"].mechanism
        if mechanism != "netem":
            raise LabError("a latency fault changes each port's netem delay, and this kernel has no netem "
                           "(`fabriclab doctor`: link delay); run it on a full kernel (the VM, the full-kernel tier)")
        bare = sorted({link.kind for _n, _i, link in ports if not spec.lab_delay_ms(link.kind) > 0})
        if bare:
            raise LabError(f"spec {excerpt(spec.name)} gives its {' and '.join(bare)} cables no delay: stage, so "
                           f"they have no netem delay to change; give them one (delay: {{{bare[0]}: 0.1}})")
        return ports

    @_one_at_a_time
    def set_latency(self, target, added_us):
        """A latency fault (seed 000, 6.4.1: a switch image that raised port-to-port latency):
        every packet crossing `target` (a switch's name, or resolved Link objects) waits
        `added_us` microseconds more, in the real fabric's time, stretched by the time scale as
        the spec's `delay:` is. The netem delay of each port is changed in place (tc qdisc
        change); 0 or None ends it. Logged; `restore` ends it. Returns the interfaces changed."""
        if added_us is not None and (isinstance(added_us, bool) or not isinstance(added_us, (int, float))
                                     or not math.isfinite(added_us) or added_us < 0):
            raise LabError(f"a latency fault adds a delay in microseconds >= 0, got {excerpt(added_us)}")
        added_us = float(added_us or 0)
        ports = self.latency_ports(target)
        label = target if isinstance(target, str) else ", ".join(link.label for link in target)
        scale = self.fabric.spec.time_scale
        latency = dict(self._latency)
        if added_us:
            latency[label] = (ports, added_us)
        else:
            latency.pop(label, None)
        delays = _port_delays(latency, scale)
        for node, intf, link in ports:
            total = self.fabric.spec.lab_delay_ms(link.kind) + delays.get(intf, 0.0)
            if total > MAX_LAB_DELAY_MS:
                raise LabError(f"{intf}: {added_us:g} us more is {total:.0f} ms of lab delay at x{scale:g}; "
                               f"at most {MAX_LAB_DELAY_MS:.0f} ms")
        for node, intf, link in ports:
            mininet_net.set_delay(self.net, node, intf, self.fabric.spec.lab_delay_ms(link.kind) + delays.get(intf, 0.0))
        self._latency = latency
        self._log("latency" if added_us else "restore_latency", label,
                  added_us=added_us or None, lab_ms=round(added_us * scale / 1000, 4) if added_us else None)
        return [intf for _node, intf, _link in ports]

    @_one_at_a_time
    def restart_controller(self, timeout=30.0):
        """Stop the controller app and start it again (a controller crash and restart). The
        switches keep forwarding on their entries meanwhile (fail mode secure). Returns the
        seconds until the new app had programmed the fabric."""
        t0 = time.monotonic()
        self._log("controller_stop", self.controller.app)
        self.set_routing(self.routing, timeout)
        took = time.monotonic() - t0
        self._log("controller_programmed", self.controller.app, took_s=round(took, 3))
        return took

    def fault_state(self):
        """The faults in place now, for restore(to=...): links down, links reshaped, lossy links."""
        with self._fault_lock:
            return {"down": dict(self._down), "reshaped": dict(self._reshaped), "lossy": dict(self._lossy),
                    "cut": dict(self._cut), "latency": dict(self._latency)}

    @_one_at_a_time
    def restore(self, wait=True, timeout=10.0, to=None):
        """Undo the faults made through the lab: every one (links up, rates back to the spec, no
        loss), or, given `to` (a fault_state()), only what changed since that state was taken,
        putting back what was in place then (a run on a fabric someone has broken by hand)."""
        to = to or {"down": {}, "reshaped": {}, "lossy": {}}
        for switch, fraction in list(self._cut.items()):
            if switch not in to.get("cut", {}):
                self.cut_buffer(switch, None)
        for switch, fraction in to.get("cut", {}).items():
            if self._cut.get(switch) != fraction:
                self.cut_buffer(switch, fraction)
        for label, (ports, _us) in list(self._latency.items()):
            if label not in to.get("latency", {}):
                self.set_latency(_latency_target(label, ports), None)
        for label, (ports, us) in to.get("latency", {}).items():
            if self._latency.get(label, (None, None))[1] != us:
                self.set_latency(_latency_target(label, ports), us)
        for key, (link, nodes, _rate) in list(self._reshaped.items()):
            if key not in to["reshaped"]:
                self._reshape(link, None, nodes)
        for key, (link, nodes, rate) in to["reshaped"].items():
            if self._reshaped.get(key, (None, None, None))[2] != rate:
                self._reshape(link, rate, nodes)
        lift = [link for key, (link, _f) in self._lossy.items() if key not in to["lossy"]]
        if lift:
            self.set_loss(lift, 0)
        for key, (link, fraction) in to["lossy"].items():
            if self._lossy.get(key, (None, None))[1] != fraction:
                self.set_loss([link], fraction)
        up = [link for key, link in self._down.items() if key not in to["down"]]
        if up:
            self.set_links(up, True, wait, timeout, "the restored links")
        down = [link for key, link in to["down"].items() if key not in self._down]
        if down:
            self.set_links(down, False, wait, timeout, "the links that were down before")

    def injected(self):
        """What the lab's faults changed and has not yet repaired: links down, links reshaped."""
        # Read without the fault lock (the live view asks twice a second, and a change may wait
        # seconds for the controller): copies taken in one step each, never a table mid-walk.
        down, reshaped, lossy = list(self._down.values()), list(self._reshaped.values()), list(self._lossy.values())
        cut, latency = list(self._cut.items()), list(self._latency.items())
        return {"links_down": sorted(link.label for link in down),
                "buffer_cuts": sorted(f"{switch} ({fraction:g})" for switch, fraction in cut),
                "latency": sorted(f"{label} (+{us:g} us)" for label, (_ports, us) in latency),
                "reshaped": sorted(f"{link.label}" + (f" ({', '.join(nodes)} end)" if nodes else "")
                                   for link, nodes, _rate in reshaped),
                "lossy": sorted(f"{link.label} ({fraction:g})" for link, fraction in lossy)}

    def _log(self, event, target, **detail):
        self.events.append({"time": time.time(), "event": event, "target": target,
                            **{k: v for k, v in detail.items() if v is not None}})

    def link_down(self, node1, node2, member=None, **kw):
        return self.set_link(node1, node2, False, member, **kw)

    def link_up(self, node1, node2, member=None, **kw):
        return self.set_link(node1, node2, True, member, **kw)

    def flap(self, node1, node2, count=1, down_s=1.0, up_s=1.0, member=None):
        """Down then up, `count` times; returns the controller's reaction times per transition."""
        reactions = []
        for _ in range(count):
            for up, hold in ((False, down_s), (True, up_s)):
                t0 = time.monotonic()
                self.set_link(node1, node2, up, member)
                reactions.append({"up": up, "reprogrammed_s": time.monotonic() - t0})
                time.sleep(hold)
        return reactions

    def down_links(self):
        return set(self.controller.snapshot().down_links)

    def paths(self, src, dst):
        """Equal-cost paths between two host ports (by host, address or interface name)."""
        a, b = self.fabric.host_port(src), self.fabric.host_port(dst)
        for ref, port in ((src, a), (dst, b)):
            if port is None:
                raise LabError(f"no host or host port {excerpt(ref)} in fabric {excerpt(self.fabric.spec.name)}")
        if a.plane != b.plane:
            return []
        return all_paths(self.fabric, a.leaf, b.leaf, frozenset(self.down_links()))

    def ping(self, src_port, dst_port, count=1, timeout_s=1):
        """True if `count` pings from one host port reach another (source bound to the port)."""
        node = self.net.get(src_port.host)
        out = node.cmd(f"ping -n -q -c {count} -i 0.2 -W {timeout_s} -I {src_port.ip} {dst_port.ip}")
        return f"{count} received" in out or f" {count} packets received" in out


def _port_delays(latency, scale):
    """{interface: lab ms added} by every latency fault in place ({label: (ports, real us)})."""
    out = {}
    for ports, us in latency.values():
        for _node, intf, _link in ports:
            out[intf] = out.get(intf, 0.0) + us * scale / 1000.0
    return out


def _latency_target(label, ports):
    """What set_latency was given for `label`: a switch's name, or the links of its ports."""
    links = list({link.key: link for _node, _intf, link in ports}.values())
    return label if ports and all(node == label for node, _intf, _link in ports) else links


def _raise_terminated(signum, frame):
    raise Terminated("terminated by SIGTERM; fabric torn down")
