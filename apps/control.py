"""The protocol between the lab and its controller process: the files in a run's folder, their
fields, how they are written and read, and the controller's command line.

One module owns it and both sides import it (it lives under apps/ because the controller process
must not import the lab). The files:

| file | writer -> reader | what |
| --- | --- | --- |
| fabric.json | lab -> controller | the fabric graph (topologies.fabric), once, before the process starts |
| controller.json | controller -> lab | `Status`: what the app sees and whether the fabric is programmed |
| jobs.json | lab -> controller | `Job`s announced for TE |
| steering.json | lab -> controller | a `SteeringPlan` (in-network services, apps/steering.py) |
| te-placement.json | controller -> lab | TE's last placement, a report for people (apps/te_engine.py) |

Writers replace a file atomically (a reader never sees half of one); readers are tolerant (a
missing, partial or malformed file reads as empty, a field of the wrong type as its default), so
neither side fails because the other is starting, restarting or older.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import tempfile
import time
from dataclasses import dataclass, field

from fabriclab.topologies.fabric import Fabric

FABRIC_FILE = "fabric.json"
STATUS_FILE = "controller.json"
JOBS_FILE = "jobs.json"
STEERING_FILE = "steering.json"
TE_PLACEMENT_FILE = "te-placement.json"


@dataclass(frozen=True)
class RunFiles:
    """The control files of one run folder."""

    folder: pathlib.Path

    def __post_init__(self):
        object.__setattr__(self, "folder", pathlib.Path(self.folder))

    @property
    def fabric(self):
        return self.folder / FABRIC_FILE

    @property
    def status(self):
        return self.folder / STATUS_FILE

    @property
    def jobs(self):
        return self.folder / JOBS_FILE

    @property
    def steering(self):
        return self.folder / STEERING_FILE

    @property
    def te_placement(self):
        return self.folder / TE_PLACEMENT_FILE


# -- writing and reading ------------------------------------------------------------------------------
def write_text(path, text):
    """Replace `path` with `text` in one rename. The temporary file is unique, so two writers of one
    file (two launcher threads) never rename each other's half-written file."""
    path = pathlib.Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_json(path, doc):
    write_text(path, json.dumps(doc, indent=1))


def read_json(path):
    """The JSON object in `path`, or None when it is missing, unreadable or not an object."""
    try:
        doc = json.loads(pathlib.Path(path).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _pick(doc, name, kind, default):
    value = doc.get(name)
    if isinstance(value, bool) and kind in (int, float):
        return default
    if kind is float and isinstance(value, int):
        return float(value)
    return value if isinstance(value, kind) else default


# -- jobs.json: the jobs announced to TE ------------------------------------------------------------
@dataclass(frozen=True)
class Job:
    """A job's traffic: (source ip, destination ip, bytes) for every pair it sends between."""

    pairs: tuple
    time: float = 0.0

    @classmethod
    def of(cls, pairs, when=None):
        return cls(tuple((str(s), str(d), int(n)) for s, d, n in pairs), time.time() if when is None else when)

    def to_json(self):
        return {"pairs": [list(p) for p in self.pairs], "time": self.time}

    @classmethod
    def from_json(cls, doc):
        pairs = []
        for item in doc.get("pairs") or []:
            try:
                src, dst, nbytes = item
                pairs.append((str(src), str(dst), int(nbytes)))
            except (TypeError, ValueError):
                continue                      # one malformed pair does not lose the job
        return cls(tuple(pairs), _pick(doc, "time", float, 0.0))


def write_jobs(path, jobs):
    """`jobs`: {name: Job}."""
    write_json(path, {"jobs": {name: job.to_json() for name, job in jobs.items()}})


def read_jobs(path):
    doc = read_json(path) or {}
    jobs = doc.get("jobs")
    if not isinstance(jobs, dict):
        return {}
    return {str(name): Job.from_json(job) for name, job in jobs.items() if isinstance(job, dict)}


# -- steering.json: the in-network services' plan ------------------------------------------------------
@dataclass(frozen=True)
class SteeringPlan:
    """A steering plan (its body is checked by apps/steering.py) and the generation that names it,
    so the lab can tell when the controller holds this plan and not an earlier one."""

    generation: str | None = None
    plan: dict = field(default_factory=dict)

    def to_json(self):
        return {"generation": self.generation, "plan": self.plan}

    @classmethod
    def from_json(cls, doc):
        plan = doc.get("plan")
        generation = doc.get("generation")
        return cls(None if generation is None else str(generation), plan if isinstance(plan, dict) else {})


def write_steering(path, plan):
    write_json(path, plan.to_json())


def read_steering(path):
    """The plan in `path`; None when there is no readable plan (no file: no steering)."""
    doc = read_json(path)
    return None if doc is None else SteeringPlan.from_json(doc)


# -- controller.json: what the controller publishes ------------------------------------------------
@dataclass(frozen=True)
class SteeringStatus:
    generation: str | None = None      # the plan last taken (or refused)
    error: str = ""                    # why that plan was refused ("" when it is installed)

    @classmethod
    def from_json(cls, doc):
        generation = doc.get("generation")
        return cls(None if generation is None else str(generation), _pick(doc, "error", str, ""))


@dataclass(frozen=True)
class TeStatus:
    recomputes: int = 0
    placed: int = 0
    unplaced: int = 0
    demands: int = 0
    jobs: tuple = ()                   # names of the announced jobs the placement used
    period_s: float = 0.0
    last: float | None = None          # wall time of the last placement
    compute_ms: float | None = None
    reason: str = ""                   # "jobs" (an announcement) or "period"
    placement_file: str = ""

    @classmethod
    def from_json(cls, doc):
        last, ms = doc.get("last"), doc.get("compute_ms")
        return cls(_pick(doc, "recomputes", int, 0), _pick(doc, "placed", int, 0),
                   _pick(doc, "unplaced", int, 0), _pick(doc, "demands", int, 0),
                   tuple(str(j) for j in _pick(doc, "jobs", list, [])), _pick(doc, "period_s", float, 0.0),
                   last if isinstance(last, (int, float)) else None,
                   ms if isinstance(ms, (int, float)) else None,
                   _pick(doc, "reason", str, ""), _pick(doc, "placement_file", str, ""))


@dataclass(frozen=True)
class StageStatus:
    mode: str = ""
    pins: str = ""
    groups: int = 0                    # member entries written to the stage's map
    attached_ports: int = 0
    updated: float | None = None
    depth: str = ""                    # AR: "queue model" or "virtual queue"
    carrier: str = ""                  # who takes a dead member out: "data path" or "controller"

    @classmethod
    def from_json(cls, doc):
        updated = doc.get("updated")
        return cls(_pick(doc, "mode", str, ""), _pick(doc, "pins", str, ""), _pick(doc, "groups", int, 0),
                   _pick(doc, "attached_ports", int, 0), updated if isinstance(updated, (int, float)) else None,
                   _pick(doc, "depth", str, ""), _pick(doc, "carrier", str, ""))


@dataclass(frozen=True)
class Status:
    """The controller's status. `programmed`: every switch of the fabric is connected and has
    confirmed (by a barrier reply) the latest `generation` of the desired state."""

    app: str = ""
    options: dict = field(default_factory=dict)
    pid: int = 0
    time: float = 0.0
    generation: int = 0
    connected: tuple = ()
    synced: dict = field(default_factory=dict)         # switch -> generation it confirmed
    programmed: bool = False
    down_links: frozenset = frozenset()                 # Link.key of the links the controller sees down
    mismatches: tuple = ()
    unknown_dpids: tuple = ()
    switch_errors: tuple = ()
    events: tuple = ()                                  # {"time", "event", "subject"}, oldest first
    steering: SteeringStatus = SteeringStatus()
    te: TeStatus | None = None
    stage: StageStatus | None = None

    def to_json(self):
        doc = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        doc.update(connected=list(self.connected), down_links=[list(k) for k in sorted(self.down_links)],
                   mismatches=list(self.mismatches), unknown_dpids=list(self.unknown_dpids),
                   switch_errors=list(self.switch_errors), events=[dict(e) for e in self.events],
                   steering=dataclasses.asdict(self.steering))
        for name in ("te", "stage"):
            if doc[name] is None:
                del doc[name]
            else:
                doc[name] = dataclasses.asdict(doc[name])
        if self.te is not None:
            doc["te"]["jobs"] = list(self.te.jobs)
        return doc

    @classmethod
    def from_json(cls, doc):
        down = set()
        for key in _pick(doc, "down_links", list, []):
            if isinstance(key, list) and len(key) == 4:
                down.add(tuple(key))
        synced = {str(k): v for k, v in _pick(doc, "synced", dict, {}).items() if isinstance(v, int)}
        te, stage = doc.get("te"), doc.get("stage")
        return cls(
            app=_pick(doc, "app", str, ""), options=_pick(doc, "options", dict, {}),
            pid=_pick(doc, "pid", int, 0), time=_pick(doc, "time", float, 0.0),
            generation=_pick(doc, "generation", int, 0),
            connected=tuple(_pick(doc, "connected", list, [])), synced=synced,
            programmed=_pick(doc, "programmed", bool, False), down_links=frozenset(down),
            mismatches=tuple(_pick(doc, "mismatches", list, [])),
            unknown_dpids=tuple(_pick(doc, "unknown_dpids", list, [])),
            switch_errors=tuple(_pick(doc, "switch_errors", list, [])),
            events=tuple(e for e in _pick(doc, "events", list, []) if isinstance(e, dict)),
            steering=SteeringStatus.from_json(_pick(doc, "steering", dict, {})),
            te=TeStatus.from_json(te) if isinstance(te, dict) else None,
            stage=StageStatus.from_json(stage) if isinstance(stage, dict) else None)


def write_status(path, status):
    write_json(path, status.to_json())


def read_status(path):
    """The last published Status; an empty Status (nothing connected, not programmed) without one."""
    return Status.from_json(read_json(path) or {})


def write_placement(path, doc):
    write_json(path, doc)


def read_placement(path):
    """TE's last placement document (te-placement.json), or None."""
    return read_json(path)


# -- the controller's configuration and command line ------------------------------------------------
@dataclass(frozen=True)
class AppConfig:
    """Everything a controller app is configured with, handed to it as one object."""

    app: str                 # a name in fabriclab.apps.APPS
    options: dict            # its parsed options (choice.Routing.settings)
    fabric: Fabric
    files: RunFiles          # where it publishes its status and reads jobs and steering
    run_id: str = ""

    @classmethod
    def from_args(cls, args):
        files = RunFiles(args.run_dir)
        return cls(args.app, json.loads(args.options), Fabric.from_json(files.fabric.read_text()), files,
                   args.run_id)


def command_line(app, options, run_dir, port, run_id="", listen="127.0.0.1"):
    """The controller process's arguments after `python -m fabriclab.apps.runner`."""
    return ["--app", app, "--run-dir", str(run_dir), "--port", str(port), "--listen", listen,
            "--options", json.dumps(options), "--run-id", run_id]


def _listen_address(text):
    import ipaddress

    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not an IP address") from None
    if address.is_unspecified:
        raise argparse.ArgumentTypeError("listen on one address, not every interface")
    return str(address)


def argument_parser(apps):
    parser = argparse.ArgumentParser(prog="fabriclab-controller")
    def app(name):
        from fabriclab.apps import RoutingError, app_info, is_custom, is_osken_app

        if name in apps:
            return name
        if not (is_custom(name) or is_osken_app(name)):
            raise argparse.ArgumentTypeError(f"invalid choice: {name[:60]!r} (choose from {', '.join(sorted(apps))}, "
                                             f"or PATH.py:Class)")
        try:
            app_info(name)
        except RoutingError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return name

    parser.add_argument("--app", required=True, type=app, help=f"one of {', '.join(sorted(apps))}, or a routing "
                                                                 f"class of one's own (PATH.py:Class, module:Class)")
    parser.add_argument("--run-dir", required=True,
                        help=f"the run folder: {FABRIC_FILE} in, {STATUS_FILE} out, {JOBS_FILE} and "
                             f"{STEERING_FILE} watched")
    parser.add_argument("--port", type=int, required=True, help="OpenFlow listen port")
    # Loopback for the lab's own switches; a containerlab export names the controller container's
    # management address (fabriclab/export/containerlab.py), never every interface.
    parser.add_argument("--listen", default="127.0.0.1", type=_listen_address,
                        help="the address to listen on (default 127.0.0.1)")
    parser.add_argument("--options", default="{}", help="the app's options as JSON (see fabriclab.apps)")
    parser.add_argument("--run-id", default="", help="the lab run this controller serves")
    parser.add_argument("--log", help="log file (default: stderr)")
    return parser


# -- the controller's one watcher of what the lab sends -----------------------------------------------
WATCH_PERIOD_S = 0.02     # two stat() calls per period; a change is seen within 20 ms


class InboxWatcher:
    """Watches the files the lab writes for the controller (jobs, steering) and hands each new
    version to its callback: `on_jobs({name: Job})`, `on_steering(SteeringPlan | None)`.

    Polling, not inotify: the full-kernel tier runs on a 9p root where inotify sees nothing. A
    version is (inode, size, mtime): an atomic rename always brings a new inode."""

    def __init__(self, files, on_jobs=None, on_steering=None, on_error=None, period_s=WATCH_PERIOD_S):
        self.period_s = period_s
        self.on_error = on_error
        self.watched = []             # [path, reader, callback, last version]
        if on_jobs is not None:
            self.watched.append([files.jobs, read_jobs, on_jobs, None])
        if on_steering is not None:
            self.watched.append([files.steering, read_steering, on_steering, None])

    @staticmethod
    def _version(path):
        try:
            st = os.stat(path)
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def poll(self):
        """One pass: call back for every file that changed since the last pass (or, at the first
        pass, that exists). Returns the number of callbacks made."""
        calls = 0
        for entry in self.watched:
            path, reader, callback, seen = entry
            version = self._version(path)
            if version == seen:
                continue
            entry[3] = version
            if version is None and seen is None:
                continue
            calls += 1
            try:
                callback(reader(path))
            except Exception as exc:      # noqa: BLE001 - one bad version must not stop the watch
                if self.on_error is None:
                    raise
                self.on_error(path, exc)
        return calls

    def run(self, stop=None):
        """Poll until `stop` (a threading.Event) is set; forever without one."""
        while stop is None or not stop.is_set():
            self.poll()
            time.sleep(self.period_s)
