"""A routing choice is parsed once, where it enters, into a Routing that everything below takes as
it is: its label, its seed, its equality, and how many times the app is looked up on the way."""

import dataclasses

import pytest

from fabriclab.apps import RoutingError, choice
from fabriclab.apps.choice import Routing
from fabriclab.errors import LabError
from fabriclab.lab.controller import check_app
from fabriclab.workflows.plan import Job, RunPlan


def test_the_label_is_the_app_and_the_options_that_differ_from_its_defaults():
    r = Routing.parse(" flowlet:gap_us=500, qp=on ")
    assert r.name == "flowlet" and r.settings["gap_us"] == 500.0 and r.settings["qp"] is True
    assert r.label == str(r) == "flowlet:gap_us=500.0,qp=True" and r.given == {"gap_us", "qp"}
    assert Routing.parse("ecmp:seed=0").label == "ecmp" and repr(Routing.parse("te")) == "Routing('te')"
    with pytest.raises(TypeError):
        r.settings["gap_us"] = 1.0                   # a value: its options cannot change under it


def test_equal_choices_are_equal_whatever_their_spelling_and_hash_alike():
    a, b = Routing.parse("ecmp"), Routing.parse("ecmp:seed=0,weights=off")
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a == "ecmp" and a == "ecmp:seed=0" and a != "ecmp:seed=1" and a != "nosuch" and a != 3
    assert Routing.parse(a) is a                     # a Routing passes through, unparsed


def test_a_runs_seed_fills_only_a_seed_the_choice_did_not_set():
    r = Routing.parse("eecmp").with_seed(4)
    assert r.settings["seed"] == 4 and r == "eecmp:seed=4" and "seed" in r.given
    assert r.with_seed(9) is r                       # set once: the next seed does not replace it
    own = Routing.parse("eecmp:seed=2")
    assert own.with_seed(7) is own
    with pytest.raises(RoutingError, match="whole number >= 0"):
        Routing.parse("ecmp").with_seed(-1)
    assert Routing.parse("tcp:127.0.0.1:6653").with_seed(3).external


def test_bad_choices_are_one_line_errors():
    for text, message in (("", "routing must be an app name"), (None, "routing must be an app name"),
                          ("nosuch", "unknown routing app"), ("te:nope=1", "unknown option 'nope'"),
                          ("te:period_s", "needs a value"), ("te:period_s=0", "must be > 0")):
        with pytest.raises(RoutingError, match=message):
            Routing.parse(text)
    with pytest.raises(LabError, match="unknown routing app"):
        check_app("nosuch")


def test_the_app_is_looked_up_once_on_its_way_down(monkeypatch):
    """The edge parses; a RunPlan, a replaced RunPlan, the seed and the controller's check take the
    Routing as it is (a routing class of one's own would otherwise be imported at each)."""
    calls = []
    real = choice.app_info
    monkeypatch.setattr(choice, "app_info", lambda name: calls.append(name) or real(name))
    routing = check_app("flowlet:gap_us=500")
    run = RunPlan("r", routing, [Job("j", None)])
    seeded = dataclasses.replace(run, routing=run.routing.with_seed(3))
    assert check_app(seeded.routing) is seeded.routing and seeded.routing.settings["seed"] == 3
    assert calls == ["flowlet"]
    assert RunPlan("r", "ecmp").routing == Routing.parse("ecmp")     # a string is parsed where it enters


def test_an_experiment_looks_its_routing_up_once(monkeypatch):
    from fabriclab.workflows.experiments import Options, build_plan

    calls = []
    real = choice.app_info
    monkeypatch.setattr(choice, "app_info", lambda name: calls.append(name) or real(name))
    plan = build_plan("ecmp-balance", options=Options(quick=True, seed=5, routing="ecmp:weights=on"))
    assert calls == ["ecmp"] and len(plan.runs) > 1
    assert all(r.routing == "ecmp:weights=on,seed=5" for r in plan.runs)
    assert plan.source["routing"] == "ecmp:weights=True"       # the record holds text, not the object
