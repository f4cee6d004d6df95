"""Runs an all-pairs traffic plan on a live lab: one agent per host, a shared start time, bounded
waits.

The launcher writes each host's agent config into the run folder, starts the agents inside the
hosts' namespaces, reads the switch counters at the start and the end of the steady state, and
gathers every agent's result. An agent that fails is named with its host and its own error line;
nothing waits forever. Faults during the traffic and sampling over time are the pipeline's
(fabriclab.workflows.pipeline): this module only moves the packets.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass, field

from fabriclab.measure import cpuload, telemetry
from fabriclab.errors import LabError
from fabriclab.system import patience
from fabriclab.traffic import agent_process, roce

AGENT_MODULE = "fabriclab.traffic.generator"
READY_TIMEOUT_S = 10.0   # agents here: every one has said ready by then (times the patience factor)
MAX_RESULT_BYTES = 64 << 20
LATE_START_S = 0.05      # an agent starting later than this is reported (results: late_start_s)
LINGER_S = 1.0
# Where no PFC pause can hold packets back (no queue model), a receiver ends its linger once nothing
# has come for QUIET_S, or for QUIET_PACKETS of its slowest incoming flow's packet gaps if longer:
# what is still in flight then drains from shaping queues and OVS in milliseconds, arriving all
# the while. Most of a run's second of linger was spent waiting for nothing.
QUIET_S = 0.25
QUIET_PACKETS = 4
PROGRESS_EVERY_S = 0.25


@dataclass
class TrafficRun:
    plan: dict
    duration_s: float
    start_mono: float
    results: dict = field(default_factory=dict)      # host -> agent result
    window: tuple = ()                              # (before, after) snapshots of the steady state
    payload_bytes: int = 0                           # RDMA payload per packet (RoCE path MTU)
    message_bytes: int = 0                           # one RDMA WRITE, split into packets
    start_wall: float = 0.0                          # unix time the agents started sending

    def flow_rows(self):
        """Per flow: sent and received bytes, loss, out-of-sequence, delivered Mbit/s."""
        received = {}
        for result in self.results.values():
            for rec in result.get("received", []):
                received[(rec["src"], rec["dst"], rec["dst_qpn"])] = rec
        rows = []
        for host, flows in self.plan.items():
            sent = self.results.get(host, {}).get("sent", {})
            for flow in flows:
                s = sent.get(flow["id"], {})
                r = received.get((flow["src"], flow["dst"], flow["dst_qpn"]), {})
                tx, rx = s.get("packets", 0), r.get("packets", 0)
                rows.append({
                    "id": flow["id"], "src": flow["src"], "dst": flow["dst"],
                    "rate_mbps": flow["rate_mbps"],
                    "sent_packets": tx, "received_packets": rx,
                    "loss": round(1 - rx / tx, 5) if tx else None,
                    "oos": r.get("oos", 0),       # PSN gaps and reordering (an RNIC's OOS)
                    "late": r.get("late", 0),     # arrived behind a later PSN: reordering only
                    "delivered_mbps": round(r.get("wire_bytes", 0) * 8 / self.duration_s / 1e6, 4),
                })
        return rows

    def late_starts(self):
        """{host: seconds} of agents that began sending after the common start (a machine too
        loaded or too slow to start them within the margin): their flows ran that much shorter."""
        out = {}
        for host, result in sorted(self.results.items()):
            late = result.get("late_start_s")
            if isinstance(late, (int, float)) and late > LATE_START_S:
                out[host] = round(float(late), 3)
        return out

    def cpu(self):
        """CPU load over the steady-state window: machine and OVS's forwarding thread."""
        return cpuload.between(self.window[0]["cpu"], self.window[1]["cpu"])

    def totals(self):
        rows = self.flow_rows()
        sent = sum(r["sent_packets"] for r in rows)
        received = sum(r["received_packets"] for r in rows)
        return {"flows": len(rows), "sent_packets": sent, "received_packets": received,
                "loss": round(1 - received / sent, 5) if sent else None,
                "oos": sum(r["oos"] for r in rows),
                "late": sum(r["late"] for r in rows),
                "delivered_mbps": round(sum(r["delivered_mbps"] for r in rows), 3)}



def resolve_neighbours(lab, plan, timeout_s=2):
    """One ping per (source, destination) of the plan, all in parallel (every host at once),
    before timing.

    The controller answers ARP, and hundreds of QPs starting at once would otherwise spend their
    first second queued behind neighbour resolution (what a collective's warm-up hides too).
    Returns the pairs that did not answer.
    """
    procs = []
    for host, flows in plan.items():
        pairs = sorted({(f["src"], f["dst"]) for f in flows})
        if not pairs:
            continue
        script = " ".join(f"(ping -n -q -c1 -W{timeout_s} -I {s} {d} >/dev/null || echo '{s}>{d}') &"
                          for s, d in pairs)
        procs.append(lab.net.get(host).popen(["sh", "-c", script + " wait"], stdin=subprocess.DEVNULL,
                                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL))
    unanswered = []
    for proc in procs:
        out, _ = proc.communicate()
        unanswered += [line.strip() for line in out.decode().splitlines() if ">" in line and "ping" not in line]
    return unanswered


def quiet_periods(lab, plan, payload_bytes):
    """{host: quiet_s} for its receiver's linger (traffic/generator.py); {} (linger it all) where
    the queue model's PFC may pause a port for longer than any gap between arrivals."""
    if getattr(lab, "queues", None) is not None:
        return {}
    host_of = {port.ip: name for name, host in lab.fabric.hosts.items() for port in host.ports}
    frame_bits = (payload_bytes + roce.ROCE_OVERHEAD + roce.RETH_LEN + roce.ETH_HEADER_LEN) * 8
    quiet = dict.fromkeys(lab.fabric.hosts, QUIET_S)
    for flows in plan.values():
        for flow in flows:
            host = host_of.get(flow["dst"])
            if host is not None and flow.get("rate_mbps"):
                gap = frame_bits / (flow["rate_mbps"] * 1e6)
                quiet[host] = max(quiet[host], QUIET_PACKETS * gap)
    return {host: round(min(q, LINGER_S), 4) for host, q in quiet.items()}


def run_traffic(lab, plan, duration_s=5.0, payload_bytes=None, message_bytes=65536,
                sport_mode="qp", settle_s=0.5, progress=None, warm_up=True, on_start=None, cancel=None):
    """Run `plan` ({host: [flow]}) for duration_s; returns a TrafficRun.

    The steady-state window for link utilization starts `settle_s` after the start and ends at
    the end of sending, so start-up and drain do not dilute the averages. `on_start(unix time)` is
    called once the agents are launched, with the time they begin sending. `cancel`, an Event set
    from another thread (Ctrl-C in the main one), ends the run at once with its agents killed.
    """
    if duration_s <= 0:
        raise LabError(f"duration must be > 0 s, got {duration_s}")
    if settle_s >= duration_s:
        settle_s = 0.0
    for host in plan:
        lab.host(host)       # a LabError naming any host the fabric does not have
    if payload_bytes is None:
        payload_bytes = roce.path_mtu_for(lab.fabric.spec.mtu)
    if warm_up:
        resolve_neighbours(lab, plan)
    folder = lab.run.path("traffic")
    folder.mkdir(exist_ok=True)
    files = {}
    quiet = quiet_periods(lab, plan, payload_bytes)
    # Every config is in place (on its host's machine) before the start time is set.
    for host in lab.fabric.hosts:
        config = {"listen": True, "flows": plan.get(host, []), "start_at": None,
                  "duration_s": duration_s, "payload_bytes": payload_bytes,
                  "message_bytes": message_bytes, "linger_s": LINGER_S, "quiet_s": quiet.get(host),
                  "sport_mode": sport_mode}
        files[host] = cfg, out = folder / f"{host}.json", folder / f"{host}.result.json"
        cfg.write_text(json.dumps(config))
        agent_process.prepare(lab, host, [cfg], [out])
    procs = {}
    try:
        # Each agent says ready once its sockets are open, then all start at once: one here reads
        # its start time on stdin, one on another machine from a file written there.
        for host, (cfg, out) in files.items():
            procs[host] = (agent_process.start(lab, host, AGENT_MODULE, ["--config", cfg, "--out", out],
                                               "traffic-agent", gate=True), out)
        ready_by = time.monotonic() + agent_process.ready_timeout_s(lab, files, AGENT_MODULE,
                                                                    patience.scaled(READY_TIMEOUT_S))
        for host, (proc, _out) in procs.items():
            agent_process.wait_ready(proc, f"traffic agent on {host}", ready_by)
        start_unix = agent_process.release([proc for proc, _out in procs.values()])
        start_mono = time.monotonic() + (start_unix - time.time())
        run = TrafficRun(plan, duration_s, start_mono, payload_bytes=payload_bytes, message_bytes=message_bytes,
                         start_wall=start_unix)
        if on_start is not None:
            on_start(start_unix)
        end = start_mono + duration_s
        window_start = start_mono + settle_s
        before = None
        while time.monotonic() < end:
            now = time.monotonic()
            if cancel is not None and cancel.is_set():
                raise LabError("traffic cancelled")
            for host, (proc, _out) in procs.items():
                if proc.poll() not in (None, 0):
                    raise LabError(f"traffic agent on {host} exited early: {_why(proc)}")
            if before is None and now >= window_start:
                before = telemetry.lab_snapshot(lab)
            if progress:
                progress(min(1.0, max(0.0, (now - start_mono) / duration_s)))
            wake = window_start if before is None else end
            time.sleep(max(0.0, min(wake, end, now + PROGRESS_EVERY_S) - time.monotonic()))
        after = telemetry.lab_snapshot(lab)
        run.window = (before or after, after)
        deadline = time.monotonic() + LINGER_S + 15.0
        for host, (proc, out) in procs.items():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise LabError(f"traffic agent on {host} did not finish within "
                               f"{LINGER_S + 15.0:.0f} s after the run") from None
            if proc.returncode not in (0, 1):
                raise LabError(f"traffic agent on {host} failed: {_why(proc)}")
            try:
                run.results[host] = json.loads(agent_process.read_output(lab, host, out, MAX_RESULT_BYTES))
            except (OSError, ValueError, LabError):
                raise LabError(f"traffic agent on {host} wrote no result: {_why(proc)}") from None
            if not isinstance(run.results[host], dict):
                raise LabError(f"traffic agent on {host} wrote a malformed result")
            if run.results[host].get("errors"):
                raise LabError(f"traffic agent on {host}: {run.results[host]['errors'][0]}")
    finally:
        agent_process.call_off([proc for proc, _out in procs.values()])
        for proc, _out in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return run


def _why(proc):
    return agent_process.last_error_line(proc) or f"exit code {proc.returncode}"
