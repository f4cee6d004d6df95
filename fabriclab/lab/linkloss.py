"""Random packet loss on a live lab's links, both ends of each on the machine it runs on.

A link loses in both directions: each sending end drops a share of what leaves it (portloss.py).
An end on this machine is set here; one on another machine of a cluster is set there, by the
run's loss stage on it (fabriclab/cluster/remoteloss.py), so a cable between two machines loses at both ends.
"""

from __future__ import annotations

from fabriclab.errors import LabError
from fabriclab.lab.portloss import PortLoss, threshold


def _ports_by_machine(lab, links):
    """{machine name or None (this one): (Machine or None, [(node, pid, intf)])} for both ends of
    every link."""
    cluster = getattr(lab, "cluster", None)
    out = {}
    for link in links:
        for node, intf in ((link.a, link.a_intf), (link.b, link.b_intf)):
            machine = cluster.machine_of_name(node) if cluster is not None else None
            if machine is not None and machine.local:
                machine = None
            pid = lab.net.get(node).pid if node in lab.fabric.hosts else None
            out.setdefault(machine and machine.name, (machine, []))[1].append((node, pid, intf))
    return out


def _stage_of(lab, name, machine):
    if name is not None:
        return lab.cluster.loss_stage(machine)
    if "_port_loss" not in lab.__dict__:
        lab.__dict__["_port_loss"] = PortLoss(lab.run.id)
    return lab.__dict__["_port_loss"]


def load(lab, links):
    """Load the loss programs both ends of `links` will need, on every machine, changing no
    port: the first load on another machine starts its stage and compiles there (seconds)."""
    for name, (machine, ports) in _ports_by_machine(lab, links).items():
        _stage_of(lab, name, machine).load_ports(ports)


def set_loss(lab, links, fraction):
    """Drop `fraction` of the packets in both directions of each Link in `links` (0 removes it),
    each end on its own machine."""
    value = threshold(fraction)
    done = []
    try:
        for name, (machine, ports) in _ports_by_machine(lab, links).items():
            stage = _stage_of(lab, name, machine)
            done.append((stage, ports))
            stage.set_ports(ports, value)
    except BaseException:
        # Not half a fault: the ends already set, on any machine, lose nothing again.
        for stage, ports in done if value else ():
            try:
                stage.set_ports(ports, 0)
            except (LabError, OSError):
                pass
        raise


def counters(lab):
    """{(node, intf): (dropped, passed)} for every port with loss configured, on every machine."""
    here = lab.__dict__.get("_port_loss")
    out = here.counters() if here is not None else {}
    if getattr(lab, "cluster", None) is not None:
        out.update(lab.cluster.loss_counters())
    return out


def close(lab):
    here = lab.__dict__.pop("_port_loss", None)
    if here is not None:
        here.close()
