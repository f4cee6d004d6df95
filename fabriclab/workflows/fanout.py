"""A sweep's cases spread over the lab machines of an ansible inventory: one thread per machine,
each running one case at a time there through ansible-runner (playbooks/sweep_case.yml: copy the
case, `fabriclab scenario run` it as root, bring its results folder back as an archive).

A machine that cannot be reached, or fails outside the case itself (a copy, the archive), drops
out and its case goes back in the queue for the others; a case that fails on its own (the lab
refused it, exit 2) is recorded as failed. The machines: the inventory's `lab` group, or every
host when there is no such group. Each needs `project_dir` (its fabriclab checkout) or
`venv_dir`, as `vagrant up` writes them (.vagrant/fabriclab-inventory.ini).
"""

from __future__ import annotations

import pathlib
import queue
import shutil
import tarfile
import tempfile
import threading
import time

from fabriclab.errors import LabError
from fabriclab.loading import clip, excerpt
from fabriclab.system.inventory import machines
from fabriclab.system.provision import PROJECT_DIR, failure_message, runner_envvars

PLAYBOOK = PROJECT_DIR / "playbooks" / "sweep_case.yml"
MAX_ARCHIVE_BYTES = 2 << 30          # a results folder brought back: at most 2 GiB unpacked
MAX_ARCHIVE_MEMBERS = 10_000
CASE_TIMEOUT_S = 3 * 3600


def unpack(archive, folder):
    """Extract a results archive into `folder`: regular files and folders only, every path inside
    it, bounded in size and count; LabError otherwise (nothing outside `folder` is written)."""
    folder = pathlib.Path(folder).resolve()
    total = 0
    try:
        with tarfile.open(archive, "r:gz") as tar:
            members = []
            for n, member in enumerate(tar):
                if n >= MAX_ARCHIVE_MEMBERS:
                    raise LabError(f"results archive holds over {MAX_ARCHIVE_MEMBERS} files")
                if not (member.isfile() or member.isdir()):
                    raise LabError(f"results archive holds {excerpt(member.name)}, not a file or folder")
                target = (folder / member.name).resolve()
                if target != folder and folder not in target.parents:
                    raise LabError(f"results archive path {excerpt(member.name)} leads outside its folder")
                total += member.size
                if total > MAX_ARCHIVE_BYTES:
                    raise LabError("results archive unpacks to over 2 GiB")
                members.append((member, target))
            for member, target in members:
                if member.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                with tar.extractfile(member) as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise LabError(f"results archive unreadable ({type(exc).__name__})") from None


class _Outcome:
    """What one case's playbook run said: which task failed, how, whether the machine was lost."""

    def __init__(self):
        self.unreachable = None
        self.failed_task = None
        self.message = None
        self.case_rc = None

    def __call__(self, event):
        kind = event.get("event")
        data = event.get("event_data") or {}
        res = data.get("res") or {}
        if kind == "runner_on_unreachable" and self.unreachable is None:
            self.unreachable = failure_message(res)
        elif kind == "runner_on_failed" and self.failed_task is None:
            self.failed_task = data.get("task", "?")
            self.message = failure_message(res)
            if self.failed_task.startswith("Run the case"):
                self.case_rc = res.get("rc")
        return True


def _draw_run_plots(folder):
    """The case ran with --no-run-plots (sweep_case.yml): its report is drawn here, whole."""
    from fabriclab.results import report

    report.render(folder)


def run_case(inventory, machine, case_file, case_id, folder, envvars=None):
    """Run one case on one machine; unpack its results into `folder`. Returns (ok, machine_lost,
    message)."""
    import ansible_runner

    private = tempfile.mkdtemp(prefix="fabriclab-sweep-")
    try:
        archive = pathlib.Path(private) / "out.tgz"
        outcome = _Outcome()
        runner = ansible_runner.run(
            private_data_dir=private, project_dir=str(PLAYBOOK.parent), playbook=PLAYBOOK.name,
            inventory=str(pathlib.Path(inventory).resolve()), limit=machine,
            extravars={"case_file": str(pathlib.Path(case_file).resolve()), "case_id": case_id,
                       "fetch_to": str(archive)},
            envvars=envvars or runner_envvars(), quiet=True, event_handler=outcome, timeout=CASE_TIMEOUT_S)
        if runner.status == "canceled":
            raise KeyboardInterrupt
        if outcome.unreachable is not None:
            return False, True, f"{machine} unreachable: {outcome.unreachable}"
        if outcome.case_rc is not None:
            # the lab itself refused or failed the case: another machine would too
            return False, False, f"{machine}: {outcome.message}"
        if outcome.failed_task is not None or runner.status != "successful" or not archive.is_file():
            what = outcome.failed_task or f"ansible {runner.status}"
            return False, True, f"{machine}: {what}: {outcome.message or 'no results came back'}"
        unpack(archive, folder)
        _draw_run_plots(folder)
        return True, False, None
    finally:
        shutil.rmtree(private, ignore_errors=True)


def fan_out(inventory, cases, case_file_of, folder_of, on_state, log=print, envvars=None, found=None):
    """Run `cases` over the inventory's machines, one at a time on each. `case_file_of(case)` and
    `folder_of(case)` give its scenario file and results folder; `on_state(case, state, **detail)`
    records each change; `found`: machines(inventory), when the caller has read it already.
    Returns the cases left when every machine dropped out."""
    found = found or machines(inventory)
    todo = queue.Queue()
    for case in cases:
        todo.put(case)
    lock = threading.Lock()
    in_flight = [0]                  # cases running now: one may come back for the others
    stop = threading.Event()

    def worker(name):
        while not stop.is_set():
            with lock:
                try:
                    case = todo.get_nowait()
                except queue.Empty:
                    case = None
                    if not in_flight[0]:
                        return
                else:
                    in_flight[0] += 1
            if case is None:
                stop.wait(0.2)
                continue
            with lock:
                on_state(case, "running", machine=name)
                log(f"{case.id} ({case.label}): running on {name}")
            t0 = time.monotonic()
            try:
                ok, lost, message = run_case(inventory, name, case_file_of(case), case.id, folder_of(case),
                                             envvars)
            except LabError as exc:
                ok, lost, message = False, False, f"{name}: {exc}"
            except BaseException:
                stop.set()
                with lock:
                    in_flight[0] -= 1
                    on_state(case, "pending", machine=None)
                raise
            with lock:
                in_flight[0] -= 1
                if ok:
                    on_state(case, "done", machine=name, seconds=round(time.monotonic() - t0, 1), error=None)
                    log(f"{case.id}: done on {name} in {time.monotonic() - t0:.0f} s")
                elif lost:
                    on_state(case, "pending", machine=None, error=message)
                    todo.put(case)
                    log(f"{case.id}: {message}; {name} drops out, the case goes to another machine")
                    return
                else:
                    on_state(case, "failed", machine=name, error=message)
                    log(f"{case.id}: failed: {message}")

    threads = [threading.Thread(target=worker, args=(name,), name=f"sweep-{name}", daemon=True)
               for name, _vars in found]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(0.5)
    except KeyboardInterrupt:
        stop.set()
        raise
    left = []
    while not todo.empty():
        left.append(todo.get_nowait())
    return left
