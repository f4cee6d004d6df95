"""Mininet's cluster edition (mininet.examples.cluster) with the lab's connection and tunnels.

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
"""

from __future__ import annotations

import fabriclab.lab  # noqa: F401 - first: its distutils shim fix must precede Mininet's import

from mininet.examples.cluster import RemoteLink, RemoteMixin
from mininet.node import Host

from fabriclab.errors import LabError

VXLAN_PORT = 4789


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
