"""Extensions from installed packages (fabriclab/plugins.py): examples/plugin's routing app and
experiment, found through their entry points as pip would install them (a dist-info folder on
sys.path), without building a wheel; tests/lab/test_plugin.py installs it with pip and runs it."""

import pathlib
import sys

import pytest

from fabriclab import plugins
from fabriclab.apps.choice import Routing
from fabriclab.errors import LabError
from tests.unit.routings import parsed

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "plugin"


def installed(tmp_path, monkeypatch, entry_points):
    """A distribution whose entry_points.txt is `entry_points`, importable from the example's folder."""
    dist = tmp_path / "fabriclab_example_plugin-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fabriclab-example-plugin\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text(entry_points)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(EXAMPLE))
    monkeypatch.setattr(plugins, "_found", {})
    for name in [m for m in sys.modules if m.startswith("fabriclab_example")]:
        monkeypatch.delitem(sys.modules, name)


@pytest.fixture
def example(tmp_path, monkeypatch):
    text = (EXAMPLE / "pyproject.toml").read_text()
    routing = text.split('[project.entry-points."fabriclab.routing"]\n')[1].split("\n")[0].replace('"', "")
    experiment = text.split('[project.entry-points."fabriclab.experiments"]\n')[1].split("\n")[0].replace('"', "")
    installed(tmp_path, monkeypatch, f"[fabriclab.routing]\n{routing}\n"
                                     f"ecmp = fabriclab_example.routing:APP\n"        # built-ins win
                                     f"[fabriclab.experiments]\n{experiment}\n")


def test_the_plugins_routing_app_is_an_app_like_the_built_in_ones(example):
    from fabriclab.apps import APPS, app_info, app_names
    from fabriclab.apps.ecmp import EcmpRouting
    from fabriclab.topologies.fabric import Fabric
    from fabriclab.topologies.spec import load_spec

    assert app_names() == [*APPS, "first-path"] and app_info("ecmp") is APPS["ecmp"]
    assert parsed("first-path") == ("first-path", {})
    assert Routing.parse("first-path").with_seed(3) == "first-path"              # it hashes nothing: no seed
    fabric = Fabric(load_spec("tiny"))
    single = app_info("first-path").routing_class()(fabric).desired()
    spread = EcmpRouting(fabric).desired()
    assert {len(g) for s in single.values() for g in s.groups.values()} == {1}
    assert max(len(g) for s in spread.values() for g in s.groups.values()) == 2
    with pytest.raises(LabError, match="first-path names no placement of the flow model"):
        from fabriclab.model import placement
        from fabriclab.model.graph import ClosGraph
        from fabriclab.model.routes import Routes

        graph = ClosGraph.from_spec(fabric.spec)
        placement.place(graph, Routes(graph), [], "first-path")


def test_the_plugins_experiment_plans_and_checks_like_a_built_in_one(example):
    from fabriclab.lab.lab import Lab
    from fabriclab.workflows import pipeline
    from fabriclab.workflows.experiments import EXPERIMENTS, Options, build_plan, module, names

    assert names() == [*EXPERIMENTS, "first-path-vs-ecmp"]
    assert module("first-path-vs-ecmp").NAME == "first-path-vs-ecmp"
    plan = build_plan("first-path-vs-ecmp", options=Options(quick=True))
    assert [(r.label, r.routing) for r in plan.runs] == [("ECMP", "ecmp:seed=1"), ("first path", "first-path")]
    pipeline.check(plan, Lab(plan.spec, routing=plan.runs[0].routing))


def test_a_plugin_that_does_not_load_is_named_in_one_line(tmp_path, monkeypatch):
    installed(tmp_path, monkeypatch, "[fabriclab.routing]\nbroken = fabriclab_missing.mod:APP\n"
                                     "[fabriclab.experiments]\nhalf = fabriclab_example.routing\n"
                                     "Bad Name = fabriclab_example.experiment\n")
    from fabriclab.apps import RoutingError
    from fabriclab.workflows.experiments import module, names

    with pytest.raises(RoutingError, match=r"^plugin 'broken' \(package fabriclab-example-plugin\) of "
                                           r"fabriclab.routing does not load: ModuleNotFoundError"):
        parsed("broken")
    with pytest.raises(LabError, match=r"experiment half: module fabriclab_example.routing lacks NAME"):
        module("half")
    assert "Bad Name" not in names()
