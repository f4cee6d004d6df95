"""The controller process: one os-ken runtime per run, on loopback, started and stopped by the lab.

The lab talks to it through the run folder's control files (fabriclab.apps.control owns them): it
writes the fabric before the start and reads the status the app publishes, waiting (bounded) for
what it needs, such as the fabric being programmed.
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

from fabriclab.loading import excerpt
from fabriclab.system import patience
from fabriclab.system.procs import listens
from fabriclab.apps import RoutingError, control
from fabriclab.apps.choice import Routing
from fabriclab.errors import LabError

RUNNER_MODULE = "fabriclab.apps.runner"
# The status file is re-read this often while the lab waits: a link failover is reprogrammed in
# about 15 ms (50 ms polls made it 56 ms), and reading a 6 KB status takes about 40 us.
POLL_S = 0.005


def check_app(routing):
    """The Routing of a choice such as `flowlet:gap_us=500` (a Routing as it is); LabError if bad."""
    try:
        return Routing.parse(routing)
    except RoutingError as exc:
        raise LabError(str(exc)) from None


def connected_switches(listen, port):
    """How many bridges OVS reports connected to the controller at tcp:LISTEN:PORT (their
    Controller rows' is_connected): what the lab knows of an app that publishes no status."""
    out = subprocess.run(["ovs-vsctl", "--timeout=5", "--format=json", "--columns=is_connected", "find",
                          "Controller", f'target="tcp:{listen}:{port}"'], capture_output=True, text=True)
    if out.returncode != 0:
        raise LabError(f"ovs-vsctl could not list the controller connections: {out.stderr.strip()[:120]}")
    return sum(1 for row in json.loads(out.stdout).get("data", []) if row == [True])


def retarget(bridges, listen, port):
    """Point the controller of each of `bridges` (the lab's own, by name) at tcp:LISTEN:PORT in one
    transaction. OVS connects to a new target at once; a controller restarted on the same target
    is reached only when the switch's reconnect backoff ends (a second or more)."""
    target = f'target="tcp:{listen}:{port}"'
    args = [arg for bridge in bridges for arg in ("--", "set", "Controller", bridge, target)]
    out = subprocess.run(["ovs-vsctl", "--timeout=30", *args], capture_output=True, text=True)
    if out.returncode != 0:
        said = (out.stderr.strip().splitlines() or ["no reason given"])[0][:120]
        raise LabError(f"ovs-vsctl could not point the switches at the new controller: {said}")


def free_port(address="127.0.0.1"):
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def summarize_stacks(text, limit=900):
    """faulthandler's dump of all threads, one line: per thread its three innermost frames
    (file:line function), identical threads counted once."""
    threads = []
    for block in re.split(r"\n\s*\n", text.strip()):
        frames = re.findall(r'File "([^"]+)", line (\d+) in (\S+)', block)
        if frames:
            threads.append(" < ".join(f"{os.path.basename(path)}:{line} {func}" for path, line, func in frames[:3]))
    counts = collections.Counter(threads)
    return "; ".join(t + (f" (x{n})" if n > 1 else "") for t, n in counts.items())[:limit]


class Controller:
    def __init__(self, routing, fabric, run, listen="127.0.0.1"):
        """`listen`: the one address OpenFlow is served on (loopback: a cluster's other machines
        reach it through their SSH connection, Cluster.forward_controller)."""
        self.routing = check_app(routing)
        self.app, self.options = self.routing.name, dict(self.routing.settings)
        # an os-ken app of one's own, or a controller the lab does not start: no status file, only
        # the switches' connections to wait for
        self.external = self.routing.external
        self.foreign = self.routing.foreign
        self.listen = listen
        self.fabric = fabric
        self.run = run
        self.port = None
        self.proc = None
        self.files = control.RunFiles(run.dir)
        self.log_path = run.path("controller.log")

    def start(self, timeout=20.0):
        if self.external:
            return self._reach_external(timeout)
        timeout = patience.scaled(timeout)
        control.write_text(self.files.fabric, self.fabric.to_json())
        self.port = self.port or free_port(self.listen)      # a restart keeps the port the switches know
        log = open(self.log_path, "a")
        env = dict(os.environ, OSKEN_HUB_TYPE="native")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", RUNNER_MODULE,
             *control.command_line(self.app, self.options, self.run.dir, self.port, self.run.id, self.listen)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True)   # Ctrl-C at the prompt must not reach the controller
        log.close()
        self.run.add_process(self.proc.pid, "controller", RUNNER_MODULE)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise LabError(f"controller app {excerpt(self.app)} exited with code {self.proc.returncode}: "
                               f"{self.last_log_line()}")
            try:
                with socket.create_connection((self.listen, self.port), timeout=0.5):
                    pass
            except OSError:
                time.sleep(0.1)
                continue
            # The port was free when chosen; whatever answers on it now must be the controller.
            if listens(self.proc.pid, self.port):
                return
            raise LabError(f"{self.listen}:{self.port} answers, but not from the controller (pid "
                           f"{self.proc.pid}): another program took the port; run again")
        raise LabError(f"controller app {excerpt(self.app)} did not listen on {self.listen}:{self.port} "
                       f"within {timeout:.0f} s (log: {self.log_path})")

    def _reach_external(self, timeout):
        """A controller the lab does not start: something must accept connections at its address
        before any switch is built."""
        target = self.routing.info.external
        host, _, port = target[len("tcp:"):].rpartition(":")
        self.listen, self.port = host, int(port)
        deadline = time.monotonic() + min(timeout, 5.0)
        while True:
            try:
                with socket.create_connection((host, self.port), timeout=1.0):
                    return
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise LabError(f"no controller answers at {target}: {exc.strerror or exc}") from None
                time.sleep(0.2)

    def last_log_line(self):
        try:
            lines = [line for line in self.log_path.read_text().splitlines() if line.strip()]
        except OSError:
            return "no log"
        return lines[-1] if lines else "empty log"

    def alive(self):
        if self.external:
            return True                # not the lab's to watch: the switches' connections say it
        return self.proc is not None and self.proc.poll() is None

    def snapshot(self):
        """The status the app last published (control.Status; empty before the first)."""
        return control.read_status(self.files.status)

    def status(self):
        """The same as its JSON document, for display (the prompt's `ctl`)."""
        return self.snapshot().to_json()

    def wait(self, predicate, timeout, what, explain=None):
        """Re-read the status until predicate(control.Status) holds and return that Status;
        LabError naming `what` otherwise, with `explain(missing switches)` appended."""
        if self.foreign:
            raise LabError(f"waiting for {what}: {excerpt(self.app)} publishes no status (only the lab's "
                           f"own routing apps do)")
        timeout = patience.scaled(timeout)
        deadline = time.monotonic() + timeout
        status = control.Status()
        while time.monotonic() < deadline:
            if not self.alive():
                raise LabError(f"controller exited while waiting for {what}: {self.last_log_line()}")
            status = self.snapshot()
            if status.pid == self.proc.pid and predicate(status):     # this process's, not a predecessor's
                return status
            time.sleep(POLL_S)
        missing = sorted(set(self.fabric.switches) - set(status.connected))
        detail = f"; switches not connected: {', '.join(missing[:5])}" if missing else ""
        if status.time:
            detail += f"; its last status is {max(0.0, time.time() - status.time):.0f} s old"
        if missing and explain is not None:
            detail += explain(missing[:5])
        stacks = self.thread_stacks()
        if stacks:
            detail += f"; its threads wait in: {stacks}"
        raise LabError(f"timed out after {timeout:.0f} s waiting for {what}{detail} (log: {self.log_path})")

    def thread_stacks(self):
        """Where the controller's threads are, in one line: a SIGUSR1 makes it write their stacks to
        its log (apps/runner.py); "" when it cannot be asked."""
        try:
            start = self.log_path.stat().st_size
            os.kill(self.proc.pid, signal.SIGUSR1)
        except OSError:
            return ""
        time.sleep(1.0)
        try:
            with open(self.log_path, "rb") as log:
                log.seek(start)
                text = log.read(1 << 20).decode(errors="replace")
        except OSError:
            return ""
        return summarize_stacks(text)

    def wait_programmed(self, timeout=30.0, after_generation=-1, explain=None):
        """Until the app programmed the fabric; for an os-ken app of one's own or an external
        controller, until OVS reports every switch of the fabric connected to it."""
        if not self.foreign:
            return self.wait(lambda s: s.programmed and s.generation > after_generation,
                             timeout, "the controller to program the fabric", explain)
        want, got = len(self.fabric.switches), 0
        deadline = time.monotonic() + patience.scaled(timeout)
        while time.monotonic() < deadline:
            if not self.alive():
                raise LabError(f"os-ken app {excerpt(self.app)} exited: {self.last_log_line()}")
            got = connected_switches(self.listen, self.port)
            if got >= want:
                return control.Status()
            time.sleep(0.1)
        where = "" if self.external else f" (log: {self.log_path})"
        raise LabError(f"timed out after {timeout:.0f} s: {got} of {want} switches connected to "
                       f"{excerpt(self.app)}{where}")

    def stop(self, timeout=5.0):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
