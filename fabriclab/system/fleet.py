"""Every lab machine of an inventory checked or cleaned from one place (`fabriclab doctor
--inventory`, `fabriclab clean --inventory`).

A machine is ready when it answers over SSH, runs the same lab (version and checkout commit) as
this machine, and its own doctor finds nothing required missing. What each machine sends back is
read as hostile: bounded, parsed, every field type-checked, quoted only as short excerpts.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field

from fabriclab import __version__
from fabriclab.loading import excerpt
from fabriclab.system.inventory import machines, run_everywhere
from fabriclab.system.provision import PROJECT_DIR
from fabriclab.table import format_table


def lab_identity():
    """{"version", "commit"} of the lab running here; commit None outside a git checkout."""
    commit = None
    try:
        proc = subprocess.run(["git", "-C", str(PROJECT_DIR), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10, stdin=subprocess.DEVNULL)
        if proc.returncode == 0 and len(proc.stdout.strip()) == 40:
            commit = proc.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    return {"version": __version__, "commit": commit}


def _describe(identity):
    commit = identity.get("commit")
    return f"{identity.get('version')}" + (f" at {commit[:10]}" if commit else "")


# What a tunnel between lab machines adds to a frame: outer Ethernet 14 + IPv4 20 + UDP 8 + VXLAN 8
# (a cable of a fabric split over machines: fabriclab.cluster.cluster).
VXLAN_OVERHEAD = 50


def local_addresses():
    """{IPv4 address: {"interface", "mtu"}} of this machine's root namespace (`doctor --format
    json` reports it, so `doctor --inventory` can check each machine's private address)."""
    try:
        proc = subprocess.run(["ip", "-j", "-4", "addr", "show"], capture_output=True, text=True, timeout=10,
                              stdin=subprocess.DEVNULL)
        links = json.loads(proc.stdout) if proc.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired, ValueError):
        links = []
    return {a["local"]: {"interface": link["ifname"], "mtu": link["mtu"]}
            for link in links if isinstance(link, dict)
            for a in link.get("addr_info", []) if isinstance(a, dict) and "local" in a}


@dataclass
class MachineCheck:
    machine: str
    kernel: str = "-"
    ovs: str = "-"
    lab: str = "-"
    private: str = "-"           # its private address, the interface it is on and that one's MTU
    problems: list = field(default_factory=list)

    @property
    def ready(self):
        return not self.problems

    @property
    def verdict(self):
        return "ready" if self.ready else "; ".join(self.problems)


def _text(value, limit=80):
    return value[:limit] if isinstance(value, str) else None


def judge(reply, here, private_ip=None):
    """A MachineCheck from one machine's Reply to `doctor --format json`; `here`: lab_identity();
    `private_ip`: the inventory's fabriclab_private_ip for it (checked to be its own)."""
    check = MachineCheck(reply.machine)
    if not reply.reached:
        check.problems.append(f"unreachable: {reply.message}")
        return check
    if reply.rc is None:
        check.problems.append(f"its doctor did not run: {reply.message}")
        return check
    try:
        doc = json.loads(reply.stdout)
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or not isinstance(doc.get("missing"), list) \
            or not isinstance(doc.get("capabilities"), dict):
        tail = (reply.stderr.strip().splitlines() or [reply.stdout.strip()[:60]])[-1]
        check.problems.append(f"its doctor exited {reply.rc} without a report: {excerpt(tail)}")
        return check
    caps = doc["capabilities"]
    check.kernel = _text(caps.get("kernel")) or "-"
    check.ovs = _text(caps.get("ovs_version")) or "not running"
    lab = doc.get("lab")
    if isinstance(lab, dict) and isinstance(lab.get("version"), str) \
            and (lab.get("commit") is None or isinstance(lab.get("commit"), str)):
        theirs = {"version": _text(lab["version"], 40), "commit": _text(lab.get("commit"), 40)}
        check.lab = _describe(theirs)
        same = theirs["version"] == here["version"] and (
            theirs["commit"] is None or here["commit"] is None or theirs["commit"] == here["commit"])
        if not same:
            check.problems.append(f"runs lab {check.lab}, this machine {_describe(here)}")
    else:
        check.problems.append("its lab is too old to say its version (update its checkout)")
    missing = [excerpt(m) if not isinstance(m, str) else m[:60] for m in doc["missing"][:20]]
    if missing:
        check.problems.append("lacks " + ", ".join(missing))
    if private_ip is not None:
        _judge_private(check, doc.get("addresses"), private_ip)
    return check


def _judge_private(check, addresses, private_ip):
    """Its private address must be one of its own; its interface's MTU says which fabric MTU a
    tunnel between machines carries (VXLAN takes 50 bytes)."""
    if not isinstance(addresses, dict):
        return                                   # an older lab that does not report them
    where = addresses.get(private_ip) if isinstance(private_ip, str) else None
    if not isinstance(where, dict):
        check.private = excerpt(private_ip)
        check.problems.append(f"fabriclab_private_ip {excerpt(private_ip)} is not one of its addresses")
        return
    mtu = where.get("mtu")
    if not isinstance(mtu, int) or isinstance(mtu, bool):
        check.problems.append("its private interface reports no MTU")
        return
    check.private = (f"{private_ip} on {_text(where.get('interface'), 15) or '?'}, MTU {mtu}: "
                     f"fabrics up to MTU {mtu - VXLAN_OVERHEAD}")


def check_machines(inventory):
    """[MachineCheck] for every lab machine of `inventory`, in its order."""
    here = lab_identity()
    found = machines(inventory)
    private = {name: hv.get("fabriclab_private_ip") for name, hv in found}
    return [judge(reply, here, private.get(reply.machine)) for reply in run_everywhere(inventory, "doctor", found)]


def render_checks(checks):
    rows = [(c.machine, c.kernel, c.ovs, c.lab, c.private, c.verdict) for c in checks]
    return format_table(("machine", "kernel", "Open vSwitch", "lab", "private network", "verdict"), rows)


def clean_machines(inventory, all_runs=False):
    """[(machine, ok, lines)]: what `clean` removed on every lab machine, or why it could not."""
    out = []
    for reply in run_everywhere(inventory, "clean-all" if all_runs else "clean"):
        if not reply.reached:
            out.append((reply.machine, False, [f"unreachable: {reply.message}"]))
        elif reply.rc is None:
            out.append((reply.machine, False, [f"clean did not run: {reply.message}"]))
        elif reply.rc != 0:
            why = (reply.stderr.strip().splitlines() or [reply.message or f"exit {reply.rc}"])[-1]
            out.append((reply.machine, False, [f"clean failed: {excerpt(why)}"]))
        else:
            lines = [line[:200] for line in reply.stdout.strip().splitlines()[:200]]
            out.append((reply.machine, True, lines or ["nothing to clean"]))
    return out
