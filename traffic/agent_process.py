"""The launchers' side of an agent process: started inside a host's network namespace, recorded
in the run before anything else can happen to it (so `clean` finds it after a crash), and, when
it fails, its last line on stderr."""

from __future__ import annotations

import pathlib
import subprocess
import sys


def start(lab, host, module, args, role):
    """`python -m module args...` in `host`'s namespace; stdout discarded, stderr kept.

    A host on another machine of a cluster runs it there, through the lab's SSH connection (the
    process here is that session; its exit code and stderr are the agent's): a file among the
    arguments (its input, in the run's folder) is copied to the same path there first."""
    python = sys.executable
    cluster = getattr(lab, "cluster", None)
    machine = cluster.machine_of_name(host) if cluster is not None else None
    if machine is not None and not machine.local:
        for arg in args:
            if isinstance(arg, pathlib.Path):
                cluster.push(machine, arg, arg.read_text())
        python = machine.python
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
