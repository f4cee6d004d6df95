"""Random packet loss on the ports of one machine (linkloss.bpf.c on the sending end's tc egress).

The minimal kernel has no netem, but it runs BPF on clsact: a program drops each packet leaving a
port with probability p. A link gets loss in both directions: at the switch port (root namespace)
and, for a host link, at the host's NIC (inside the host). Each namespace has its own copy of the
program and map, keyed by ifindex (ifindexes repeat across namespaces). The programs are pinned
under the run's BPF folder, which the lab removes at teardown; their filters go with the veths.

`PortLoss` does this for the ports of the machine it runs on: the lab's for this one, and the
run's loss stage's (remoteloss.py) on each other machine of a cluster. linkloss.py puts each
end of a link on its machine.
"""

from __future__ import annotations

import ctypes
import pathlib
import re
import subprocess

from fabriclab.errors import LabError
from fabriclab.loading import excerpt
from fabriclab.queues import datapath
from fabriclab.system.netns import in_namespace, interface_indexes
from fabriclab.system.remotechannel import safe_name

SOURCE = pathlib.Path(__file__).with_name("linkloss.bpf.c")
PROGRAM = "loss_egress"
PRIO = 2                    # after the selection stage (1), before the queue model (3)
HANDLE = 1
_NODE = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,31}")


class Loss(ctypes.Structure):
    _fields_ = [("threshold", ctypes.c_uint32), ("pad", ctypes.c_uint32),
                ("dropped", ctypes.c_uint64), ("passed", ctypes.c_uint64)]


def threshold(fraction):
    """p as the program compares it: drop when a uniform 32-bit random number is below it."""
    if not 0 <= fraction <= 1:
        raise LabError(f"loss must be a fraction in 0..1, got {fraction!r}")
    return min(int(round(fraction * 2**32)), 2**32 - 1)


def valid_port(node, pid, intf):
    """A port as PortLoss takes it: a node's name, its namespace's PID (None: the root
    namespace, where the switches' ports are) and an interface name the kernel allows."""
    return (isinstance(node, str) and _NODE.fullmatch(node) is not None
            and (pid is None or (isinstance(pid, int) and not isinstance(pid, bool) and 1 < pid < 1 << 22))
            and safe_name(intf))


class _Stage:
    """The program loaded once for one namespace (`name`: "switches" or a host's name)."""

    def __init__(self, run_id, name):
        lib = datapath.libbpf()
        path = datapath.compile_object(SOURCE, "link loss")
        datapath.ensure_bpffs()
        self.obj = lib.bpf_object__open_file(str(path).encode(), None)
        if not self.obj or lib.bpf_object__load(self.obj):
            raise LabError("the kernel refused the link-loss eBPF program")
        self.pin = datapath.pin_dir(run_id) / "loss" / name
        self.pin.parent.mkdir(parents=True, exist_ok=True)
        prog = lib.bpf_object__find_program_by_name(self.obj, PROGRAM.encode())
        if lib.bpf_program__pin(prog, str(self.pin).encode()):
            raise LabError(f"cannot pin the link-loss program at {self.pin}")
        fd = lib.bpf_map__fd(lib.bpf_object__find_map_by_name(self.obj, b"losses"))
        self.map = datapath.Map(fd, ctypes.c_uint32, Loss)
        self.attached = {}          # (node, intf) -> its namespace's PID (None: the root's)

    def close(self):
        if self.obj:
            datapath.libbpf().bpf_object__close(self.obj)
            self.obj = None


class PortLoss:
    """Loss on the ports of this machine, for run `run_id` (whose BPF folder holds the programs)."""

    def __init__(self, run_id):
        self.run_id = run_id
        self.stages = {}            # namespace name -> _Stage
        self.retired = {}           # (node, intf) -> (dropped, passed) of its entries replaced or lifted

    def set(self, node, pid, intf, value):
        """Drop a `value` (threshold()) share of what leaves `intf` of `node`; 0 ends it. What the
        port dropped and passed so far stays in counters() (a lifted loss keeps its count)."""
        stage = self._stage(node, pid, intf)
        index = _ifindex(node, pid, intf)
        self._retire(stage, node, intf, index)
        if value:
            stage.map.update(index, Loss(value, 0, 0, 0))
            if (node, intf) not in stage.attached:
                _tc(node, pid, [f"qdisc replace dev {intf} clsact",
                                f"filter replace dev {intf} egress prio {PRIO} handle {HANDLE} bpf da "
                                f"pinned {stage.pin}"])
                stage.attached[(node, intf)] = pid
        else:
            try:
                stage.map.delete(index)
            except (LabError, OSError):
                pass

    def _retire(self, stage, node, intf, index):
        """Move the port's live counts into `retired` before its entry is replaced or deleted."""
        try:
            entry = stage.map.lookup(index)
        except (LabError, OSError, KeyError):
            entry = None
        if entry is not None:       # kept even at zero: a port that had loss stays listed
            dropped, passed = self.retired.get((node, intf), (0, 0))
            self.retired[(node, intf)] = (dropped + int(entry.dropped), passed + int(entry.passed))

    def _stage(self, node, pid, intf):
        """The program for the port's namespace, loaded on first use (the port checked first)."""
        if not valid_port(node, pid, intf):
            raise LabError(f"link loss: not a port: {excerpt(str(node))} {excerpt(str(intf))}")
        name = "switches" if pid is None else node
        if name not in self.stages:
            self.stages[name] = _Stage(self.run_id, name)
        return self.stages[name]

    def load_ports(self, ports):
        """Load (compiling it first, once) the program of each port's namespace, touching no port:
        what a timed fault does before its clock starts."""
        for node, pid, intf in ports:
            self._stage(node, pid, intf)

    def set_ports(self, ports, value):
        """set() for each (node, pid, intf) of `ports`."""
        for node, pid, intf in ports:
            self.set(node, pid, intf, value)

    def counters(self):
        """{(node, intf): (dropped, passed)} since the run began, for every port that has or has
        had loss configured (its count only grows: each run reads a difference)."""
        out = dict(self.retired)
        for stage in self.stages.values():
            for (node, intf), pid in stage.attached.items():
                try:
                    entry = stage.map.lookup(_ifindex(node, pid, intf))
                except (LabError, OSError, KeyError):
                    continue
                if entry is not None:
                    dropped, passed = out.get((node, intf), (0, 0))
                    out[(node, intf)] = (dropped + int(entry.dropped), passed + int(entry.passed))
        return out

    def close(self):
        for stage in self.stages.values():
            stage.close()
        self.stages = {}


def _ifindex(node, pid, intf):
    index = interface_indexes(pid, node).get(intf)
    if index is None:
        raise LabError(f"link loss: cannot read the ifindex of {intf} on {node}")
    return index


def _tc(node, pid, commands):
    proc = subprocess.run(in_namespace(pid, ["tc", "-batch", "-"]), input="\n".join(commands) + "\n",
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise LabError(f"link loss: tc on {node} failed: {(proc.stderr.strip().splitlines() or ['?'])[0]}")
