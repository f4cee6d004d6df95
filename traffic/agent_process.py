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


def clock_offset_s(lab, host):
    """`host`'s machine's wall clock minus this one's (0 here): a start time for its agent is
    given on its clock, and times it reports are set back onto this one."""
    away = _elsewhere(lab, host)
    return 0.0 if away is None else remotecounters.clock_offset_s(*away)


def read_output(lab, host, path, limit):
    """The text of an output file `host`'s agent wrote (OSError when there is none here)."""
    away = _elsewhere(lab, host)
    if away is None:
        return path.read_text()
    cluster, machine = away
    return cluster.pull(machine, path, limit)


def start(lab, host, module, args, role):
    """`python -m module args...` in `host`'s namespace; stdout discarded, stderr kept.

    A host on another machine of a cluster runs it there, through the lab's SSH connection (the
    process here is that session; its exit code and stderr are the agent's), with the input files
    `prepare` put there."""
    away = _elsewhere(lab, host)
    python = away[1].python if away is not None else sys.executable
    proc = lab.net.get(host).popen([python, "-m", module, *map(str, args)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    lab.run.add_process(proc.pid, role, module)
    return proc


def last_error_line(proc):
    """The last line the process wrote on stderr ("" when none): its own one-line error."""
    try:
        err = proc.stderr.read().decode(errors="replace").strip().splitlines()
    except (OSError, ValueError, AttributeError):
        err = []
    return err[-1] if err else ""
