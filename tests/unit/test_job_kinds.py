"""Job kinds (fabriclab/jobs): one registry, one module per kind behind the JobKind protocol, and
everything that names a kind (the scenario loader, the schema, the report, `compare`, the
scenario table) derived from it. A kind from an installed package is found through its entry
point and shown like a built-in one; a record of a kind that is not installed is named, not lost."""

import json
import sys

import pytest

from fabriclab import jobs, plugins
from fabriclab.errors import LabError
from fabriclab.results import compare, document, report, tables
from fabriclab.workflows import scenario
from tests.unit import resultdocs as rd

# A kind as a third-party package would write it: its record is a burst's completion time.
PLUGIN = '''
import dataclasses

from fabriclab.errors import LabError
from fabriclab.jobs.common import dataclass_workload
from fabriclab.table import markdown_table

NAME = "burst"
SUMMARY = "n senders write one block each to one receiver at once"


@dataclasses.dataclass
class BurstSpec:
    senders: int = 4

    def check(self):
        if not isinstance(self.senders, int) or not 1 <= self.senders <= 64:
            raise LabError(f"senders must be 1-64, got {str(self.senders)[:20]}")


def spec_class():
    return BurstSpec


def check(spec):
    spec.check()


def parse(entry, base):
    return dataclass_workload(BurstSpec, NAME, entry, check=check)


class Runner:
    def __init__(self, job, lab, run_plan):
        self.job, self.hosts = job, {"h1"}

    def run(self, stop, on_start, progress=None):
        return 1.5

    def cancel(self):
        pass

    def record(self, raw):
        return {"kind": NAME, "role": self.job.role, "hosts": ["h1"], "workload": {"senders": 4},
                "valid": True, "invalid": [], "cct_ms": raw}


def report_lines(jobs):
    return markdown_table(("burst job", "CCT ms"), [(name, job["cct_ms"]) for name, job in jobs])


def compare_rows(job):
    return [{"cct_p50_ms": job["cct_ms"]}]


def runs_rows(job):
    return [("burst", "-", job["cct_ms"], "-", "-", "-", "-")]
'''


def installed(tmp_path, monkeypatch, source=PLUGIN, name="burst"):
    """A package `fabriclab_burst` whose entry point adds the kind `name`, as pip would install it."""
    (tmp_path / "fabriclab_burst.py").write_text(source)
    dist = tmp_path / "fabriclab_burst-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fabriclab-burst\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[fabriclab.jobs]\n{name} = fabriclab_burst\n"
                                           "collective = fabriclab_burst\n")       # built-ins win
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(plugins, "_found", {})
    monkeypatch.delitem(sys.modules, "fabriclab_burst", raising=False)


def test_every_built_in_kind_implements_the_protocol_and_names_itself():
    found = jobs.kinds()
    assert list(found) == list(jobs.KINDS) == ["collective", "all-pairs", "switchml", "replay"]
    for name, mod in found.items():
        assert mod.NAME == name and mod.SUMMARY
        assert jobs.kind_of(_default_workload(mod)) == name


def _default_workload(mod):
    cls = mod.spec_class()
    if mod.NAME == "replay":
        from fabriclab.jobs.traces import Op, Trace

        op = Op(0, "allreduce", "allreduce", 1024, (0, 1), "", 0.0, 1e-3)
        return cls(Trace("t.json", "kineto", "gloo", 0, 2, "gloo", [op]))
    return cls()


def test_a_workload_of_no_kind_is_refused_in_one_line():
    with pytest.raises(LabError, match="a job's workload is one of CollectiveSpec, AllPairsSpec, "
                                       "AggregationSpec, ReplaySpec, not dict"):
        jobs.kind_of({})


def test_the_schema_has_a_branch_per_built_in_kind_and_leaves_others_to_their_package():
    schema = json.loads(document.SCHEMA_PATH.read_text())
    branches = schema["$defs"]["job"]["oneOf"]
    consts = [b["properties"]["kind"].get("const") for b in branches]
    assert consts[:-1] == list(jobs.KINDS)
    assert branches[-1]["properties"]["kind"] == {"not": {"enum": list(jobs.KINDS)}}


def test_a_kind_from_an_installed_package_runs_through_the_scenario_loader(tmp_path, monkeypatch):
    installed(tmp_path, monkeypatch)
    assert jobs.names() == [*jobs.KINDS, "burst"]
    assert jobs.module("collective").__name__ == "fabriclab.jobs.collective"      # not the plugin's
    loaded = scenario.parse({"name": "t", "spec": "tiny", "jobs": [{"name": "b", "kind": "burst", "senders": 8}]})
    spec = loaded.jobs[0].spec
    assert type(spec).__name__ == "BurstSpec" and spec.senders == 8 and jobs.kind_of(spec) == "burst"
    with pytest.raises(LabError, match=r"jobs\[0\] \(b\): senders must be 1-64, got 99"):
        scenario.parse({"name": "t", "spec": "tiny", "jobs": [{"name": "b", "kind": "burst", "senders": 99}]})
    with pytest.raises(LabError, match=r"unknown field 'size' \(a burst job takes name, role, kind and: senders\)"):
        scenario.parse({"name": "t", "spec": "tiny", "jobs": [{"name": "b", "kind": "burst", "size": 1}]})
    with pytest.raises(LabError, match=r"kind must be one of collective, all-pairs, switchml, replay, burst, "
                                       r"got 'bursts'"):
        scenario.parse({"name": "t", "spec": "tiny", "jobs": [{"kind": "bursts"}]})


def test_a_kind_that_lacks_a_part_is_named_with_it(tmp_path, monkeypatch):
    installed(tmp_path, monkeypatch, PLUGIN.replace("def runs_rows(job):", "def runs_rows():"))
    with pytest.raises(LabError, match=r"job kind burst: module fabriclab_burst lacks runs_rows\(\) taking 1 "
                                       r"arguments \(the JobKind protocol"):
        jobs.module("burst")


def _with_burst():
    doc = rd.scenario_doc()
    doc["runs"][0]["jobs"]["b"] = {"kind": "burst", "role": "measured", "hosts": ["h1"], "workload": {"senders": 4},
                                   "valid": True, "invalid": [], "cct_ms": 1.5}
    return doc


def test_its_records_are_shown_where_it_is_installed_and_named_where_not(tmp_path, monkeypatch):
    doc = _with_burst()
    assert document.first_problem(doc) is None              # the common fields, then the kind's own
    bare = "\n".join(report._jobs_table(doc["runs"][0]["jobs"]))
    assert "Job b: kind burst is not installed here." in bare and "| ring |" in bare
    (row,) = [r for r in compare.rows(doc, "f") if r["job"] == "b"]
    assert row["job_kind"] == "burst" and row["valid"] is True and row["in_place"] is False
    assert all(row[k] is None for k in compare.MEASURES if k not in ("valid", "in_place"))
    installed(tmp_path, monkeypatch)
    shown = "\n".join(report._jobs_table(doc["runs"][0]["jobs"]))
    assert "| burst job | CCT ms |" in shown and "| b | 1.5 |" in shown
    assert shown.index("| ring |") < shown.index("| b | 1.5 |")          # built-in kinds first
    assert [r["cct_p50_ms"] for r in compare.rows(doc, "f") if r["job"] == "b"] == [1.5]
    assert "burst" in tables.runs_table(doc)
