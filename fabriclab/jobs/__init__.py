"""Job kinds: one module each, implementing JobKind, and one line each in MODULES.

A kind owns everything about its jobs: the workload spec a scenario's entry becomes, the runner
that drives its launcher on a live lab, the record it leaves in the results document (and its
branch of `$defs/job` in results/schema.json), and how the report, `compare` and the scenario
tables show that record. The pipeline, the scenario loader, the results document and the report
name no kind: they ask this registry.

    kind = jobs.module(jobs.kind_of(workload))
    runner = kind.Runner(job, lab, run_plan)     # LabError now if the fabric cannot run it
    raw = runner.run(stop, on_start, progress)   # blocks; `stop` ends a job that repeats early
    record = runner.record(raw)                  # the results document's job record

Installed packages add kinds through the `fabriclab.jobs` entry-point group (fabriclab/plugins.py);
a built-in name wins.
"""

from __future__ import annotations

from typing import Protocol

from fabriclab import plugins
from fabriclab.errors import LabError

# name -> module; the name is what a scenario job's `kind` says and what its record's `kind` holds
MODULES = {
    "collective": "fabriclab.jobs.collective",
    "all-pairs": "fabriclab.jobs.allpairs",
    "switchml": "fabriclab.jobs.switchml",
    "replay": "fabriclab.jobs.replay",
}
KINDS = tuple(MODULES)
DEFAULT_KIND = "collective"
# "until duration_s": the stop event ends a repeating job first
DURATION_ITERATIONS = 1_000_000


class JobKind(Protocol):
    """What a job kind's module defines (module-level names; jobs/switchml.py is a short example)."""

    NAME: str            # its key in MODULES, a scenario job's `kind`, its record's `kind`
    SUMMARY: str         # one line for the docs and the scenario loader's messages

    def spec_class(self):
        """The workload dataclass whose instances are this kind's jobs (imported when asked)."""

    def parse(self, entry, base):
        """The workload from a scenario job's fields (`entry`, name/role/kind removed; files
        relative to `base`); LabError, one line, for anything it refuses."""

    def check(self, spec):
        """LabError for a workload that cannot run on any fabric (before one is built)."""

    Runner: type         # Runner(job, lab, run_plan): .hosts, .run(stop, on_start, progress), .cancel(), .record(raw)

    def report_lines(self, jobs):
        """report.md's markdown table (a list of lines, [] for none) of [(name, record)] of this kind."""

    def compare_rows(self, job):
        """`compare`'s measures of one record: a dict per row (compare.MEASURES' keys)."""

    def runs_rows(self, job):
        """The scenario table's rows of one record: (workload, busbw, CCT p50, p99, OOS, retrans, LAT)."""


def check_protocol(mod, name):
    """`mod` if it implements JobKind under `name`; LabError naming what it lacks otherwise."""
    return plugins.check_protocol(mod, name, JobKind, ("NAME", "SUMMARY", "Runner"), "job kind",
                                  "fabriclab/jobs/__init__.py")


def names():
    """Every kind's name: the built-in ones, then those installed packages add."""
    return plugins.names(MODULES, plugins.JOBS)


def module(name):
    """The kind's module, built in or added by an installed package, checked against JobKind (a
    built-in one once a process: every job asks for its kind)."""
    if isinstance(name, str) and name in _BUILT_IN:
        return _BUILT_IN[name]
    mod = check_protocol(plugins.module(name, MODULES, plugins.JOBS, "job kind"), name)
    if name in MODULES:
        _BUILT_IN[name] = mod
    return mod


_BUILT_IN = {}


def kinds():
    """{name: module} of every built-in kind, in MODULES' order."""
    return {name: module(name) for name in MODULES}


def kind_of(workload):
    """The kind whose spec class `workload` is an instance of."""
    for name in KINDS:                       # the built-in kinds before any installed package is read
        if isinstance(workload, module(name).spec_class()):
            return name
    for name in names()[len(KINDS):]:
        if isinstance(workload, module(name).spec_class()):
            return name
    classes = ", ".join(module(name).spec_class().__name__ for name in names())
    raise LabError(f"a job's workload is one of {classes}, not {type(workload).__name__}")


def recorded(name):
    """The kind module of a results record's `kind`, or None for one this install does not know
    (a document written with a plugin that is not installed here: the report names such a job
    without its table, `compare` gives it a row of blanks)."""
    try:
        return module(name)
    except LabError:
        return None


def check_workload(workload):
    """What can be checked without a fabric."""
    module(kind_of(workload)).check(workload)


def runner(job, lab, run_plan=None):
    """The adapter that runs `job` on `lab` (not necessarily started yet: everything that can be
    checked against the fabric is checked here, before anything is built)."""
    return module(job.kind).Runner(job, lab, run_plan)
