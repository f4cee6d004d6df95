"""OpenFlow steering of an in-network service on a real fabric: packets to a leaf's service address
reach the server beside it, packets to a group address reach every member, and clearing the plan
takes both away while routing carries on."""

import sys

import pytest

from fabriclab.lab import steering
from fabriclab.errors import LabError
from fabriclab.lab.lab import Lab
from fabriclab.topologies.spec import FabricSpec

pytestmark = pytest.mark.lab

SPEC = FabricSpec(name="t-steer", leaves=2, spines=2, hosts_per_leaf=3,
                  host_rate_mbps=10, fabric_rate_mbps=10, real_host_rate_mbps=400_000)
PORT = 27182
SERVICE, GROUP = "10.1.255.1", "10.1.254.1"

RECEIVE = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", %d)); s.settimeout(3)
got = []
try:
    while True:
        data, src = s.recvfrom(2048); got.append(data.decode())
except socket.timeout:
    pass
print(" ".join(got) or "-")
""" % PORT

SEND = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(3):
    s.sendto(sys.argv[2].encode(), (sys.argv[1], %d))
""" % PORT


@pytest.fixture(scope="module")
def lab():
    with Lab(SPEC) as running:
        yield running


def _to(lab, host):
    p = lab.fabric.hosts[host].ports[0]
    return {"ip": p.ip, "mac": p.mac, "via": p.leaf_port}


def _exchange(lab, sender, address, receivers, tag):
    listeners = {h: lab.net.get(h).popen([sys.executable, "-c", RECEIVE]) for h in receivers}
    lab.net.get(sender).cmd("sleep 0.5")            # the listeners have bound
    lab.net.get(sender).cmd(f"{sys.executable} -c '{SEND}' {address} {tag}")
    return {h: proc.communicate(timeout=20)[0].decode().split() for h, proc in listeners.items()}


def test_service_and_group_addresses_are_steered_then_cleared(lab):
    plan = {"services": [{"switch": "l1", "address": SERVICE, "udp_dst": PORT, "to": _to(lab, "h3")}],
            "groups": [{"switch": "l1", "address": GROUP, "members": [_to(lab, "h1"), _to(lab, "h2")]}]}
    steering.apply(lab, plan)
    # h1 addresses the switch; the server beside it (h3) gets the packets, nobody else does.
    got = _exchange(lab, "h1", SERVICE, ["h3", "h2"], "up")
    assert got == {"h3": ["up"] * 3, "h2": ["-"]}
    # The server addresses the group once per packet; the switch copies to every member.
    got = _exchange(lab, "h3", GROUP, ["h1", "h2"], "down")
    assert got == {"h1": ["down"] * 3, "h2": ["down"] * 3}
    status = lab.controller.status()["steering"]
    assert status["error"] == "" and status["generation"]

    steering.clear(lab)
    assert _exchange(lab, "h1", SERVICE, ["h3"], "gone") == {"h3": ["-"]}
    assert lab.ping(lab.fabric.hosts["h1"].ports[0], lab.fabric.hosts["h4"].ports[0])   # routing intact


def test_a_bad_plan_is_refused_before_the_controller_sees_it(lab):
    with pytest.raises(LabError, match=r"steering services\[0\]: no switch 'l7'"):
        steering.apply(lab, {"services": [{"switch": "l7", "address": SERVICE, "udp_dst": PORT,
                                           "to": _to(lab, "h3")}]})
