"""The run registry: what each run created, written down *before* it is created.

Every run owns a folder /run/fabriclab/runs/<id>/ with state.json listing its OVS bridges, its
root-namespace interfaces, and the PIDs of its controller and Mininet shells (each with the command
line it must still have, so a recycled PID is never killed). A run killed with SIGKILL leaves that
record behind; `fabriclab clean` reads it and removes exactly those resources: nothing is found or
killed by name. /run is a tmpfs, so records vanish at reboot together with what they describe.
"""

from __future__ import annotations

import json
import os
import pathlib
import secrets
import shutil
import threading
import time

from fabriclab.system.procs import helper_run_id, pid_alive, pid_cmdline, valid_run_id

RUN_ROOT = pathlib.Path(os.environ.get("FABRICLAB_RUN_ROOT", "/run/fabriclab"))
OVS_RUN_KEY = "fabriclab-run"   # external_ids key on every bridge a run creates
OVS_PID_KEY = "fabriclab-pid"   # ... and the process that owns the run (another run root's lab)
LINK_GROUP_BASE = 0x4C000000     # interface groups fabriclab uses (Linux's default group is 0)
LINK_GROUP_SPAN = 1 << 24


FOLDER_MARK = ".fabriclab-run"       # in a folder a run made elsewhere: the run's id

def is_lab_link_group(group):
    """Whether `group` is one of the link groups runs allocate: a record that says otherwise is
    corrupt, and `ip link del group 0` would delete every interface of the default group."""
    return isinstance(group, int) and not isinstance(group, bool) and \
        LINK_GROUP_BASE <= group < LINK_GROUP_BASE + LINK_GROUP_SPAN




class RunState:
    """One run's record. Mutators persist at once (atomic rename), so a crash loses nothing."""

    def __init__(self, run_id, data=None):
        self.id = run_id
        # Concurrent jobs' launchers record their agents from their own threads.
        self._lock = threading.RLock()
        self.dir = RUN_ROOT / "runs" / run_id
        self.data = data or {
            "id": run_id,
            "pid": os.getpid(),
            "cmdline": pid_cmdline(os.getpid()),
            "started": time.time(),
            "spec": None,
            "bridges": [],
            "interfaces": [],
            "processes": [],     # {"pid", "role", "match"}: match must be in /proc/<pid>/cmdline
            # Root-namespace interfaces join this link group, so `ip link del group N` removes
            # them all in one batched kernel operation (one by one costs an RCU wait each).
            "link_group": LINK_GROUP_BASE + secrets.randbelow(LINK_GROUP_SPAN),
        }

    @classmethod
    def create(cls, spec_name):
        run_id = time.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)
        state = cls(run_id)
        state.dir.mkdir(parents=True, exist_ok=False)
        state.data["spec"] = spec_name
        state.save()
        return state

    @staticmethod
    def valid_id(run_id):
        """Whether `run_id` has the form `create` gives (a folder name, never a path)."""
        return valid_run_id(run_id)

    @classmethod
    def helper_id(cls, module, argv):
        """The run id a run's helper on another machine is started with (`--run-id ID`); None,
        said on stderr, when it is not one."""
        return helper_run_id(module, argv)

    @classmethod
    def load(cls, run_dir):
        data = json.loads((pathlib.Path(run_dir) / "state.json").read_text())
        return cls(data["id"], data)

    @classmethod
    def all(cls):
        runs = []
        base = RUN_ROOT / "runs"
        for run_dir in sorted(base.glob("*")) if base.exists() else []:
            try:
                runs.append(cls.load(run_dir))
            except (OSError, ValueError, KeyError):
                runs.append(cls(run_dir.name, {"id": run_dir.name, "pid": None, "bridges": [],
                                               "interfaces": [], "processes": [], "corrupt": True}))
        return runs

    @property
    def live(self):
        """True while the process that owns the run is still running."""
        pid = self.data.get("pid")
        if not pid:
            return False
        return pid_alive(pid) and pid_cmdline(pid) == self.data.get("cmdline")

    def path(self, name):
        return self.dir / name

    def save(self):
        with self._lock:
            tmp = self.dir / "state.json.tmp"
            # no indent: json's C encoder. A run saves once per process it starts (crash safety),
            # and the indented encoder made 300 saves of a 256-host build cost 1.7 s.
            tmp.write_text(json.dumps(self.data))
            os.replace(tmp, self.dir / "state.json")

    def plan(self, bridges, interfaces):
        with self._lock:
            self.data["bridges"] = sorted(set(self.data["bridges"]) | set(bridges))
            self.data["interfaces"] = sorted(set(self.data["interfaces"]) | set(interfaces))
            self.save()

    def add_wire_filters(self, devices):
        """Interfaces (not the lab's) the run's queue model put its wire filter on: `clean` takes
        off the filter with the run's link group as its handle."""
        with self._lock:
            self.data["wire"] = sorted(set(self.data.get("wire", [])) | set(devices))
            self.save()

    def add_process(self, pid, role, match):
        with self._lock:
            self.data["processes"].append({"pid": pid, "role": role, "match": match})
            self.save()

    def add_folder(self, path):
        """A folder the run made outside its run folder (the full-kernel tier's): marked as the
        run's (FOLDER_MARK holds its id), so `clean` deletes it after a kill, and only if marked."""
        path = os.path.abspath(path)
        with open(os.path.join(path, FOLDER_MARK), "w") as f:
            f.write(self.id)
        with self._lock:
            self.data["folders"] = sorted(set(self.data.get("folders", [])) | {path})
            self.save()

    def remove(self):
        shutil.rmtree(self.dir, ignore_errors=True)
