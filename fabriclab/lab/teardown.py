"""Removing a run's kernel and Open vSwitch resources in bulk.

Shared by a normal stop (topologies/mininet_net.py) and by `fabriclab clean`, and free of Mininet
so the CLI loads before Mininet is installed. Bulk operations matter: deleting interfaces one by
one costs the kernel an RCU grace period each, so a run's root-namespace interfaces share a link
group that one `ip link del group` removes in a single batch.
"""

import json
import subprocess

from fabriclab.lab.runstate import OVS_PID_KEY, OVS_RUN_KEY


def _ovs(*args):
    return subprocess.run(["ovs-vsctl", "--timeout=60", *args], capture_output=True, text=True)


def delete_link_group(group):
    """Delete every interface in a link group in one batched kernel operation."""
    subprocess.run(["ip", "link", "del", "group", str(group)], capture_output=True)


def delete_bridges(names):
    """Delete OVS bridges in one transaction. Their ports' veths are not deleted here, by name:
    they are in the run's link group (`delete_link_group`), and a name a bridge still lists after
    its veth went (a teardown killed half way) may since be someone else's interface."""
    names = list(names)
    if not names:
        return
    _ovs(*[arg for name in names for arg in ("--", "--if-exists", "del-br", name)])


def tagged_bridges():
    """{bridge: (run id, owner pid or None)} for every OVS bridge a fabriclab run created."""
    out = _ovs("--format=csv", "--data=bare", "--no-headings", "--columns=name,external_ids",
               "find", "Bridge", f"external_ids:{OVS_RUN_KEY}!=\"\"")
    bridges = {}
    for line in out.stdout.splitlines():
        name, _, ids = line.partition(",")
        tags = dict(item.partition("=")[::2] for item in ids.strip('"').split())
        if tags.get(OVS_RUN_KEY):
            pid = tags.get(OVS_PID_KEY, "")
            bridges[name] = (tags[OVS_RUN_KEY], int(pid) if pid.isdigit() else None)
    return bridges


def interfaces_in_group(group, names):
    """Those of `names` that exist in the root namespace and belong to link group `group`."""
    out = subprocess.run(["ip", "-j", "link", "show", "group", str(group)], capture_output=True, text=True)
    try:
        present = {link.get("ifname") for link in json.loads(out.stdout or "[]")}
    except ValueError:
        present = set()
    return [name for name in names if name in present]
