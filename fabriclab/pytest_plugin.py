"""pytest fixtures for experiments on real fabrics; installed with fabriclab (entry point pytest11),
so any test file in the lab's virtualenv can use them:

    def test_flap_is_absorbed(lab_for, run_scenario):
        lab = lab_for("tiny")                       # built once per session, repaired after each test
        doc = run_scenario("examples/scenarios/flap_recovery.yaml", lab=lab)
        ...

`lab_for(spec, routing="ecmp")` returns a running Lab shared by the tests of a module that ask for
the same spec (a spec name or path); the routing app is switched on the live fabric when a test
asks for another one. After each test, every fault it left (links down, reshaped links) is undone.
One fabric runs at a time and it stops when the module ends: switch and host names are global on
a machine, so another spec, or a test that builds its own Lab, needs them free.
`run_scenario(path_or_mapping, lab=None, **kw)` runs a scenario into the test's tmp_path and
returns the results document; with `lab=` it runs on that shared fabric instead of building one.
`run_plan(plan, lab=None, **kw)` does the same for any pipeline Plan (fabriclab.workflows.plan)
and returns the PlanResult (the document, the folder, and each run's port series).
All skip the test, saying why, without root.
"""

from __future__ import annotations

import os

import pytest

from fabriclab.apps import DEFAULT_ROUTING


def pytest_configure(config):
    config.addinivalue_line("markers", "lab: builds a real fabric (needs root, Open vSwitch, Mininet)")


class LabPool:
    """The running lab and its spec; asking for another spec stops it first."""

    def __init__(self):
        self.key, self.lab = None, None

    def get(self, spec, routing=DEFAULT_ROUTING):
        from fabriclab.lab.lab import Lab
        from fabriclab.topologies.spec import load_spec

        if self.key != str(spec) or self.lab is None or self.lab.net is None:
            self.close()
            self.lab = Lab(load_spec(spec), routing=routing).start()
            self.key = str(spec)
        elif self.lab.routing != routing:
            self.lab.set_routing(routing)
        return self.lab

    def close(self):
        if self.lab is not None:
            self.lab.stop()
        self.key, self.lab = None, None


def _need_root():
    if os.geteuid() != 0:
        pytest.skip("lab fixture: needs root (run the tests with sudo)")


@pytest.fixture(scope="module")
def fabriclab_pool():
    pool = LabPool()
    yield pool
    pool.close()


@pytest.fixture
def lab_for(fabriclab_pool):
    """lab_for(spec, routing="ecmp") -> a running, shared Lab; its faults are undone afterwards."""
    _need_root()
    used = []

    def get(spec, routing=DEFAULT_ROUTING):
        lab = fabriclab_pool.get(spec, routing)
        used.append(lab)
        return lab

    yield get
    for lab in used:
        if lab.net is not None:
            lab.restore()


@pytest.fixture
def run_plan(tmp_path):
    """run_plan(plan, lab=None, **kw) -> PlanResult (folder in tmp_path)."""
    _need_root()
    from fabriclab.workflows import pipeline

    def run(plan, lab=None, out=None, **kw):
        return pipeline.run_plan(plan, out or tmp_path / plan.name.replace("/", "-"), lab=lab, **kw)

    return run


@pytest.fixture
def run_scenario(run_plan, tmp_path):
    """run_scenario(path or mapping, lab=None, **kw) -> results document (folder in tmp_path)."""
    from fabriclab.workflows import scenario

    def run(source, lab=None, out=None, **kw):
        sc = scenario.parse(source) if isinstance(source, dict) else scenario.load(source)
        return run_plan(scenario.to_plan(sc), lab=lab, out=out or tmp_path / "scenario", **kw).doc

    return run
