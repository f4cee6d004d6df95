"""A host's set-up (fabriclab/lab/network.py): the same commands written two ways, a command a
line for containerlab's exec and in three processes for the lab's own build. The lab tests run
the batched one on every fabric they bring up."""

import dataclasses

from fabriclab.lab.network import BATCH_END, host_setup, host_setup_batch, host_setup_script
from fabriclab.system.shaping import queued_commands
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import load_spec


def batches(lines):
    """{tool: the lines its `TOOL -batch - <<'END'` here-document feeds it}, and the lines
    outside any."""
    fed, outside, tool = {}, [], None
    for line in lines:
        if tool is None and line.endswith(f"-batch - <<'{BATCH_END}'"):
            tool = line.split()[0]
            fed[tool] = []
        elif line == BATCH_END:
            tool = None
        elif tool is not None:
            fed[tool].append(line)
        else:
            outside.append(line)
    return fed, outside


def test_four_planes_of_ports_get_their_tables_and_the_batch_runs_the_same_commands():
    fabric = Fabric(load_spec("multiplane_pfc"))
    host = fabric.hosts["h1"]
    sysctls, intfs, ip = host_setup(host, 9000)
    assert len(host.ports) == 4 and intfs == [p.intf for p in host.ports]
    port = host.ports[1]
    assert f"rule add from {port.ip} table 101 priority 101" in ip
    assert sysctls[f"net/ipv4/conf/{port.intf}/rp_filter"] == 0
    tc = ["qdisc replace dev x root handle 1: htb default 1"]
    fed, outside = batches(host_setup_batch(host, 9000, tc).splitlines())
    assert fed == {"ip": ip, "tc": tc}
    writes = [line for line in outside if line.startswith("echo ")]
    assert writes == [f"echo {v} > /proc/sys/{k}" for k, v in sysctls.items()]
    ethtools = [line for line in outside if line.startswith("ethtool ")]
    assert [line.split()[2] for line in ethtools] == intfs
    assert len(outside) == len(writes) + len(ethtools)               # nothing else runs
    # a command a line: the same ip commands, every sysctl in one call
    script = host_setup_script(host, 9000).splitlines()
    assert [line.removeprefix("ip ") for line in script if line.startswith("ip ")] == ip
    assert script[0] == "sysctl -qw " + " ".join(f"{k}={v}" for k, v in sysctls.items())


def test_a_host_without_shaping_runs_no_tc():
    host = Fabric(load_spec("tiny")).hosts["h1"]
    assert "tc -batch" not in host_setup_batch(host, 1500, [])


def test_no_line_of_a_many_port_host_with_the_queue_model_reaches_the_terminals_limit():
    # a node's shell reads its script through a tty, which cuts a line at 4,095 bytes; one
    # `printf` line of every command came to 3,207 bytes for multiplane_pfc's 4 planes
    spec = dataclasses.replace(load_spec("multiplane_pfc"), planes=8)
    host = Fabric(spec).hosts["h1"]
    tc = [" ".join(cmd[1:]) for port in host.ports
          for cmd in queued_commands(port.intf, spec.host_rate_mbps, 65536, spec.mtu)]
    script = host_setup_batch(host, spec.mtu, tc)
    assert len(host.ports) == 8 and len(script) > 2 * 4096
    assert max(map(len, script.splitlines())) < 400
