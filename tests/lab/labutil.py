"""Helpers for lab tests: what lab resources exist on this machine right now."""

import os
import signal
import subprocess

LAB_PROCESS_MARKS = ("mininet:", "fabriclab.apps.runner", "fabriclab.traffic.generator",
                     "fabriclab.traffic.agent", "fabriclab.traffic.verbs_agent", "fabriclab.queues.agentproc")


def sigint_as_at_a_terminal():
    """preexec_fn for a command a test interrupts with SIGINT: a shell that starts a job in the
    background without job control (as a CI runner may start this suite) sets SIGINT to ignored,
    the child inherits that and Python keeps it, so the command would never see the signal."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def bridges():
    out = subprocess.run(["ovs-vsctl", "--timeout=10", "list-br"], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def veths():
    out = subprocess.run(["ip", "-o", "link", "show", "type", "veth"], capture_output=True, text=True)
    return {line.split(":")[1].strip().split("@")[0] for line in out.stdout.splitlines() if ":" in line}


def net_namespaces():
    """Inodes of every network namespace some process is in (Mininet's are anonymous)."""
    spaces = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                spaces.add(os.readlink(f"/proc/{pid}/ns/net"))
            except OSError:
                pass
    return spaces


def lab_processes():
    procs = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(mark in cmd for mark in LAB_PROCESS_MARKS):
            procs.append((int(pid), cmd.strip()))
    return procs


def resources():
    return {"bridges": bridges(), "veths": veths(), "netns": net_namespaces(),
            "processes": {p for p, _ in lab_processes()}}


def leaked(before, after):
    """What exists after that did not before, per kind (empty dict: nothing leaked)."""
    return {kind: sorted(after[kind] - before[kind]) for kind in before if after[kind] - before[kind]}


# -- the queue model's counters, for queue tests -------------------------------------------------

def queue_snapshot(lab):
    """Every (port, class) row of the queue model's counters, keyed by (port, class)."""
    return {(r["port"], r["class"]): r for r in lab.queues.counters()}


def queue_delta(after, before, field):
    """How much `field` moved between two snapshots, for the rows where it moved."""
    return {key: after[key].get(field, 0) - before[key].get(field, 0) for key in after
            if after[key].get(field, 0) != before[key].get(field, 0)}


def port_towards(lab, host):
    """The leaf port cabled to `host`'s first NIC."""
    intf = lab.fabric.hosts[host].ports[0].intf
    return lab.queues.ports[lab.queues.by_name[intf].peer].name


def unreachable(lab, same_nic=False):
    """(pairs tried, [(intf, intf)] that did not answer a ping): every host port to every port of
    another host (only the same NIC index, a rail's peers, with same_nic)."""
    ports = [p for host in lab.fabric.hosts.values() for p in host.ports]
    pairs = [(a, b) for a in ports for b in ports
             if a.host != b.host and (not same_nic or a.nic == b.nic)]
    return len(pairs), [(a.intf, b.intf) for a, b in pairs if not lab.ping(a, b)]
