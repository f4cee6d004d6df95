"""`fabriclab capture`: packets of a live run's ports into one pcapng file (or stdout, for
`| wireshark -k -i -`), one interface per port.

One tcpdump per port, in the port's network namespace (a host's port in its host's: the run
records each host's shell, `mininet:<host>`, and the capture enters that shell's namespace only
while it still runs that command), writing pcap with nanosecond stamps to a pipe; this process
merges the streams into pcapng. It stops at the packet count, the time limit, Ctrl-C, or when the
run ends. The tcpdumps die with this process (PR_SET_PDEATHSIG), so a killed capture leaves none.
"""

from __future__ import annotations

import ctypes
import math
import os
import pathlib
import signal
import subprocess
import threading
import time

from fabriclab.errors import LabError
from fabriclab.lab.runstate import RunState
from fabriclab.loading import clip, excerpt
from fabriclab.measure import pcapng
from fabriclab.system import procs

MAX_PORTS = 64
MAX_FILTER_CHARS = 2000
MAX_SECONDS = 7 * 86400.0
READY_TIMEOUT_S = 10.0                 # tcpdump opens its socket and says "listening on" in ms
PR_SET_PDEATHSIG = 1


def live_run(run_id=None):
    """The run to capture from: `run_id`, or the only live run there is."""
    if run_id is not None:
        if not RunState.valid_id(run_id):
            raise LabError(f"--run {excerpt(run_id)}: not a run id (`fabriclab clean --list` shows the runs)")
        runs = [r for r in RunState.all() if r.id == run_id]
        if not runs or not runs[0].live:
            raise LabError(f"run {run_id} is not running")
        return runs[0]
    live = [r for r in RunState.all() if not r.data.get("corrupt") and r.live]
    if not live:
        raise LabError("no run is running: start one (`fabriclab up SPEC`), then capture its ports")
    if len(live) > 1:
        raise LabError(f"{len(live)} runs are running ({', '.join(r.id for r in live[:4])}): choose one with --run")
    return live[0]


def interfaces_in(pid):
    """The interface names of `pid`'s network namespace (/proc/PID/net/dev), None once it is gone."""
    try:
        lines = pathlib.Path(f"/proc/{pid}/net/dev").read_text().splitlines()[2:]
    except OSError:
        return None
    return {line.split(":", 1)[0].strip() for line in lines if ":" in line}


def resolve_ports(run, names):
    """[(port, namespace pid or None for this machine's own)], checked against the run: a switch
    port is one of the run's recorded interfaces, a host's port is in its host's namespace."""
    if not names:
        raise LabError("name at least one port to capture (`ports` at the prompt lists them)")
    if len(names) > MAX_PORTS:
        raise LabError(f"{len(names)} ports: capture takes at most {MAX_PORTS} at once")
    if len(set(names)) != len(names):
        raise LabError("a port is named twice")
    shells = {p["match"].split(":", 1)[1]: p["pid"] for p in run.data.get("processes", [])
              if p.get("role") == "host-shell" and str(p.get("match", "")).startswith("mininet:")}
    root = set(run.data.get("interfaces", []))
    out = []
    for name in names:
        if name in root:
            if name not in (interfaces_in(1) or ()):
                raise LabError(f"port {excerpt(name)} of run {run.id} is not on this machine (or not up yet)")
            out.append((name, None))
            continue
        node = name.split("-", 1)[0]
        pid = shells.get(node)
        if pid is None or name not in (interfaces_in(pid) or ()) or not procs.pid_runs(pid, f"mininet:{node}"):
            switch_ports = ", ".join(sorted(root)[:4]) or "none"
            host_ports = ", ".join(f"{host}-n0" for host in sorted(shells)[:2]) or "none"
            raise LabError(f"run {run.id} has no port {excerpt(name)} here (switch ports such as "
                           f"{switch_ports}; host ports such as {host_ports})")
        out.append((name, pid))
    return out


def check_limits(count=None, seconds=None, snaplen=None, bpf=None):
    if count is not None and not 1 <= count <= 10**9:
        raise LabError("--count must be 1 to 1e9 packets")
    if seconds is not None and not (math.isfinite(seconds) and 0 < seconds <= MAX_SECONDS):
        raise LabError("--seconds must be above 0 and at most a week")
    if snaplen is not None and not 64 <= snaplen <= pcapng.MAX_SNAPLEN:
        raise LabError(f"--snaplen must be 64 to {pcapng.MAX_SNAPLEN} bytes")
    if bpf is not None:
        if len(bpf) > MAX_FILTER_CHARS or not bpf.isprintable():
            raise LabError(f"--filter must be a printable BPF expression of at most {MAX_FILTER_CHARS} characters")
        if bpf.lstrip().startswith("-"):
            raise LabError(f"--filter {excerpt(bpf)}: a BPF expression does not start with '-'")


def _die_with_parent():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class Capture:
    """Captures `ports` ([(name, namespace pid or None)]) of `run` into `out` (a binary stream).
    `start()` returns once every tcpdump listens (LabError, with nothing left running, if one
    refused: a filter that does not compile, a port gone); `wait()` returns the summary."""

    def __init__(self, run, ports, out, bpf=None, count=None, seconds=None, snaplen=None):
        check_limits(count, seconds, snaplen, bpf)
        self.run, self.ports, self.out = run, ports, out
        self.bpf, self.count, self.seconds = bpf, count, seconds
        self.snaplen = snaplen or pcapng.MAX_SNAPLEN
        self.procs, self.readers, self.errors = [], [], []
        self.lock = threading.Lock()
        self.packets = 0
        self.per_port = [0] * len(ports)
        self.done = threading.Event()
        self.reason = None
        self.closed_pipe = False
        self.result = None                    # wait()'s summary, once it returned

    def _command(self, name, pid):
        cmd = ["tcpdump", "-i", name, "-n", "-U", "-w", "-", "-s", str(self.snaplen),
               "--time-stamp-precision=nano"]
        if self.count:
            cmd += ["-c", str(self.count)]
        if self.bpf:
            cmd += ["--", self.bpf]
        return cmd if pid is None else ["nsenter", f"--net=/proc/{pid}/ns/net", "--"] + cmd

    def start(self):
        try:
            for name, pid in self.ports:
                self.procs.append(subprocess.Popen(self._command(name, pid), stdin=subprocess.DEVNULL,
                                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                   preexec_fn=_die_with_parent))
            for (name, _pid), proc in zip(self.ports, self.procs):
                self._await_listening(name, proc)
        except BaseException:
            self._stop_all()
            raise
        self._write(pcapng.section_header(f"fabriclab capture, run {self.run.id}"))
        for name, pid in self.ports:
            where = "this machine" if pid is None else f"the namespace of {name.split('-', 1)[0]}"
            self._write(pcapng.interface_description(name, f"run {self.run.id}, {where}",
                                                     snaplen=self.snaplen))
        for index, proc in enumerate(self.procs):
            thread = threading.Thread(target=self._pump, args=(index, proc), daemon=True)
            thread.start()
            self.readers.append(thread)
        return self

    def _await_listening(self, name, proc):
        """Read tcpdump's stderr until it says it listens; LabError with its first complaint if it
        exits first (a filter that does not compile, an interface gone)."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        lines = []
        while time.monotonic() < deadline:
            line = proc.stderr.readline().decode(errors="replace")
            if not line:
                break
            if "listening on" in line:
                threading.Thread(target=self._drain_stderr, args=(proc,), daemon=True).start()
                return
            lines.append(line.strip())
        proc.kill()
        said = next((line for line in lines if line), "it said nothing")
        raise LabError(f"tcpdump on {name} refused: {clip(said.removeprefix('tcpdump: '), 120)}")

    def _drain_stderr(self, proc):
        tail = proc.stderr.read().decode(errors="replace")
        for line in tail.splitlines():
            if "dropped by kernel" in line and not line.strip().startswith("0 "):
                with self.lock:
                    self.errors.append(line.strip())

    def _write(self, data):
        if self.closed_pipe:
            return
        try:
            self.out.write(data)
            self.out.flush()
        except BrokenPipeError:               # `| wireshark` closed: nobody left to read
            self.closed_pipe = True
            self._finish("the reader closed the pipe")

    def _pump(self, index, proc):
        try:
            reader = pcapng.PcapReader(proc.stdout)
            if reader.linktype != pcapng.LINKTYPE_ETHERNET:
                raise pcapng.FormatError(f"link type {reader.linktype}, not Ethernet")
            for ts_ns, length, data in reader.packets():
                with self.lock:
                    if self.done.is_set():
                        return
                    self._write(pcapng.enhanced_packet(index, ts_ns, length, data))
                    self.packets += 1
                    self.per_port[index] += 1
                    if self.count and self.packets >= self.count:
                        self._finish(f"{self.count} packets")
        except (pcapng.FormatError, OSError, ValueError) as exc:
            if not self.done.is_set():
                with self.lock:
                    self.errors.append(f"{self.ports[index][0]}: {exc}")

    def stop(self, reason):
        """End the capture from another thread; wait() returns its summary."""
        self._finish(reason)

    def _finish(self, reason):
        if self.reason is None:
            self.reason = reason
        self.done.set()

    def wait(self, poll_s=0.2):
        """Until the count, the time limit, the run's end or every tcpdump's; the summary dict."""
        started = time.monotonic()
        try:
            while not self.done.wait(poll_s):
                if self.seconds and time.monotonic() - started >= self.seconds:
                    self._finish(f"{self.seconds:g} s")
                elif not self.run.live:
                    self._finish(f"run {self.run.id} ended")
                elif all(proc.poll() is not None for proc in self.procs) and \
                        not any(t.is_alive() for t in self.readers):
                    self._finish("every tcpdump ended")
        except KeyboardInterrupt:
            self._finish("interrupted")
        finally:
            self._stop_all()
        self.result = {"packets": self.packets, "ports": dict(zip((n for n, _ in self.ports), self.per_port)),
                       "seconds": round(time.monotonic() - started, 3), "stopped": self.reason,
                       "problems": list(self.errors)}
        return self.result

    def _stop_all(self):
        procs.end_children(self.procs)
        self.done.set()
        for thread in self.readers:
            thread.join(timeout=5)


def start(run, names, path, **options):
    """A started Capture of the ports `names` (checked against `run`, resolve_ports) into `path`
    ("-" or None: stdout, refused on a terminal) and its open output, which the caller closes once
    wait() returned. Limits and ports are checked before the output is opened; if the capture does
    not start, a file it created is removed again."""
    check_limits(options.get("count"), options.get("seconds"), options.get("snaplen"), options.get("bpf"))
    ports = resolve_ports(run, names)
    if path in (None, "-"):
        if os.isatty(1):
            raise LabError("pcapng is binary: give -w FILE, or pipe it (`| wireshark -k -i -`, `| tshark -r -`)")
        out, created = os.fdopen(os.dup(1), "wb"), None
    else:
        created = None if os.path.exists(path) else path
        try:
            out = open(path, "wb")
        except OSError as exc:
            raise LabError(f"-w {excerpt(str(path))}: {exc.strerror}") from None
    try:
        return Capture(run, ports, out, **options).start(), out
    except BaseException:
        out.close()
        if created:
            os.unlink(created)
        raise
