"""Link loss on the ports of another machine of a cluster, set by the run's loss stage there.

A link's loss is a BPF drop on each sending end (portloss.py), in the kernel of the machine that
end runs on. For an end on another machine, the lab keeps one stage there for the run, started on
first use over its SSH connection (recorded with the run's member, so it ends with the run or a
dropped connection; its pinned programs are in the run's BPF folder there, which the member
removes):

    python -m fabriclab.cluster.remoteloss --run-id ID

One JSON object per line each way:

    out  {"ready": PID}
    in   {"set": [[node, pid | null, intf], ...], "threshold": n}   out {"done": count}
    in   {"load": [[node, pid | null, intf], ...]}     out {"done": count}   (programs loaded only)
    in   "counters"                                   out {"counters": [[node, intf, dropped, passed]]}

A request it cannot carry out gets {"error": "..."}, one line, and changes nothing more.
"""

from __future__ import annotations

import json
import os
import sys

from fabriclab.errors import LabError
from fabriclab.lab.portloss import PortLoss, valid_port
from fabriclab.lab.runstate import RunState
from fabriclab.system.remotechannel import Channel, say

MODULE = "fabriclab.cluster.remoteloss"
MAX_PORTS = 1 << 12
MAX_LINE = 1 << 20


# -- on the other machine ------------------------------------------------------------------------
def main(argv=None):
    run_id = RunState.helper_id(MODULE, argv)
    if run_id is None:
        return 2
    loss = PortLoss(run_id)
    say({"ready": os.getpid()})
    try:
        for line in iter(lambda: sys.stdin.readline(MAX_LINE), ""):
            say(_answer(loss, line))
    finally:
        loss.close()            # the filters keep the pinned programs; the member unpins them
    return 0


def _answer(loss, line):
    if line.strip() == "counters":
        return {"counters": [[node, intf, d, p] for (node, intf), (d, p) in sorted(loss.counters().items())]}
    request = _request(line)
    if request is None:
        return {"error": "expected \"counters\", {\"load\": [[node, pid or null, interface], ...]} or "
                         "{\"set\": [...], \"threshold\": 0..2^32-1}"}
    ports, value = request
    try:
        if value is None:
            loss.load_ports(ports)
        else:
            loss.set_ports(ports, value)
    except (LabError, OSError) as exc:
        return {"error": str(exc)[:200]}
    return {"done": len(ports)}


def _request(line):
    try:
        msg = json.loads(line)
    except ValueError:
        return None
    if not isinstance(msg, dict) or set(msg) not in ({"set", "threshold"}, {"load"}):
        return None
    ports, value = msg.get("set", msg.get("load")), msg.get("threshold")
    if "set" in msg and (not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 1 << 32):
        return None
    if (not isinstance(ports, list) or not 0 < len(ports) <= MAX_PORTS
            or not all(isinstance(p, list) and len(p) == 3 and valid_port(*p) for p in ports)):
        return None
    return [tuple(p) for p in ports], value


# -- here ----------------------------------------------------------------------------------------
class LossStage:
    """The stage on `machine`: set_ports() as PortLoss's, counters() read there."""

    def __init__(self, machine, run_id, record=None):
        self.machine, self.run_id, self.record = machine, run_id, record
        self.channel = None

    def start(self):
        self.channel = Channel.opened(self.machine, MODULE, ["--run-id", self.run_id],
                                      f"link loss on {self.machine.name}", self.record)
        return self

    def load_ports(self, ports):
        self._ask({"load": [list(p) for p in ports]}, len(ports))

    def set_ports(self, ports, value):
        self._ask({"set": [list(p) for p in ports], "threshold": value}, len(ports))

    def _ask(self, request, count):
        reply = self.channel.ask(request)
        if "error" in reply or reply.get("done") != count:
            raise LabError(f"link loss on {self.machine.name}: {str(reply.get('error', 'a malformed reply'))[:200]}")

    def counters(self):
        reply = self.channel.ask("counters")
        rows = reply.get("counters")
        if not isinstance(rows, list) or not all(
                isinstance(r, list) and len(r) == 4 and valid_port(r[0], None, r[1])
                and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 64 for v in r[2:])
                for r in rows):
            raise LabError(f"link loss on {self.machine.name}: a malformed reply")
        return {(node, intf): (dropped, passed) for node, intf, dropped, passed in rows}

    def close(self):
        if self.channel is not None:
            self.channel.close()


def stage_on(cluster, machine, run_id):
    """The run's loss stage on `machine`, started on first use and closed with the cluster."""
    def start():
        return LossStage(machine, run_id, lambda pid: cluster.record(
            machine, process={"pid": pid, "role": "link-loss", "match": MODULE})).start()
    return cluster.helper(machine, MODULE, start)


def counters(cluster):
    """{(node, intf): (dropped, passed)} from every stage the run started on other machines."""
    out = {}
    for machine in cluster.machines[1:]:
        stage = cluster.helpers.get((machine.name, MODULE))
        if stage is not None:
            out.update(stage.counters())
    return out


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
