"""The queue model on another machine of a cluster: the data path, gates and PFC agent of the ports
placed there, run by a helper of the lab over its SSH connection (system/remotechannel.py):

    python -m fabriclab.cluster.remotequeues --run-id ID

The lab's own model (queues/model.py) holds one `RemoteQueues` per other machine as a peer, reads
every machine's maps through them and changes the fabric through all of them. One JSON object per
line each way; the first request starts the model there:

    out {"ready": PID}
    in  clock                                    out {"wall": time.time()}
    in  {"start": {spec, ecn, placement, here, namespaces, tunnels, peers, wire_handle, relay_ms}}
                                                 out {"started": [the interfaces the wire program is on]}
    in  rows                                     out {"rows": [stats, bias]}  (base64 of the maps' rows)
    in  gates | red | alarms | errors | ovs | ovs_drops   (a bare word, as clock)
    in  {"set_ecn": {target, mode, kmin, kmax, pmax, reset}}    {"storm": [port, seconds]}
    in  {"cut": [switch, fraction]}              a buffer fault's cut (1: the whole buffer)
    in  {"cables": [[interface, ...], down]}    {"empty": [interface, ...]}
    in  {"repairs": since} | {"reaction": since}  (since: a wall-clock time there)
        alarms and repairs come back with an age (age_ns), not that machine's monotonic time
    in  {"sample": interval_s}                  out {"done": 1}   (its maps sampled there, on its grid)
    in  {"samples": index}                       out {"samples": {wall, stats, bias, left}}: the series
        from sample `index` on (the first ends the sampling), as many samples as fit in a line:
        their wall-clock times there, stats and bias rows as base64 of zlib, and how many are left
    in  {"pfc": [kind, port, us]}   a pause for a port here, sent us microseconds ago (no answer)
    out {"pfc": [kind, port, us]}   a pause for a port on another machine, at any time

Every answer is one line; a request it cannot carry out gets {"error": "..."} and changes nothing
more. The helper stops its model (and takes its wire filters off) when its input ends: with the
run, or with a dropped connection; its pins are in the run's BPF folder there, which the run's
member removes, and the member takes off the wire filters too if the helper was killed.
"""

from __future__ import annotations

import base64
import ctypes
import json
import math
import os
import subprocess
import sys
import time
import zlib

from fabriclab.errors import LabError, SpecError
from fabriclab.lab.runstate import RunState, is_lab_link_group
from fabriclab.loading import excerpt
from fabriclab.queues.agentproc import MODULE as PFC_AGENT
from fabriclab.queues.datapath import EV_XOFF, EV_XON, NCLASS, QStat
from fabriclab.queues.model import QueueModel
from fabriclab.queues.sampler import MAX_SAMPLES, MIN_INTERVAL_S, QueueSampler
from fabriclab.system.remotechannel import Channel, Conversation, safe_name, say
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import validate

MODULE = "fabriclab.cluster.remotequeues"
MAX_LINE = 1 << 22
MAX_NODES = 1 << 12
ANSWER_TIMEOUT_S = 60.0
MAX_RELAY_MS = 1000.0
MAX_AGE_US = 10 ** 9            # a relayed pause's age: under 1000 s
MAX_AGE_NS = 10 ** 16           # an alarm's or a repair's: under 115 days
MAX_SAMPLE_INTERVAL_S = 10.0
CHUNK_BYTES = 1 << 21           # a samples answer's rows before compression: its line stays under MAX_LINE
_NAMED = ("gates", "red", "alarms", "errors", "ovs", "ovs_drops", "rows", "clock")


# -- on the other machine ------------------------------------------------------------------------
def main(argv=None):
    run_id = RunState.helper_id(MODULE, argv)
    if run_id is None:
        return 2
    say({"ready": os.getpid()})
    model, sampling = None, Sampling()
    try:
        for line in iter(lambda: sys.stdin.readline(MAX_LINE), ""):
            if model is None and line.strip() != "clock":
                model, answer = _start(run_id, line)
            else:
                answer = _answer(model, line, sampling)
            if answer is not None:
                say(answer)
    finally:
        if model is not None:
            model.stop()
    return 0


def _start(run_id, line):
    try:
        config = start_config(json.loads(line))
        model = QueueModel(config["fabric"], None, run_id, ecn_mechanism=config["ecn"],
                           placement=config["placement"], here=config["here"], namespaces=config["namespaces"],
                           tunnels=config["tunnels"], underlays=underlays(config["peers"]),
                           wire_handle=config["wire_handle"], relay_ms=config["relay_ms"],
                           relay=lambda kind, port, age_ns: say({"pfc": [kind, port, age_ns // 1000]}))
        model.start()
    except (ValueError, LabError, OSError) as exc:
        return None, {"error": str(exc)[:200]}
    return model, {"started": list(model.wired)}


def start_config(msg):
    """The start request, checked as hostile: ValueError naming what is wrong."""
    keys = {"spec", "ecn", "placement", "here", "namespaces", "tunnels", "peers", "wire_handle", "relay_ms"}
    config = msg.get("start") if isinstance(msg, dict) and set(msg) == {"start"} else None
    if not isinstance(config, dict) or set(config) != keys:
        raise ValueError(f"expected {{\"start\": {{{', '.join(sorted(keys))}}}}}")
    try:
        fabric = Fabric.from_spec_dict(config["spec"])
    except (TypeError, ValueError, KeyError, AttributeError, SpecError) as exc:
        raise ValueError(f"start: not a fabric spec: {excerpt(str(exc))}") from None
    problems = validate(fabric.spec)
    if problems or fabric.spec.queues is None:
        raise ValueError(f"start: spec: {excerpt(problems[0] if problems else 'no queues: section')}")
    nodes = {*fabric.switches, *fabric.hosts}
    placement, here = config["placement"], config["here"]
    if (not isinstance(placement, dict) or set(placement) != nodes
            or not all(isinstance(m, str) and 0 < len(m) <= 64 for m in placement.values())
            or here not in set(placement.values())):
        raise ValueError("start: placement must put every node of the fabric on a machine, this one among them")
    spaces = config["namespaces"]
    if not isinstance(spaces, dict) or not all(
            h in fabric.hosts and placement[h] == here and _int(pid, 2, 1 << 22) for h, pid in spaces.items()):
        raise ValueError("start: namespaces must give a PID for hosts placed here")
    tunnels = config["tunnels"]
    ports = {intf for link in fabric.links for intf in (link.a_intf, link.b_intf)}
    if not isinstance(tunnels, dict) or not all(
            intf in ports and _int(vni, 1, 1 << 24) for intf, vni in tunnels.items()):
        raise ValueError("start: tunnels must map the fabric's interfaces to VXLAN ids")
    peers = config["peers"]
    if not isinstance(peers, list) or not 0 < len(peers) <= MAX_NODES or not all(_address(a) for a in peers):
        raise ValueError("start: peers must list the other machines' addresses")
    relay = config["relay_ms"]
    if not isinstance(relay, (int, float)) or isinstance(relay, bool) or not (
            math.isfinite(relay) and 0 <= relay <= MAX_RELAY_MS):
        raise ValueError(f"start: relay_ms must be 0..{MAX_RELAY_MS:g}")
    if not is_lab_link_group(config["wire_handle"]):
        raise ValueError("start: wire_handle must be the run's link group")
    if config["ecn"] not in ("bpf-clsact", "red"):
        raise ValueError("start: ecn must be bpf-clsact or red")
    return {**config, "fabric": fabric}


def _int(value, low, high):
    return isinstance(value, int) and not isinstance(value, bool) and low <= value < high


def _address(text):
    parts = text.split(".") if isinstance(text, str) else []
    return len(parts) == 4 and all(p.isdigit() and int(p) < 256 for p in parts)


def underlays(addresses):
    """The interfaces this machine reaches `addresses` by: where the run's tunnels leave."""
    devices = []
    for address in addresses:
        proc = subprocess.run(["ip", "-o", "route", "get", address], capture_output=True, text=True)
        words = proc.stdout.split()
        dev = words[words.index("dev") + 1] if "dev" in words[:-1] else None
        if proc.returncode != 0 or not safe_name(dev):
            raise LabError(f"no route to machine {address} here")
        if dev not in devices:
            devices.append(dev)
    return devices


class Sampling:
    """The helper's queue sampler (one at a time: a new one replaces the last) and the series it
    hands back in chunks."""

    def __init__(self):
        self.sampler = None

    def start(self, model, interval_s):
        if not (isinstance(interval_s, (int, float)) and not isinstance(interval_s, bool)
                and math.isfinite(interval_s) and MIN_INTERVAL_S <= interval_s <= MAX_SAMPLE_INTERVAL_S):
            raise ValueError(f"sample: the interval must be {MIN_INTERVAL_S:g}..{MAX_SAMPLE_INTERVAL_S:g} s")
        if self.sampler is not None:
            self.sampler.halt()        # a series the lab never asked for (its run failed): dropped
        self.sampler = QueueSampler(model, interval_s).start()
        return {"done": 1}

    def chunk(self, index):
        if self.sampler is None:
            raise ValueError("samples: not sampling")
        if not _int(index, 0, MAX_SAMPLES + 2):
            raise ValueError("samples: not a sample index")
        sampler = self.sampler
        sampler.halt()
        per = len(sampler.rows) * (ctypes.sizeof(QStat) + 8)
        end = min(len(sampler.times), index + max(1, CHUNK_BYTES // per))
        pack = lambda chunks: base64.b64encode(zlib.compress(b"".join(chunks[index:end]))).decode()  # noqa: E731
        return {"samples": {"wall": [round(sampler.wall0 + t, 6) for t in sampler.times[index:end]],
                            "stats": pack(sampler.chunks), "bias": pack(sampler.bias_chunks),
                            "left": len(sampler.times) - max(end, index)}}


def _answer(model, line, sampling=None):
    try:
        msg = line.strip() if line.strip() in _NAMED else json.loads(line)
    except ValueError:
        return {"error": "not JSON"}
    try:
        if isinstance(msg, str) and msg in _NAMED:
            return _named(model, msg)
        if isinstance(msg, dict) and len(msg) == 1:
            (key, value), = msg.items()
            return _keyed(model, key, value, sampling)
    except (LabError, OSError, ValueError, KeyError, TypeError) as exc:
        return {"error": str(exc)[:200]}
    return {"error": f"unknown request {excerpt(line.strip())}"}


def _named(model, name):
    if name == "clock":
        return {"wall": time.time()}
    mine = model.mine                   # this machine's part of the model: queues/machine.py
    if name == "rows":
        stats, bias = mine.read_rows()
        return {"rows": [base64.b64encode(bytes(stats)).decode(), base64.b64encode(bytes(bias)).decode()]}
    if name == "gates":
        return {"gates": [[idx, row] for idx, row in mine.gates().items()]}
    if name == "red":
        return {"red": [[port, cls, row] for (port, cls), row in mine.red().items()]}
    if name == "alarms":
        return {"alarms": _aged(mine.alarms())}
    if name == "errors":
        return {"errors": mine.errors()}
    if name == "ovs":
        return {"done": mine.ensure_ovs_buffers()}
    return {"ovs_drops": mine.ovs_drops()}


def _keyed(model, key, value, sampling=None):
    mine = model.mine
    if key == "sample" and sampling is not None:
        return sampling.start(model, value)
    if key == "samples" and sampling is not None:
        return sampling.chunk(value)
    if key == "pfc":
        try:
            if not (isinstance(value, list) and len(value) == 3 and all(_int(v, 0, 1 << 20) for v in value[:2])
                    and _int(value[2], 0, MAX_AGE_US)):
                raise ValueError("not [kind, port, age in us]")
            mine.pause(value[0], value[1], value[2] * 1000)
        except (ValueError, LabError, OSError) as exc:
            model.agent.note(f"a relayed pause {excerpt(json.dumps(value))}: {exc}")
        return None                      # pauses are not answered
    if key == "set_ecn" and isinstance(value, dict) and set(value) <= {"target", "mode", "kmin", "kmax", "pmax",
                                                                      "reset"}:
        return {"done": mine.set_ecn(**value)}
    if key == "cut" and isinstance(value, list) and len(value) == 2 and isinstance(value[0], str) \
            and isinstance(value[1], (int, float)) and math.isfinite(value[1]):
        return {"done": mine.cut_buffer(*value)}
    if key == "storm" and isinstance(value, list) and len(value) == 2 and _int(value[0], 0, len(model.ports)) \
            and isinstance(value[1], (int, float)) and math.isfinite(value[1]) and 0 <= value[1] <= 3600:
        mine.storm(*value)
        return {"done": 1}
    if key == "cables" and isinstance(value, list) and len(value) == 2 and _names(value[0]) \
            and isinstance(value[1], bool):
        mine.cables_down(*value)
        return {"done": len(value[0])}
    if key == "empty" and _names(value):
        mine.empty_queues(value)
        return {"done": len(value)}
    if key in ("repairs", "reaction") and isinstance(value, (int, float)) and math.isfinite(value):
        since_ns = time.monotonic_ns() - int((time.time() - value) * 1e9)
        if key == "repairs":
            return {"repairs": _aged(mine.leak_repairs(since_ns))}
        return {"reaction": mine.reaction_stats(since_ns)}
    return {"error": f"a malformed {excerpt(key)} request"}


def _aged(records):
    """Records with their time as an age (`age_ns`), not a time of this machine's monotonic clock,
    which means nothing on the lab's."""
    now = time.monotonic_ns()
    return [{**{k: v for k, v in r.items() if k != "t_ns"}, "age_ns": now - r["t_ns"]} for r in records]


def _names(value):
    return isinstance(value, list) and len(value) <= MAX_NODES and all(safe_name(v) for v in value)


# -- here ----------------------------------------------------------------------------------------
# A pause for a port on another machine crosses one or two SSH connections; the headroom of the
# ports that send one covers this much on top of their cable (the round trip measured at start,
# at rest, is small next to what a loaded machine adds: hence the factor and the floor).
RELAY_FACTOR = 4.0
RELAY_FLOOR_MS = 2.0


def relay_allowance_ms(round_trips_s):
    """The relay time a crossing cable's headroom covers, from the peers' measured round trips."""
    return round(max(RELAY_FLOOR_MS, RELAY_FACTOR * 1e3 * max(round_trips_s, default=0.0)), 3)


def model_across(fabric, net, run, cluster, machine_of, ecn_mechanism, tunnels):
    """The lab's queue model of a fabric split over `cluster`'s machines (`machine_of(node)`: its
    Machine; `tunnels`: {interface: VXLAN id} of the cables between machines), with a peer model
    on each other machine, all started; on failure nothing is left running."""
    placement = {node: machine_of(node).name for node in (*fabric.switches, *fabric.hosts)}
    here, others = cluster.machines[0], cluster.machines[1:]
    nports = 2 * len(fabric.links)
    model = None

    def on_pause(kind, idx, waited_ns=0):
        model.pause(kind, idx, waited_ns)

    peers = {}
    try:
        for machine in others:
            peers[machine.name] = RemoteQueues(machine, run.id, nports, on_pause, lambda pid, m=machine: cluster.record(
                m, process={"pid": pid, "role": "queue-model", "match": MODULE})).open()
        relay_ms = relay_allowance_ms([peer.round_trip_s for peer in peers.values()])
        group = run.data["link_group"]
        devices = underlays([m.private_ip for m in others])
        run.add_wire_filters(devices)
        model = QueueModel(fabric, net, run.id, ecn_mechanism=ecn_mechanism, placement=placement, here=here.name,
                           tunnels=tunnels, underlays=devices, wire_handle=group, relay=on_pause,
                           relay_ms=relay_ms, record=lambda pid: run.add_process(pid, "pfc-agent", PFC_AGENT))
        model.peers = peers
        model.start()
        for machine in others:
            config = {"spec": fabric.spec.to_dict(), "ecn": ecn_mechanism, "placement": placement,
                      "here": machine.name, "tunnels": tunnels, "wire_handle": group, "relay_ms": relay_ms,
                      "namespaces": {h: net.get(h).pid for h in fabric.hosts if placement[h] == machine.name},
                      "peers": [m.private_ip for m in cluster.machines if m is not machine]}
            cluster.record(machine, wire=peers[machine.name].start(config))
    except BaseException:
        if model is not None:
            model.stop()
        for peer in peers.values():
            peer.close()
        raise
    return model


class RemoteQueues:
    """The model on `machine`, as a peer of the lab's (a MachineQueues, queues/machine.py):
    pauses it relays go to `on_pause(kind, port)` (the lab's model, which routes them), and it
    answers the lab's model's reads."""

    def __init__(self, machine, run_id, nports, on_pause, record=None):
        self.machine, self.run_id, self.nports = machine, run_id, nports
        self.on_pause, self.record = on_pause, record
        self.offset_s = 0.0          # its clock minus this one
        self.round_trip_s = None
        self.errors_here = []        # relayed pauses it sent that could not be delivered
        self.talk = Conversation(f"queue model on {machine.name}", self._unasked, ANSWER_TIMEOUT_S)

    @property
    def channel(self):
        return self.talk.channel

    def open(self):
        """Start the helper and measure its clock and round trip (before start())."""
        channel = Channel.opened(self.machine, MODULE, ["--run-id", self.run_id],
                                 f"queue model on {self.machine.name}", self.record, then=self._clock)
        self.talk.attach(channel, f"queues-{self.machine.name}")
        return self

    def _clock(self, channel):
        self.offset_s, self.round_trip_s = channel.clock_offset()

    def start(self, config):
        """Start the model there with `config` (the start request's fields)."""
        reply = self._ask({"start": config}, "started")
        if not isinstance(reply, list) or not all(safe_name(d) for d in reply):
            raise LabError(f"queue model on {self.machine.name}: a malformed reply")
        return reply

    def _unasked(self, msg):
        """A pause that machine's agent relays: for the lab's model to route."""
        pause = msg.get("pfc") if len(msg) == 1 else None
        if pause is None:
            return False
        try:
            if not (isinstance(pause, list) and len(pause) == 3 and pause[0] in (EV_XOFF, EV_XON)
                    and _int(pause[1], 0, self.nports) and _int(pause[2], 0, MAX_AGE_US)):
                raise ValueError(f"a malformed pause {excerpt(json.dumps(pause))}")
            self.on_pause(pause[0], pause[1], pause[2] * 1000 + self.one_way_ns())
        except (LabError, ValueError, KeyError, OSError) as exc:
            self.errors_here.append(f"a pause from {self.machine.name}: {exc}")
        return True

    def _ask(self, request, key):
        return self.talk.ask(request, key)

    def _send(self, line):
        self.talk.send(line)

    # -- what the lab's model asks -----------------------------------------------------------------
    def pause(self, kind, idx, waited_ns=0):
        self._send(json.dumps({"pfc": [kind, idx, (waited_ns + self.one_way_ns()) // 1000]}))

    def one_way_ns(self):
        """The relay's one-way time to or from that machine, estimated: half the round trip."""
        return int((self.round_trip_s or 0.0) * 5e8)

    def read_rows(self):
        rows = self._ask("rows", "rows")
        n = self.nports * NCLASS
        try:
            stats, bias = (base64.b64decode(text, validate=True) for text in rows)
        except (TypeError, ValueError):
            stats = bias = b""
        if len(stats) != n * ctypes.sizeof(QStat) or len(bias) != n * 8:
            raise LabError(f"queue model on {self.machine.name}: its maps are not this fabric's")
        return (QStat * n).from_buffer_copy(stats), (ctypes.c_int64 * n).from_buffer_copy(bias)

    def gates(self):
        rows = self._ask("gates", "gates")
        return {idx: row for idx, row in rows if _int(idx, 0, self.nports) and isinstance(row, dict)}

    def red(self):
        return {(port, cls): row for port, cls, row in self._ask("red", "red") if isinstance(row, dict)}

    def set_ecn(self, target, **settings):
        return self._ask({"set_ecn": {"target": target, **settings}}, "done")

    def cut_buffer(self, switch, fraction):
        return self._ask({"cut": [switch, fraction]}, "done")

    def storm(self, idx, seconds):
        self._ask({"storm": [idx, seconds]}, "done")

    def cables_down(self, intfs, down):
        self._ask({"cables": [list(intfs), bool(down)]}, "done")

    def empty_queues(self, intfs):
        self._ask({"empty": list(intfs)}, "done")

    def ensure_ovs_buffers(self):
        return self._ask("ovs", "done")

    def ovs_drops(self):
        return self._ask("ovs_drops", "ovs_drops")

    def alarms(self):
        return self._dated(self._ask("alarms", "alarms"))

    def start_sampling(self, interval_s):
        """Its maps sampled there every `interval_s` (queues/sampler.py merges the series)."""
        self._ask({"sample": interval_s}, "done")

    def samples(self, nrows):
        """Ends the sampling there and returns its series: (wall-clock times here, a list;
        stats, a numpy QStat array of samples x `nrows`; bias, int64 of that shape)."""
        import numpy as np

        walls, stats, bias = [], [], []
        while True:
            chunk = self._ask({"samples": len(walls)}, "samples")
            if not (isinstance(chunk, dict) and set(chunk) == {"wall", "stats", "bias", "left"}
                    and isinstance(chunk["wall"], list) and _int(chunk["left"], 0, MAX_SAMPLES + 2)
                    and all(isinstance(w, (int, float)) and math.isfinite(w) for w in chunk["wall"])
                    and len(walls) + len(chunk["wall"]) <= MAX_SAMPLES + 1):
                raise LabError(f"queue model on {self.machine.name}: malformed samples")
            n = len(chunk["wall"])
            stats.append(self._inflate(chunk["stats"], n * nrows * ctypes.sizeof(QStat)))
            bias.append(self._inflate(chunk["bias"], n * nrows * 8))
            walls += [w - self.offset_s for w in chunk["wall"]]
            if not chunk["left"] or not n:
                break
        if any(b < a for a, b in zip(walls, walls[1:])):
            raise LabError(f"queue model on {self.machine.name}: samples out of order")
        return (walls, np.frombuffer(b"".join(stats), dtype=np.dtype(QStat)).reshape(len(walls), nrows),
                np.frombuffer(b"".join(bias), dtype=np.int64).reshape(len(walls), nrows))

    def _inflate(self, text, size):
        """base64 of zlib, `size` bytes once inflated, and not one more."""
        try:
            inflater = zlib.decompressobj()
            data = inflater.decompress(base64.b64decode(text, validate=True), size + 1)
        except (ValueError, TypeError, zlib.error):
            data = None
        if data is None or len(data) != size or inflater.unconsumed_tail:
            raise LabError(f"queue model on {self.machine.name}: samples not of this fabric's size")
        return data

    def errors(self):
        return self._ask("errors", "errors") + self.errors_here

    def leak_repairs(self, since_ns=0):
        return self._dated(self._ask({"repairs": self._there(since_ns)}, "repairs"))

    def reaction_stats(self, since_ns=0):
        return self._ask({"reaction": self._there(since_ns)}, "reaction")

    def _dated(self, records):
        """Records from there with `t_ns` on this machine's monotonic clock again (from their age,
        less half the round trip the answer took); a record without a sane age has none."""
        if not isinstance(records, list):
            raise LabError(f"queue model on {self.machine.name}: a malformed reply")
        now = time.monotonic_ns() - int((self.round_trip_s or 0.0) * 5e8)
        dated = []
        for r in records:
            if not isinstance(r, dict):
                raise LabError(f"queue model on {self.machine.name}: a malformed reply")
            age = r.pop("age_ns", None)
            dated.append({**r, "t_ns": now - age if _int(age, 0, MAX_AGE_NS) else None})
        return dated

    def _there(self, since_ns):
        """A time.monotonic_ns() here as a wall-clock time there."""
        return time.time() - (time.monotonic_ns() - since_ns) / 1e9 + self.offset_s

    def close(self):
        self.talk.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
