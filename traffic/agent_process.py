"""The launchers' side of an agent process: started inside a host's network namespace, recorded
in the run before anything else can happen to it (so `clean` finds it after a crash), and, when
it fails, its last line on stderr. A host on another machine of a cluster runs its agent there,
so its input files are copied there first and its output read back from there."""

from __future__ import annotations

import json
import os
import select
import shlex
import subprocess
import sys
import time
import uuid

from fabriclab.errors import LabError
from fabriclab.loading import excerpt
from fabriclab.system import patience
from fabriclab.traffic import start_gate


def _elsewhere(lab, host):
    """(cluster, machine) when `host` runs on another machine of the lab's cluster, else None."""
    cluster = getattr(lab, "cluster", None)
    machine = cluster.machine_of_name(host) if cluster is not None else None
    return (cluster, machine) if machine is not None and not machine.local else None


def prepare(lab, host, inputs, outputs=()):
    """Put `inputs` (files of the run's folder, written here) where `host`'s agent reads them, and
    remove an earlier agent's `outputs` there, so none is taken for this one's."""
    for out in outputs:
        out.unlink(missing_ok=True)
    away = _elsewhere(lab, host)
    if away is not None:
        cluster, machine = away
        for i, path in enumerate(inputs):
            cluster.push(machine, path, path.read_text(), remove=outputs if i == 0 else ())


# An agent on another machine of a cluster starts through an SSH session and that machine's Python
# (an emulated guest's takes seconds): launchers wait this many times what that took for it to be
# ready, before calling it stuck.
REMOTE_START_FACTOR = 1.5


# Gated agents (traffic/start_gate.py) start this long after the last said ready: each is waiting in
# select() on its stdin, and a traffic agent still forks its receiver in that time.
GO_MARGIN_S = 0.1
# ...and, when some run on other machines, this much longer (times the patience factor): their
# start time is written there over the lab's SSH connection, one command per machine.
REMOTE_GO_S = 1.0


def ready_timeout_s(lab, hosts, module, base_s):
    """How long agents of `module` on `hosts` may take to say ready: `base_s`, plus
    REMOTE_START_FACTOR times what starting it once took on the slowest other machine they use."""
    cluster = getattr(lab, "cluster", None)
    if cluster is None:
        return base_s
    return base_s + REMOTE_START_FACTOR * max((cluster.agent_start_s(m, module)
                                               for m in cluster.remote_machines(hosts)), default=0.0)


def clock_offset_s(lab, host):
    """`host`'s machine's wall clock minus this one's (0 here): a start time for its agent is
    given on its clock, and times it reports are set back onto this one."""
    away = _elsewhere(lab, host)
    return 0.0 if away is None else away[0].clock_offset_s(away[1])


def read_output(lab, host, path, limit, binary=False):
    """The text (bytes if `binary`) of an output file `host`'s agent wrote (OSError when there
    is none here)."""
    away = _elsewhere(lab, host)
    if away is None:
        return path.read_bytes() if binary else path.read_text()
    cluster, machine = away
    return cluster.pull(machine, path, limit, binary=binary)


def start(lab, host, module, args, role, keep_stdout=False, gate=False):
    """`python -m module args...` in `host`'s namespace; stderr kept, stdout too if asked for.
    `gate`: the agent says ready on stdout (`wait_ready`), then waits for its start time
    (`release`): on stdin here, in a start file on another machine.

    A host on another machine of a cluster runs it there, through the lab's SSH connection (the
    process here is that session; its exit code, stdout and stderr are the agent's), with the
    input files `prepare` put there. Its input is nothing: over SSH, Mininet's mnexec forks away
    from the session, which ends the input at once; an agent is told to stop by a file."""
    away = _elsewhere(lab, host)
    python = away[1].python if away is not None else sys.executable
    args = list(map(str, args))
    start_file = None
    if gate and away is not None:
        # a name of its own, so no earlier run's file is ever read for this one
        path = lab.run.path("gates") / f"{role}-{host}-{uuid.uuid4().hex[:12]}.start"
        start_file = (*away, path, clock_offset_s(lab, host))
        args += [start_gate.FILE_FLAG, str(path)]
    elif gate:
        args.append(start_gate.FLAG)
    proc = lab.net.get(host).popen([python, "-m", module, *args],
                                   stdin=subprocess.PIPE if gate and away is None else subprocess.DEVNULL,
                                   stdout=subprocess.PIPE if keep_stdout or gate else subprocess.DEVNULL,
                                   stderr=subprocess.PIPE)
    proc.start_file = start_file
    lab.run.add_process(proc.pid, role, module)
    return proc


def last_error_line(proc):
    """The last line the process wrote on stderr ("" when none): its own one-line error."""
    try:
        err = proc.stderr.read().decode(errors="replace").strip().splitlines()
    except (OSError, ValueError, AttributeError):
        err = []
    return err[-1] if err else ""


def wait_ready(proc, what, deadline):
    """Wait for an agent's {"ready": ...} line on stdout (by time.monotonic() `deadline`). It is
    read a byte at a time: nothing after the line is taken from what is read later."""
    fd, line = proc.stdout.fileno(), b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0:
            raise LabError(f"{what} was not ready in time")
        if select.select([fd], [], [], min(left, 0.2))[0]:
            byte = os.read(fd, 1)
            if not byte:
                why = last_error_line(proc) or f"exit {proc.wait()}"
                raise LabError(f"{what} ended before it was ready: {why}")
            line += byte
            if len(line) > 4096:
                break
    try:
        ok = "ready" in json.loads(line)
    except (ValueError, TypeError):
        ok = False
    if not ok:
        raise LabError(f"{what} said {excerpt(line.decode(errors='replace').strip())}, not ready")


def release(procs, margin_s=GO_MARGIN_S):
    """Give gated agents (all ready) their common start, `margin_s` from now (and REMOTE_GO_S
    more when some run on other machines): returns it (unix, this machine's clock)."""
    remote = [proc for proc in procs if getattr(proc, "start_file", None) is not None]
    if remote:
        margin_s += patience.scaled(REMOTE_GO_S)
    start_at = time.time() + margin_s
    _write_start_files(remote, lambda offset: repr(start_at + offset), "giving agents their start time")
    line = f"{start_at!r}\n".encode()
    for proc in procs:
        proc.released = True
        if proc in remote:
            continue
        try:
            proc.stdin.write(line)
            proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass        # it died after it said ready: its launcher sees its exit
        proc.stdin = None           # as if it had none: communicate() would flush the closed pipe
    return start_at


def call_off(procs):
    """Tell gated agents on other machines that were never released that no start is coming (an
    agent here sees its stdin close when its process is killed; one over there, started over SSH,
    would wait for its start file for start_gate.MAX_WAIT_S). Best effort: the run is failing."""
    waiting = [proc for proc in procs if getattr(proc, "start_file", None) is not None
               and not getattr(proc, "released", False)]
    try:
        _write_start_files(waiting, lambda _offset: start_gate.CALL_OFF, "calling agents' start off")
    except (LabError, OSError, subprocess.SubprocessError):
        pass


def _write_start_files(procs, text_of, what):
    """Each of `procs` (agents on other machines) gets text_of(its clock offset) in its start
    file, one SSH command per machine; each file is written whole, by a rename, so the agent
    polling for it never reads half a line."""
    by_machine = {}
    for proc in procs:
        cluster, machine, path, offset = proc.start_file
        by_machine.setdefault(machine.name, (cluster, machine, []))[2].append((path, text_of(offset)))
    for cluster, machine, files in by_machine.values():
        script = "\n".join(f"mkdir -p {shlex.quote(str(path.parent))}\n"
                           f"echo {shlex.quote(text)} > {shlex.quote(str(path))}.tmp\n"
                           f"mv {shlex.quote(str(path))}.tmp {shlex.quote(str(path))}" for path, text in files)
        cluster.root_run(machine, script, what)
