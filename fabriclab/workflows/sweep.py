"""Sweeps: a scenario file with a `sweep:` section of parameter lists, run as every combination.

    name: qps-by-size
    spec: tiny
    jobs:
      - {name: ring, collective: allreduce, sizes: [256K], iterations: 3}
    sweep:
      routing: [ecmp, flowlet]              # a top-level field
      jobs.ring.qps: [1, 4]                 # a job's field, the job named by its name
      faults.0.at: [1.0, 2.0]               # a fault's field, the fault by its index

Each combination is a case: the scenario with those values put in, checked like any scenario file
before anything runs. A case runs into FOLDER/cases/<case id>/ and FOLDER/sweep.json records every
case's state as it goes, so running the same sweep into the same folder again resumes it: cases
already done are kept, the rest run. The case id is its index and a hash of its values, so an
edited sweep never mistakes an old case for one of its own.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import itertools
import json
import os
import pathlib
import time

from fabriclab.errors import LabError
from fabriclab.loading import clip, excerpt, load_yaml
from fabriclab.workflows import scenario as scenario_mod

MAX_PARAMETERS = 8
MAX_VALUES = 64               # values one parameter takes
MAX_CASES = 256
# Every case is the whole scenario, copied and checked as a scenario file is (and again against its
# fabric by --check): the work is the cases times the scenario's values (keys, items, scalars), a
# few microseconds each. 256 cases of a 4000-value scenario (hundreds of faults) are 2 s; 256 of
# one at the loader's 100,000 values would be a minute.
MAX_CASE_VALUES = 1_000_000
# Runs of all the cases together (each case's routing schemes x repetitions). A run is seconds of
# traffic at the least: 10,000 of 10 s each are more than a day on one machine.
MAX_SWEEP_RUNS = 10_000
STATE_FILE = "sweep.json"
STATES = ("pending", "running", "done", "failed")


@dataclasses.dataclass
class Case:
    index: int
    params: dict              # {parameter path: value}
    data: dict                # the scenario, values put in

    @property
    def id(self):
        digest = hashlib.sha256(json.dumps(self.params, sort_keys=True).encode()).hexdigest()[:8]
        return f"c{self.index:03d}-{digest}"

    @property
    def label(self):
        return ", ".join(f"{k}={_short(v)}" for k, v in self.params.items())


@dataclasses.dataclass
class Sweep:
    name: str
    path: pathlib.Path
    parameters: dict          # {parameter path: [values]}, in the file's order
    cases: list

    def fingerprint(self):
        """What identifies this sweep in a folder: its name and every case's id."""
        return {"name": self.name, "cases": [case.id for case in self.cases]}


def _short(value):
    text = json.dumps(value, separators=(",", ":")) if not isinstance(value, str) else value
    return text if len(text) <= 24 else text[:21] + "..."


def load(path):
    """Read a sweep file and expand it into checked cases; LabError naming the file and problem."""
    path = pathlib.Path(path)
    data = load_yaml(path, "sweep")
    try:
        return expand(data, path)
    except LabError as exc:
        raise LabError(f"{clip(path)}: {exc}") from None


def expand(data, path=pathlib.Path("sweep.yaml")):
    """The Sweep of a parsed file: one Case per combination of the parameters' values, each a
    scenario that scenario.parse accepts."""
    path = pathlib.Path(path)
    if not isinstance(data, dict) or "sweep" not in data:
        raise LabError("sweep: the file is a scenario with a `sweep:` mapping of parameters to value lists")
    params = data["sweep"]
    if not isinstance(params, dict) or not params:
        raise LabError("sweep: `sweep:` must map parameters (routing, jobs.NAME.FIELD, faults.N.FIELD, "
                       "metrics.FIELD, ...) to lists of values")
    if len(params) > MAX_PARAMETERS:
        raise LabError(f"sweep: at most {MAX_PARAMETERS} parameters, got {len(params)}")
    base = {k: v for k, v in data.items() if k != "sweep"}
    for key, values in params.items():
        if not isinstance(key, str) or not key:
            raise LabError(f"sweep: a parameter must be a path like jobs.ring.qps, got {excerpt(key)}")
        if not isinstance(values, list) or not values:
            raise LabError(f"sweep: {excerpt(key)} must list its values, e.g. [1, 4], got {excerpt(values)}")
        if len(values) > MAX_VALUES:
            raise LabError(f"sweep: {excerpt(key)} lists {len(values)} values; at most {MAX_VALUES}")
        seen = [json.dumps(v, sort_keys=True, default=str) for v in values]
        if len(set(seen)) != len(seen):
            raise LabError(f"sweep: {excerpt(key)} lists a value twice")
        locate(base, key)                         # the path must lead somewhere in the scenario
    count = 1
    for values in params.values():
        count *= len(values)
    if count > MAX_CASES:
        raise LabError(f"sweep: {count} combinations; at most {MAX_CASES} (fewer values, or two sweeps)")
    size = _values(base)
    if count * size > MAX_CASE_VALUES:
        raise LabError(f"sweep: {count} cases of a {size}-value scenario are {count * size} values to check; "
                       f"at most {MAX_CASE_VALUES} (fewer cases, or a shorter scenario)")
    cases, runs = [], 0
    for index, combo in enumerate(itertools.product(*params.values())):
        case_params = dict(zip(params, combo))
        case_data = copy.deepcopy(base)
        for key, value in case_params.items():
            parent, last = locate(case_data, key)
            parent[last] = copy.deepcopy(value)
        case = Case(index, case_params, case_data)
        try:
            parsed = scenario_mod.parse(case_data, path.parent)
        except LabError as exc:
            raise LabError(f"sweep: case {case.label}: {exc}") from None
        runs += len(parsed.routings) * parsed.repetitions
        if runs > MAX_SWEEP_RUNS:
            raise LabError(f"sweep: the first {index + 1} of {count} cases are {runs} runs (routing schemes x "
                           f"repetitions); at most {MAX_SWEEP_RUNS} in a sweep (fewer repetitions or cases)")
        cases.append(case)
    name = base.get("name") if isinstance(base.get("name"), str) else "sweep"
    return Sweep(name.strip() or "sweep", path, dict(params), cases)


def _values(data):
    """Keys, items and scalars in a parsed document (iteratively)."""
    count, stack = 0, [data]
    while stack:
        item = stack.pop()
        count += 1
        if isinstance(item, dict):
            count += len(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return count


def check(sweep):
    """Every case against its fabric, as `scenario check` checks a file; LabError naming the case.
    Cases on one spec share one (unstarted) Lab: the fabric is built once, not once a case."""
    from fabriclab.lab.lab import Lab
    from fabriclab.workflows import pipeline

    labs = {}
    for case in sweep.cases:
        try:
            parsed = scenario_mod.parse(case.data, sweep.path.parent)
            plan = scenario_mod.to_plan(parsed)
            lab = labs.get(parsed.spec_path())
            if lab is None:
                lab = labs[parsed.spec_path()] = Lab(plan.spec, routing=plan.runs[0].routing)
            pipeline.check(plan, lab)
        except LabError as exc:
            raise LabError(f"sweep: case {case.label}: {exc}") from None


def locate(data, key):
    """(the container, the key or index) that parameter path `key` sets in a scenario dict: dict
    keys by name, a job by its `name`, a fault (or any list item) by its index."""
    parts = key.split(".")
    node = data
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        if isinstance(node, dict):
            if depth == 0 and part not in scenario_mod.TOP_FIELDS:
                raise LabError(f"sweep: {excerpt(key)}: no scenario field {excerpt(part)} "
                               f"(fields: {', '.join(scenario_mod.TOP_FIELDS)})")
            if last:
                return node, part
            if part not in node:
                raise LabError(f"sweep: {excerpt(key)}: the scenario has no {excerpt(part)} to vary")
            node = node[part]
        elif isinstance(node, list):
            if part.isdigit():
                index = int(part)
                if index >= len(node):
                    raise LabError(f"sweep: {excerpt(key)}: there are only {len(node)} entries")
            else:
                named = [i for i, item in enumerate(node) if isinstance(item, dict) and item.get("name") == part]
                if not named:
                    raise LabError(f"sweep: {excerpt(key)}: no entry named {excerpt(part)}")
                index = named[0]
            if last:
                return node, index
            node = node[index]
        else:
            raise LabError(f"sweep: {excerpt(key)}: {excerpt(part)} is inside a value, not a mapping or list")
    raise LabError(f"sweep: {excerpt(key)} is empty")


# -- the folder's record ---------------------------------------------------------------------------
class Record:
    """FOLDER/sweep.json: every case's state, written after each change (atomically), so a
    sweep killed half way resumes from it."""

    def __init__(self, folder, sweep):
        self.folder, self.sweep = pathlib.Path(folder), sweep
        self.path = self.folder / STATE_FILE
        self.states = {case.id: {"state": "pending", "machine": None, "error": None, "seconds": None}
                       for case in sweep.cases}
        if self.path.exists():
            self._resume()

    def _resume(self):
        try:
            old = json.loads(self.path.read_text())
            fingerprint, cases = old["fingerprint"], old["cases"]
        except (OSError, ValueError, KeyError, TypeError):
            raise LabError(f"{clip(self.path)} is unreadable; choose another --out or remove it") from None
        if fingerprint != self.sweep.fingerprint():
            raise LabError(f"{clip(self.folder)} holds another sweep (or this one edited); choose another --out")
        for entry in cases:
            state = self.states.get(entry.get("id"))
            if state is not None and entry.get("state") == "done" and self.case_folder(entry["id"]).joinpath(
                    "results.json").is_file():
                state.update(state="done", machine=entry.get("machine"), seconds=entry.get("seconds"))

    def case_folder(self, case_id):
        return self.folder / "cases" / case_id

    def pending(self):
        return [case for case in self.sweep.cases if self.states[case.id]["state"] != "done"]

    def set(self, case, state, **detail):
        self.states[case.id].update(state=state, **detail)
        self.write()

    def write(self):
        self.folder.mkdir(parents=True, exist_ok=True)
        doc = {"fingerprint": self.sweep.fingerprint(), "file": str(self.sweep.path),
               "parameters": self.sweep.parameters, "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
               "cases": [{"id": case.id, "index": case.index, "params": case.params, **self.states[case.id]}
                         for case in self.sweep.cases]}
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(doc, indent=1, default=str))
        os.replace(tmp, self.path)


def write_case_file(case, folder, sweep_path):
    """The case as a scenario file in `folder` (its spec made absolute where it is a file), for
    `fabriclab scenario run` here or on another machine; returns its path."""
    data = copy.deepcopy(case.data)
    spec = data.get("spec")
    candidate = pathlib.Path(sweep_path).parent / str(spec)
    if isinstance(spec, str) and candidate.is_file():
        data["spec"] = str(candidate.resolve())
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "case.json"                 # JSON is YAML: the scenario loader reads it
    path.write_text(json.dumps(data, indent=1, default=str))
    return path


# -- running ---------------------------------------------------------------------------------------
def run(sweep, folder, inventory=None, log=print, verbose=False):
    """Run the cases not yet done into `folder` (here, one after another, or over an inventory's
    machines); returns the Record. Each case's scenario is written to its folder first; a bad
    inventory is refused before anything is written."""
    from fabriclab.workflows import fanout

    found = fanout.machines(inventory) if inventory is not None else None
    record = Record(folder, sweep)
    pending = record.pending()
    done = len(sweep.cases) - len(pending)
    if done:
        log(f"{done} of {len(sweep.cases)} case(s) already done in {clip(folder)}; running the other {len(pending)}")
    record.write()
    files = {case.id: write_case_file(case, record.case_folder(case.id), sweep.path) for case in pending}
    if inventory is None:
        for case in pending:
            _run_here(record, case, files[case.id], log, verbose)
        return record
    left = fanout.fan_out(inventory, pending, lambda c: files[c.id], lambda c: record.case_folder(c.id),
                          record.set, log, found=found)
    if left:
        log(f"{len(left)} case(s) left: every machine dropped out (run the sweep again to resume)")
    return record


def _run_here(record, case, case_file, log, verbose):
    from fabriclab.workflows import pipeline

    record.set(case, "running", machine="local")
    log(f"{case.id} ({case.label}): running here")
    t0 = time.monotonic()
    try:
        plan = scenario_mod.to_plan(scenario_mod.load(case_file))
        pipeline.run_plan(plan, record.case_folder(case.id), verbose=verbose)
    except LabError as exc:
        record.set(case, "failed", error=str(exc))
        log(f"{case.id}: failed: {exc}")
        return
    except BaseException:
        record.set(case, "pending", machine=None)
        raise
    record.set(case, "done", seconds=round(time.monotonic() - t0, 1), error=None)
    log(f"{case.id}: done in {time.monotonic() - t0:.0f} s")


def summary(record):
    """A row per case: {id, params, state, machine, error, busbw_mbps, cct_p50_ms, cct_p99_ms,
    valid}: the first measured job's first size (None where the case has no result)."""
    from fabriclab.results import compare, document

    out = []
    for case in record.sweep.cases:
        state = record.states[case.id]
        row = {"id": case.id, "params": case.params, "state": state["state"], "machine": state["machine"],
               "error": state["error"], "busbw_mbps": None, "cct_p50_ms": None, "cct_p99_ms": None, "valid": None}
        if state["state"] == "done":
            doc = document.load(record.case_folder(case.id))
            rows = compare.rows(doc, case.id)
            first = next((r for r in rows if r["role"] != "noise"), rows[0] if rows else None)
            if first is not None:
                row.update(busbw_mbps=first["busbw_mbps"], cct_p50_ms=first["cct_p50_ms"],
                           cct_p99_ms=first["cct_p99_ms"])
            row["valid"] = doc.get("valid")
        out.append(row)
    return out


def by_parameter(rows, parameter):
    """[(value, mean busbw, mean CCT p99, cases)] over the done cases, per value of `parameter`
    in the sweep's order (the other parameters averaged over)."""
    groups = {}
    for row in rows:
        key = json.dumps(row["params"][parameter], sort_keys=True, default=str)
        entry = groups.setdefault(key, (row["params"][parameter], [], []))
        if row["state"] == "done":
            if row["busbw_mbps"] is not None:
                entry[1].append(row["busbw_mbps"])
            if row["cct_p99_ms"] is not None:
                entry[2].append(row["cct_p99_ms"])
    mean = (lambda xs: sum(xs) / len(xs) if xs else None)
    return [(value, mean(busbw), mean(cct), len(busbw)) for value, busbw, cct in groups.values()]
