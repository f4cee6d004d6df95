"""A host's set-up (fabriclab/lab/network.py): the same commands written two ways, a command a
line for containerlab's exec and in three processes for the lab's own build. The lab tests run
the batched one on every fabric they bring up."""

import shlex

from fabriclab.lab.network import host_setup, host_setup_batch, host_setup_script
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import load_spec


def printed(line):
    """The lines a `printf '%s\\n' A B ... | TOOL -batch -` feeds its tool, and the tool."""
    words = shlex.split(line)
    bar = words.index("|")
    assert words[:2] == ["printf", "%s\\n"] and words[bar + 2:] == ["-batch", "-"], line
    return words[bar + 1], words[2:bar]


def test_four_planes_of_ports_get_their_tables_and_the_batch_runs_the_same_commands():
    fabric = Fabric(load_spec("multiplane_pfc"))
    host = fabric.hosts["h1"]
    sysctls, intfs, ip = host_setup(host, 9000)
    assert len(host.ports) == 4 and intfs == [p.intf for p in host.ports]
    port = host.ports[1]
    assert f"rule add from {port.ip} table 101 priority 101" in ip
    assert sysctls[f"net/ipv4/conf/{port.intf}/rp_filter"] == 0
    tc = ["qdisc replace dev x root handle 1: htb default 1"]
    lines = host_setup_batch(host, 9000, tc).splitlines()
    writes = [line for line in lines if line.startswith("echo ")]
    assert writes == [f"echo {v} > /proc/sys/{k}" for k, v in sysctls.items()]
    ethtools = [line for line in lines if line.startswith("ethtool ")]
    assert [line.split()[2] for line in ethtools] == intfs
    batches = dict(printed(line) for line in lines if line.startswith("printf "))
    assert batches == {"ip": ip, "tc": tc}
    assert len(lines) == len(writes) + len(ethtools) + 2       # nothing else runs
    # a command a line: the same ip commands, every sysctl in one call
    script = host_setup_script(host, 9000).splitlines()
    assert [line.removeprefix("ip ") for line in script if line.startswith("ip ")] == ip
    assert script[0] == "sysctl -qw " + " ".join(f"{k}={v}" for k, v in sysctls.items())


def test_a_host_without_shaping_runs_no_tc():
    host = Fabric(load_spec("tiny")).hosts["h1"]
    assert "tc -batch" not in host_setup_batch(host, 1500, [])
