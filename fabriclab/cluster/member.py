"""A run's member on another machine of a cluster: `python -m fabriclab.cluster.member --run-id ID
--link-group N`, started by the lab over its SSH connection (`Member`, below).

It writes a run record here under the run's id, owned by itself, so this machine's `clean` knows
the run is live and, once the member is gone, what to remove. The lab sends it one JSON object per
line as it builds ({"bridges": [...], "interfaces": [...]}, {"process": {"pid", "role", "match"}} or
{"wire": [interface, ...]}, where the queue model's wire filter went). When its input ends
(the run stopped, or was killed and its connection dropped) or it is told to stop by a signal, it
stops the agents started with a file of the run's folder here, removes what the record names, as
`clean` would, prints one line saying what, and exits.
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import subprocess
import sys

from fabriclab.errors import LabError
from fabriclab.lab.runstate import RunState, is_lab_link_group
from fabriclab.system.procs import stop_recorded, with_argument_under
from fabriclab.system.remotechannel import safe_name

MODULE = "fabriclab.cluster.member"
MAX_LINE = 1 << 16
MAX_ITEMS = 1 << 16


def main(argv=None):
    parser = argparse.ArgumentParser(prog=MODULE)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--link-group", type=int, required=True)
    args = parser.parse_args(argv)
    if not is_lab_link_group(args.link_group) or not RunState.valid_id(args.run_id):
        print("error: not a lab run id and link group", file=sys.stderr)
        return 2
    run = RunState(args.run_id)
    run.data["spec"] = "cluster member"
    run.data["link_group"] = args.link_group
    run.dir.mkdir(parents=True, exist_ok=False)
    run.save()
    # A hang-up or a SIGTERM ends the reading; the record is removed below either way.
    for sig in (signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, _stop)
    print(f"ready {run.data['pid']}", flush=True)
    try:
        for line in iter(lambda: sys.stdin.readline(MAX_LINE), ""):
            _record(run, line)
    except (ValueError, OSError, Stopped):
        pass
    finally:
        from fabriclab.lab.clean import remove_run

        # The agents the run started here: their input is in this run's folder.
        stop_recorded([{"pid": pid, "match": arg} for pid, arg in with_argument_under(f"{run.dir}/")])
        print(remove_run(run), flush=True)
    return 0


def _names(value):
    return isinstance(value, list) and len(value) < MAX_ITEMS and all(isinstance(v, str) for v in value)


class Stopped(BaseException):
    pass


def _stop(*_):
    raise Stopped()


def _record(run, line):
    """Record one message of the lab; anything else is ignored (the input is the lab's own)."""
    try:
        msg = json.loads(line)
    except ValueError:
        return
    if not isinstance(msg, dict):
        return
    names = {key: msg.get(key) for key in ("bridges", "interfaces")}
    if any(names.values()) and all(_names(v) for v in names.values() if v is not None):
        run.plan(names["bridges"] or [], names["interfaces"] or [])
    wire = msg.get("wire")
    if _names(wire) and wire and all(safe_name(d) for d in wire):
        run.add_wire_filters(wire)
    proc = msg.get("process")
    if isinstance(proc, dict) and isinstance(proc.get("pid"), int) and isinstance(proc.get("match"), str):
        run.add_process(proc["pid"], str(proc.get("role", "")), proc["match"])


class Member:
    """This run's member on another machine: started over the lab's SSH connection, it records what
    the run makes there and removes it when its input ends (the run stopped, or was killed and its
    connection dropped)."""

    def __init__(self, machine, run):
        self.machine = machine
        command = shlex.join([machine.python, "-m", MODULE, "--run-id", run.id,
                              "--link-group", str(run.data["link_group"])])
        self.proc = subprocess.Popen([*machine.ssh_argv(), command], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)
        first = self.proc.stdout.readline().split()
        if first[:1] != ["ready"]:
            err = self.proc.stderr.read().strip().splitlines() if self.proc.poll() is not None else []
            raise LabError(f"machine {machine.name}: the lab's member did not start: "
                           f"{(err or first or ['no answer'])[-1][:200]}")
        self.pid = int(first[1])

    def send(self, what):
        self.proc.stdin.write(json.dumps(what) + "\n")
        self.proc.stdin.flush()

    def finish(self, timeout=60.0):
        """Close its input and wait for its report of what it removed."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.proc.stdout.read().strip()


if __name__ == "__main__":
    sys.exit(main())
