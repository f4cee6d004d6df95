"""Helpers for lab tests: what lab resources exist on this machine right now."""

import os
import subprocess

LAB_PROCESS_MARKS = ("mininet:", "fabriclab.apps.runner", "fabriclab.traffic.generator",
                     "fabriclab.traffic.agent", "fabriclab.traffic.verbs_agent")


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
