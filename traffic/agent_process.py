"""The launchers' side of an agent process: started inside a host's network namespace, recorded
in the run before anything else can happen to it (so `clean` finds it after a crash), and, when
it fails, its last line on stderr."""

from __future__ import annotations

import subprocess
import sys


def start(lab, host, module, args, role):
    """`python -m module args...` in `host`'s namespace; stdout discarded, stderr kept."""
    proc = lab.net.get(host).popen([sys.executable, "-m", module, *map(str, args)],
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
