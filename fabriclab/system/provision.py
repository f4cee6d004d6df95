"""Provisioning: run playbooks/site.yml on this machine through ansible-runner.

The playbook installs the lab's packages, starts Open vSwitch and keeps the lab's virtualenv
installed; `provision()` drives it and reports what changed, `fabriclab provision` is its command.
"""

import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from fabriclab.errors import EnvironmentProblem, LabError

PROJECT_DIR = Path(__file__).resolve().parents[2]
PLAYBOOK = Path("playbooks") / "site.yml"
SYSTEM_PYTHON = "/usr/bin/python3"

INVENTORY = {
    "all": {
        "hosts": {
            "localhost": {
                "ansible_connection": "local",
                "ansible_python_interpreter": SYSTEM_PYTHON,
            },
        },
    },
}


@dataclass(frozen=True)
class TaskFailure:
    task: str
    message: str


@dataclass
class ProvisionResult:
    """What one playbook run did. `changed` and `failed` count tasks, as ansible's recap does."""

    ok: bool
    changed: int
    failed: int
    status: str
    rc: int
    check: bool
    duration: float
    changed_tasks: list[str] = field(default_factory=list)
    failures: list[TaskFailure] = field(default_factory=list)
    output_tail: str = ""

    def raise_for_failure(self):
        """Raise LabError naming the first failed task (or ansible's own error) if the run failed."""
        if self.ok:
            return
        if self.failures:
            first = self.failures[0]
            more = f" (and {len(self.failures) - 1} more)" if len(self.failures) > 1 else ""
            raise LabError(f"provision failed at task '{first.task}': {first.message}{more}")
        detail = self.output_tail or f"ansible-playbook exited {self.rc}"
        raise LabError(f"provision {self.status}: {detail}")


def runner_envvars():
    """The environment every ansible-runner call of the lab gets."""
    # ansible-runner starts `ansible-playbook` by name: make sure the one installed next to
    # this interpreter (the venv's) is found even when the venv is not on PATH.
    bindir = os.path.dirname(sys.executable)
    return {
        "PATH": bindir + os.pathsep + os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_RETRY_FILES_ENABLED": "0",
        "ANSIBLE_PIPELINING": "1",
        "ANSIBLE_LOCALHOST_WARNING": "0",
    }


def _task_label(event_data):
    task = event_data.get("task", "?")
    role = event_data.get("role")
    return f"{role} : {task}" if role else task


def failure_message(res):
    """One line from a failed task's result: its msg, plus the last line of stderr if any."""
    msg = str(res.get("msg") or "").strip()
    stderr = str(res.get("stderr") or res.get("module_stderr") or "").strip()
    last = stderr.splitlines()[-1].strip() if stderr else ""
    parts = [p for p in (msg.splitlines()[0] if msg else "", last) if p]
    return ": ".join(parts) or "failed (no message)"


class _EventCollector:
    """ansible-runner event handler: collects changed/failed tasks and prints one line for each."""

    def __init__(self, echo, check):
        self.echo = echo
        self.check = check
        self.changed_tasks = []
        self.failures = []
        self.stats = None

    def __call__(self, event):
        kind = event.get("event")
        data = event.get("event_data") or {}
        if kind == "runner_on_ok" and (data.get("res") or {}).get("changed"):
            label = _task_label(data)
            self.changed_tasks.append(label)
            self._print(("would change: " if self.check else "changed: ") + label)
        elif kind == "runner_on_failed" and not data.get("ignore_errors"):
            self._failed(data, failure_message(data.get("res") or {}))
        elif kind == "runner_on_unreachable":
            self._failed(data, failure_message(data.get("res") or {}))
        elif kind == "playbook_on_stats":
            self.stats = data
        return True

    def _failed(self, data, message):
        failure = TaskFailure(_task_label(data), message)
        self.failures.append(failure)
        self._print(f"failed: {failure.task}: {failure.message}")

    def _print(self, line):
        if self.echo:
            print("  " + line, flush=True)


def _count(stats, key):
    return sum((stats or {}).get(key, {}).values())


def _tail(stdout_file, lines=3):
    try:
        text = stdout_file.read() if stdout_file else ""
    except (OSError, ValueError):
        return ""
    kept = [line.strip() for line in text.splitlines() if line.strip()]
    return " / ".join(kept[-lines:])


def provision(project_dir=PROJECT_DIR, venv_dir=None, check=False, quiet=False):
    """Run the provisioning playbook on this machine and return a ProvisionResult.

    venv_dir=None keeps the playbook's default (<project_dir>/.venv). check=True is ansible's
    check mode: nothing is changed, and `changed` counts what would be. Needs root.
    """
    if os.geteuid() != 0:
        raise EnvironmentProblem(
            "provisioning installs packages and starts Open vSwitch: run it as root "
            "(sudo ./lab.sh bootstrap, or sudo .venv/bin/fabriclab provision)")
    project_dir = Path(project_dir).resolve()
    playbook = project_dir / PLAYBOOK
    if not playbook.is_file():
        raise LabError(f"no playbook at {playbook}: is {project_dir} a fabriclab checkout?")
    try:
        import ansible_runner
    except ImportError as exc:
        raise EnvironmentProblem(
            f"ansible-runner is not importable ({exc}): run `sudo ./lab.sh bootstrap`") from exc

    extravars = {"project_dir": str(project_dir)}
    if venv_dir is not None:
        extravars["venv_dir"] = str(Path(venv_dir).absolute())
    envvars = runner_envvars()
    collector = _EventCollector(echo=not quiet, check=check)
    if not quiet:
        mode = " in check mode" if check else ""
        print(f"provision: running {PLAYBOOK} on this machine{mode}", flush=True)

    private_dir = tempfile.mkdtemp(prefix="fabriclab-provision-")
    started = time.monotonic()
    try:
        runner = ansible_runner.run(
            private_data_dir=private_dir,
            project_dir=str(playbook.parent),
            playbook=playbook.name,
            inventory=INVENTORY,
            extravars=extravars,
            envvars=envvars,
            cmdline="--check" if check else None,
            quiet=True,
            event_handler=collector,
        )
        tail = "" if runner.status == "successful" else _tail(runner.stdout)
    finally:
        shutil.rmtree(private_dir, ignore_errors=True)
    duration = time.monotonic() - started

    if runner.status == "canceled":
        raise KeyboardInterrupt
    failed = _count(collector.stats, "failures") + _count(collector.stats, "dark")
    return ProvisionResult(
        ok=runner.status == "successful" and failed == 0,
        changed=_count(collector.stats, "changed"),
        failed=failed,
        status=runner.status,
        rc=runner.rc,
        check=check,
        duration=duration,
        changed_tasks=collector.changed_tasks,
        failures=collector.failures,
        output_tail=tail,
    )


def summary_line(result):
    suffix = " (check mode: nothing was changed)" if result.check else ""
    state = "ok" if result.ok else "FAILED"
    return f"provision: {state}, {result.changed} changed{suffix} in {result.duration:.0f} s"
