"""The launchers' side of an agent process: started inside a host's network namespace, recorded
in the run before anything else can happen to it (so `clean` finds it after a crash), and, when
it fails, its last line on stderr. A host on another machine of a cluster runs its agent there,
so its input files are copied there first and its output read back from there."""

from __future__ import annotations

import subprocess
import sys

from fabriclab.measure import remotecounters


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
# (an emulated guest's takes seconds): a common start waits this many times what that took.
REMOTE_START_FACTOR = 1.5


def start_margin_s(lab, hosts, module, base_s):
    """How far ahead to set a common start for agents of `module` on `hosts`: `base_s`, plus
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
    return 0.0 if away is None else remotecounters.clock_offset_s(*away)


def read_output(lab, host, path, limit, binary=False):
    """The text (bytes if `binary`) of an output file `host`'s agent wrote (OSError when there
    is none here)."""
    away = _elsewhere(lab, host)
    if away is None:
        return path.read_bytes() if binary else path.read_text()
    cluster, machine = away
    return cluster.pull(machine, path, limit, binary=binary)


def start(lab, host, module, args, role, keep_stdout=False):
    """`python -m module args...` in `host`'s namespace; stderr kept, stdout too if asked for.

    A host on another machine of a cluster runs it there, through the lab's SSH connection (the
    process here is that session; its exit code, stdout and stderr are the agent's), with the
    input files `prepare` put there. Its input is nothing: over SSH, Mininet's mnexec forks away
    from the session, which ends the input at once; an agent is told to stop by a file."""
    away = _elsewhere(lab, host)
    python = away[1].python if away is not None else sys.executable
    proc = lab.net.get(host).popen([python, "-m", module, *map(str, args)], stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE if keep_stdout else subprocess.DEVNULL,
                                   stderr=subprocess.PIPE)
    lab.run.add_process(proc.pid, role, module)
    return proc


def last_error_line(proc):
    """The last line the process wrote on stderr ("" when none): its own one-line error."""
    try:
        err = proc.stderr.read().decode(errors="replace").strip().splitlines()
    except (OSError, ValueError, AttributeError):
        err = []
    return err[-1] if err else ""
