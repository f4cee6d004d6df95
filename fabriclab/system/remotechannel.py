"""A helper process of the lab on another machine of a cluster, spoken to in JSON lines over the
lab's SSH connection: `python -m MODULE ARGS` there, its input and output here. A helper on this
machine (machine None: the PFC agent, queues/agentproc.py) is spoken to the same way over pipes.

The helpers are the port sampler (cluster/remotesampler.py), the counter reader
(cluster/remotecounters.py) and the loss stage (cluster/remoteloss.py). Those that date what they read
answer "clock" with {"wall": time.time()} there, which measures the other clock's offset from this
one: the exchange with the shortest round trip counts, its reading set at that trip's middle. The
input ending is how a helper ends, with the run or with a dropped connection.
"""

from __future__ import annotations

import json
import queue
import shlex
import subprocess
import sys
import threading
import time

from fabriclab.errors import LabError

MAX_LINE = 1 << 20
CLOCK_EXCHANGES = 5


class Channel:
    """`python -m module args` on `machine` (a cluster Machine with its SSH connection up; None:
    this machine, in this interpreter's Python); errors are LabErrors starting with `what` ("port
    sampler on m2")."""

    def __init__(self, machine, module, args, what):
        self.machine, self.what = machine, what
        if machine is None:
            argv = [sys.executable, "-m", module, *args]
        else:
            argv = [*machine.ssh_argv(), shlex.join([machine.python, "-m", module, *args])]
        # its own session: a Ctrl-C at the lab's terminal is the lab's to handle, not the helper's
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)

    @classmethod
    def opened(cls, machine, module, args, what, record=None, first=(), then=None):
        """The helper started and ready: the lines `first` sent before it answers, `record(pid)`
        told of its process, `then(channel)` run once it is ready; closed again if any of it fails."""
        channel = cls(machine, module, args, what)
        try:
            for line in first:
                channel.send(line)
            channel.ready(record)
            if then is not None:
                then(channel)
        except BaseException:
            channel.close()
            raise
        return channel

    def send(self, line):
        try:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            raise LabError(f"{self.what}: {self.why()}") from None

    def read(self, limit=MAX_LINE):
        """The next line, a JSON object (LabError for anything else or none)."""
        line = self.proc.stdout.readline(limit)
        try:
            obj = json.loads(line)
        except ValueError:
            obj = None
        if not isinstance(obj, dict):
            raise LabError(f"{self.what}: {self.why() if not line else 'a malformed reply'}")
        return obj

    def ask(self, request, limit=MAX_LINE):
        self.send(request if isinstance(request, str) else json.dumps(request))
        return self.read(limit)

    def ready(self, record=None):
        """Wait for {"ready": PID}; `record(pid)` tells the machine's run member of the process."""
        first = self.read()
        if "ready" not in first:
            raise LabError(f"{self.what}: {str(first.get('error') or 'did not start')[:200]}")
        if record is not None and isinstance(first["ready"], int):
            record(first["ready"])

    def clock_offset(self):
        """(the other clock minus this one, s; the round trip it was read in, s)."""
        best = None
        for _ in range(CLOCK_EXCHANGES):
            sent = time.time()
            wall = self.ask("clock").get("wall")
            back = time.time()
            if not isinstance(wall, (int, float)):
                raise LabError(f"{self.what}: no clock reading")
            if best is None or back - sent < best[1]:
                best = (wall - (sent + back) / 2, back - sent)
        return best

    def why(self):
        try:
            self.proc.wait(timeout=1)          # its output ended or its input broke: it is on its way out
        except subprocess.TimeoutExpired:
            return "no answer"
        if getattr(self, "_last_words", None) is None:      # its stderr can be read once: keep what it said
            err = self.proc.stderr.read().strip().splitlines()
            self._last_words = (err or [f"exit code {self.proc.returncode}"])[-1][:200]
        return self._last_words

    def close(self):
        """End its input (so it exits) and wait for it; safe to call more than once."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Conversation:
    """Requests answered one at a time over a channel whose helper may also speak unasked (a
    pause it relays): `unasked(msg)` takes the lines it claims by returning True, every other
    line answers the request waiting. Once the channel ends, every request fails as it did."""

    def __init__(self, what, unasked, timeout_s=60.0):
        self.what, self.unasked, self.timeout_s = what, unasked, timeout_s
        self.channel = None
        self._answers = queue.Queue()
        self._ask_lock = threading.Lock()
        self._send_lock = threading.Lock()

    def attach(self, channel, name):
        """Talk over `channel` (opened), its lines read by a thread called `name`."""
        self.channel = channel
        threading.Thread(target=self.read_all, args=(channel,), name=name, daemon=True).start()

    def read_all(self, channel):
        """Every line of `channel` until it ends (the reading thread; a test calls it directly)."""
        while True:
            try:
                msg = channel.read(MAX_LINE)
            except LabError as exc:
                self._answers.put(exc)
                return
            if not self.unasked(msg):
                self._answers.put(msg)

    def send(self, line):
        with self._send_lock:
            if self.channel is None:
                raise LabError(f"{self.what}: closed")
            self.channel.send(line if isinstance(line, str) else json.dumps(line))

    def ask(self, request, key):
        """The answer's `key`; LabError for an error answer, no answer, or a channel that ended."""
        with self._ask_lock:
            self.send(request)
            try:
                reply = self._answers.get(timeout=self.timeout_s)
            except queue.Empty:
                raise LabError(f"{self.what}: no answer in {self.timeout_s:.0f} s") from None
        if isinstance(reply, LabError):
            self._answers.put(reply)         # every later request fails the same way
            raise reply
        if key not in reply:
            raise LabError(f"{self.what}: {str(reply.get('error', 'a malformed reply'))[:300]}")
        return reply[key]

    def close(self):
        channel, self.channel = self.channel, None
        if channel is not None:
            channel.close()                  # its input ends: it stops


_say_lock = threading.Lock()


def say(obj):
    """One reply line, on the other machine: whole, whichever of the helper's threads says it."""
    line = json.dumps(obj) + "\n"
    with _say_lock:
        sys.stdout.write(line)
        sys.stdout.flush()


def safe_name(intf):
    """An interface name as the kernel allows it: no path separators, at most 15 bytes."""
    return isinstance(intf, str) and 0 < len(intf) <= 15 and "/" not in intf and intf not in (".", "..")


def pairs_of(value, limit):
    """[(interface, counter)] from a request's list, or None when it is not one."""
    ok = (isinstance(value, list) and 0 < len(value) <= limit
          and all(isinstance(p, list) and len(p) == 2 and all(isinstance(v, str) for v in p) for p in value)
          and all(safe_name(intf) and counter.isidentifier() for intf, counter in value))
    return [tuple(p) for p in value] if ok else None
