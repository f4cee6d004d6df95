"""The lab machines of an ansible inventory, and one fabriclab verb run on every one of them.

An inventory (as `vagrant up` writes .vagrant/fabriclab-inventory.ini, or a user's own) is read
by ansible's own parser: its `lab` group, or every host when there is no such group. Each machine
needs `project_dir` (its fabriclab checkout) or `venv_dir`. `run_everywhere` runs one of the verbs
that look after a machine (doctor, clean) as root on all of them at once through ansible-runner
(playbooks/lab_verb.yml) and brings back, per machine, whether it answered and what the verb said.
The verbs and their arguments are fixed here: nothing from the inventory reaches a command line.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from fabriclab.errors import LabError
from fabriclab.loading import clip, excerpt
from fabriclab.system.provision import PROJECT_DIR, failure_message, runner_envvars

PLAYBOOK = PROJECT_DIR / "playbooks" / "lab_verb.yml"
VERBS = {"doctor": ("doctor", "--format", "json"), "clean": ("clean",), "clean-all": ("clean", "--all")}
MAX_OUTPUT_CHARS = 1 << 20          # a verb's stdout brought back: at most 1 MiB is read
TIMEOUT_S = 600


def machines(inventory):
    """[(name, hostvars)] of the inventory's lab machines, read by ansible's own parser."""
    path = pathlib.Path(inventory)
    if not path.is_file():
        raise LabError(f"no inventory file {clip(path)}")
    exe = pathlib.Path(sys.executable).with_name("ansible-inventory")
    try:
        proc = subprocess.run([str(exe), "-i", str(path), "--list"], capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL, env={**os.environ, **runner_envvars()})
        data = json.loads(proc.stdout) if proc.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError):
        data = None
    if not isinstance(data, dict):
        raise LabError(f"{clip(path)}: ansible cannot read it as an inventory")
    hostvars = (data.get("_meta") or {}).get("hostvars") or {}
    group = data.get("lab") or {}
    names = list(group.get("hosts") or []) or sorted(hostvars)
    if not names:
        raise LabError(f"{clip(path)}: no machines in it (a `lab` group, or any host)")
    for name in names:
        hv = hostvars.get(name) or {}
        if "project_dir" not in hv and "venv_dir" not in hv:
            raise LabError(f"{clip(path)}: machine {excerpt(name)} needs project_dir (its fabriclab checkout) "
                           f"or venv_dir")
    return [(name, hostvars.get(name) or {}) for name in names]


@dataclass
class Reply:
    """What one machine said: `reached` False means ansible could not get there (`message` why);
    otherwise the verb's exit code and output, or `message` when the verb could not start."""

    machine: str
    reached: bool = False
    rc: int | None = None
    stdout: str = ""
    stderr: str = ""
    message: str = "no answer"


class _Replies:
    """ansible-runner event handler: one Reply per machine, from the verb's task or the failure."""

    def __init__(self, names):
        self.replies = {name: Reply(name) for name in names}

    def __call__(self, event):
        data = event.get("event_data") or {}
        reply = self.replies.get(data.get("host"))
        if reply is None:
            return True
        res = data.get("res") or {}
        kind = event.get("event")
        if kind == "runner_on_unreachable":
            reply.reached, reply.message = False, failure_message(res)
        elif kind == "runner_on_failed":
            reply.reached, reply.message = True, failure_message(res)
        elif kind == "runner_on_ok" and data.get("task", "").startswith("Run the verb"):
            rc = res.get("rc")
            reply.reached = True
            reply.rc = rc if isinstance(rc, int) and not isinstance(rc, bool) else None
            reply.stdout = str(res.get("stdout") or "")[:MAX_OUTPUT_CHARS]
            reply.stderr = str(res.get("stderr") or "")[:MAX_OUTPUT_CHARS]
            reply.message = "" if reply.rc is not None else failure_message(res)
        return True


def run_everywhere(inventory, verb, found=None):
    """Run `verb` (a key of VERBS) as root on every lab machine of `inventory` at once.

    Returns [Reply] in the inventory's order. `found`: machines(inventory), when read already.
    """
    import ansible_runner

    if verb not in VERBS:
        raise LabError(f"no verb {excerpt(verb)} to run on the machines (known: {', '.join(VERBS)})")
    found = found or machines(inventory)
    names = [name for name, _vars in found]
    replies = _Replies(names)
    private = tempfile.mkdtemp(prefix="fabriclab-machines-")
    try:
        runner = ansible_runner.run(
            private_data_dir=private, project_dir=str(PLAYBOOK.parent), playbook=PLAYBOOK.name,
            inventory=str(pathlib.Path(inventory).resolve()), limit=",".join(names),
            extravars={"lab_argv": list(VERBS[verb])}, envvars=runner_envvars(), quiet=True,
            event_handler=replies, timeout=TIMEOUT_S, forks=max(1, min(len(names), 16)))
        if runner.status == "canceled":
            raise KeyboardInterrupt
    finally:
        shutil.rmtree(private, ignore_errors=True)
    return [replies.replies[name] for name in names]
