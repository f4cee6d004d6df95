"""Random packet loss on a live lab's links (linkloss.bpf.c on the sending end's tc egress).

The minimal kernel has no netem, but it runs BPF on clsact: a program drops each packet leaving a
port with probability p. A link gets loss in both directions: at the switch port (root namespace)
and, for a host link, at the host's NIC (inside the host). Each namespace has its own copy of the
program and map, keyed by ifindex (ifindexes repeat across namespaces). The programs are pinned
under the run's BPF folder, which the lab removes at teardown; their filters go with the veths.
"""

from __future__ import annotations

import ctypes
import pathlib
import subprocess

from fabriclab.errors import LabError
from fabriclab.queues import datapath

SOURCE = pathlib.Path(__file__).with_name("linkloss.bpf.c")
PROGRAM = "loss_egress"
PRIO = 2                    # after the selection stage (1), before the queue model (3)
HANDLE = 1


class Loss(ctypes.Structure):
    _fields_ = [("threshold", ctypes.c_uint32), ("pad", ctypes.c_uint32),
                ("dropped", ctypes.c_uint64), ("passed", ctypes.c_uint64)]


def threshold(fraction):
    """p as the program compares it: drop when a uniform 32-bit random number is below it."""
    if not 0 <= fraction <= 1:
        raise LabError(f"loss must be a fraction in 0..1, got {fraction!r}")
    return min(int(round(fraction * 2**32)), 2**32 - 1)


class _Stage:
    """The program loaded once for one namespace (None: the switches', else a host's)."""

    def __init__(self, run_id, namespace):
        lib = datapath.libbpf()
        path = datapath.compile_object(SOURCE, "link loss")
        datapath.ensure_bpffs()
        self.obj = lib.bpf_object__open_file(str(path).encode(), None)
        if not self.obj or lib.bpf_object__load(self.obj):
            raise LabError("the kernel refused the link-loss eBPF program")
        self.pin = datapath.pin_dir(run_id) / "loss" / (namespace or "switches")
        self.pin.parent.mkdir(parents=True, exist_ok=True)
        prog = lib.bpf_object__find_program_by_name(self.obj, PROGRAM.encode())
        if lib.bpf_program__pin(prog, str(self.pin).encode()):
            raise LabError(f"cannot pin the link-loss program at {self.pin}")
        fd = lib.bpf_map__fd(lib.bpf_object__find_map_by_name(self.obj, b"losses"))
        self.map = datapath.Map(fd, ctypes.c_uint32, Loss)
        self.attached = set()

    def close(self):
        if self.obj:
            datapath.libbpf().bpf_object__close(self.obj)
            self.obj = None


def _namespace_of(lab, node):
    return node if node in lab.fabric.hosts else None


def _ifindex(lab, node, intf):
    text = (lab.net.get(node).cmd if node in lab.fabric.hosts else _root_cmd)(f"cat /sys/class/net/{intf}/ifindex")
    try:
        return int(text.strip())
    except ValueError:
        raise LabError(f"link loss: cannot read the ifindex of {intf} on {node}") from None


def _root_cmd(command):
    return subprocess.run(command, shell=True, capture_output=True, text=True).stdout


def _tc(lab, node, commands):
    argv = ["tc", "-batch", "-"]
    if node in lab.fabric.hosts:
        argv = ["nsenter", f"--net=/proc/{lab.net.get(node).pid}/ns/net", *argv]
    proc = subprocess.run(argv, input="\n".join(commands) + "\n", capture_output=True, text=True)
    if proc.returncode != 0:
        raise LabError(f"link loss: tc on {node} failed: {(proc.stderr.strip().splitlines() or ['?'])[0]}")


def set_loss(lab, links, fraction):
    """Drop `fraction` of the packets in both directions of each Link in `links` (0 removes it)."""
    value = threshold(fraction)
    _here_only(lab, links)
    stages = lab.__dict__.setdefault("_loss_stages", {})
    for link in links:
        for node, intf in ((link.a, link.a_intf), (link.b, link.b_intf)):
            ns = _namespace_of(lab, node)
            stage = stages.get(ns)
            if stage is None:
                stage = stages[ns] = _Stage(lab.run.id, ns)
            index = _ifindex(lab, node, intf)
            if value:
                stage.map.update(index, Loss(value, 0, 0, 0))
                if (node, intf) not in stage.attached:
                    _tc(lab, node, [f"qdisc replace dev {intf} clsact",
                                    f"filter replace dev {intf} egress prio {PRIO} handle {HANDLE} bpf da "
                                    f"pinned {stage.pin}"])
                    stage.attached.add((node, intf))
            else:
                try:
                    stage.map.delete(index)
                except (LabError, OSError):
                    pass


def _here_only(lab, links):
    """Refuse, before touching any port, a link with an end on another machine of a cluster: the
    loss program and its map live in this machine's kernel."""
    cluster = getattr(lab, "cluster", None)
    if cluster is None:
        return
    for link in links:
        for node in (link.a, link.b):
            machine = cluster.machine_of_name(node)
            if not machine.local:
                raise LabError(f"link loss on {link.label}: {node} runs on machine {machine.name}, and loss is "
                               f"an eBPF program of this machine's kernel; across machines use down, up, flap "
                               f"or a rate")


def counters(lab):
    """{(node, intf): (dropped, passed)} for every port with loss configured."""
    out = {}
    for ns, stage in lab.__dict__.get("_loss_stages", {}).items():
        for node, intf in stage.attached:
            try:
                entry = stage.map.lookup(_ifindex(lab, node, intf))
            except (LabError, OSError, KeyError):
                continue
            if entry is not None:
                out[(node, intf)] = (int(entry.dropped), int(entry.passed))
    return out


def close(lab):
    for stage in lab.__dict__.pop("_loss_stages", {}).values():
        stage.close()
