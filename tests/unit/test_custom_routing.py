"""A routing class of one's own (`--routing ./my_app.py:MyRouting`, or `package.module:Class`):
parsed, imported and checked before anything is built, refused in one line when it does not load,
and given the same fabric and failure events as the built-in apps. examples/routing's file is the
user's recipe; tests/lab/test_custom_routing.py runs it on a real fabric."""

import pathlib

import pytest

from fabriclab.apps import RoutingError, app_info, control, is_custom
from fabriclab.apps.choice import Routing
from fabriclab.errors import LabError
from fabriclab.lab.controller import check_app
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import load_spec
from tests.unit.routings import label_of, parsed

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "routing" / "by_destination.py"
CHOICE = f"{EXAMPLE.relative_to(ROOT)}:ByDestination"


@pytest.fixture
def at_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def test_a_file_and_class_is_an_app_with_the_hashing_options(at_root):
    assert is_custom(CHOICE) and is_custom("my_pkg.routing:Mine") and not is_custom("te:period_s=2")
    name, options = parsed(CHOICE)
    assert name == f"{EXAMPLE}:ByDestination" and options == {"seed": 0, "shared_basis": False}
    assert Routing.parse(CHOICE).with_seed(7) == f"{CHOICE}:seed=7"
    assert parsed(Routing.parse(CHOICE).with_seed(7))[1]["seed"] == 7
    assert Routing.parse(f"{CHOICE}:seed=2").with_seed(7) == f"{CHOICE}:seed=2"             # the choice's own seed stands
    assert label_of(f"{CHOICE}:seed=2") == f"{EXAMPLE}:ByDestination:seed=2"
    assert app_info(name).model is None                                       # the flow model cannot predict it


def test_the_example_pins_each_destination_leaf_to_one_next_hop_and_fails_over(at_root):
    fabric = Fabric(load_spec("tiny"))
    routing = app_info(CHOICE).routing_class()(fabric)
    up = routing.desired()
    uplinks = {leaf: sorted(l.a_port for l in fabric.fabric_links if l.a == leaf) for leaf in ("l1", "l2")}
    # l1 reaches leaf 2 over its uplink 2 % 2 = the first; l2 reaches leaf 1 over 1 % 2 = the second
    assert list(up["l1"].groups.values()) == [(uplinks["l1"][0],)]
    assert list(up["l2"].groups.values()) == [(uplinks["l2"][1],)]
    (first,) = [l for l in fabric.fabric_links if l.a == "l1" and l.a_port == uplinks["l1"][0]]
    after = routing.desired(frozenset({first.key}))
    assert list(after["l1"].groups.values()) == [(uplinks["l1"][1],)]       # the live member takes over


@pytest.mark.parametrize("source, message", [
    ("raise RuntimeError('no GPU here')\n", "does not load: RuntimeError: no GPU here"),
    ("def broken(:\n", "does not load: SyntaxError"),
    ("Mine = 3\n", "is not a class with desired\\(down\\)"),
    ("class Other:\n    pass\n", "is not a class with desired\\(down\\)"),
])
def test_a_file_that_does_not_load_is_refused_in_one_line(tmp_path, source, message):
    path = tmp_path / f"app{abs(hash(source))}.py"
    path.write_text(source)
    with pytest.raises(LabError, match=message) as err:
        check_app(f"{path}:Mine")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("choice, message", [
    ("nowhere/app.py:Mine", "no file"),
    ("examples/routing/by_destination.py:", "name the class after the file"),
    ("no_such_pkg.routing:Mine", "does not load: ModuleNotFoundError"),
    (f"{CHOICE}:period_s=2", "unknown option 'period_s'"),
])
def test_bad_choices_are_refused_in_one_line(at_root, choice, message):
    with pytest.raises(RoutingError, match=message):
        parsed(choice)


def test_the_controller_process_accepts_the_file_by_its_absolute_path(at_root):
    parser = control.argument_parser(["ecmp", "te"])
    name = parsed(CHOICE)[0]
    assert parser.parse_args(["--app", name, "--run-dir", "/tmp", "--port", "1"]).app == name
    with pytest.raises(SystemExit):
        parser.parse_args(["--app", "nosuch", "--run-dir", "/tmp", "--port", "1"])


# -- an os-ken app of one's own (`osken:PATH.py[:Class]`): the whole controller ------------------------
OSKEN_EXAMPLE = ROOT / "examples" / "apps" / "learning_switch.py"


def test_an_osken_app_is_named_by_file_and_takes_no_options(at_root):
    from fabriclab.apps import is_osken_app

    choice = "osken:examples/apps/learning_switch.py"
    assert is_osken_app(choice) and not is_custom(choice)
    assert parsed(choice) == (f"osken:{OSKEN_EXAMPLE}:LearningSwitch", {})
    assert parsed(choice + ":LearningSwitch")[0] == f"osken:{OSKEN_EXAMPLE}:LearningSwitch"
    assert Routing.parse(choice).with_seed(7) == choice                  # its hashing is its own: no seed to set
    assert label_of(choice) == f"osken:{OSKEN_EXAMPLE}:LearningSwitch"
    info = app_info(choice)
    assert info.osken_app == f"{OSKEN_EXAMPLE}:LearningSwitch" and info.model is None and info.options == ()


OSKEN_APP = """from os_ken.base import app_manager
class {name}(app_manager.OSKenApp):
    pass
"""


@pytest.mark.parametrize("text, suffix, said", [
    ("raise RuntimeError('boom')\n", "", "does not load: RuntimeError: boom"),
    ("import no_such_module_here\n", "", "does not load: ModuleNotFoundError"),
    ("X = 1\n", "", "it defines 'none'"),
    (OSKEN_APP.format(name="A") + OSKEN_APP.format(name="B").split("\n", 1)[1], "", "it defines 'A, B'"),
    (OSKEN_APP.format(name="A"), ":B", "(B); it defines 'A'"),
    (OSKEN_APP.format(name="A"), ":gap_us=5", "takes no options"),
])
def test_an_osken_app_that_is_not_one_is_refused_in_one_line(tmp_path, text, suffix, said):
    path = tmp_path / f"app_{abs(hash(text + suffix))}.py"
    path.write_text(text)
    with pytest.raises(LabError, match=said.replace("(", r"\(").replace(")", r"\)")) as caught:
        check_app(f"osken:{path}{suffix}")
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("choice, said", [
    ("osken:/no/such/app.py", "no file"), ("osken:", "neither a .py file nor a module name"),
    ("osken:not a module", "neither a .py file nor a module name"),
])
def test_an_osken_app_that_is_not_there_is_refused(choice, said):
    with pytest.raises(LabError, match=said):
        check_app(choice)


def test_the_controller_loads_the_users_module_for_os_ken(at_root):
    import sys

    from fabriclab.apps import runner

    name = runner._user_module("osken:examples/apps/learning_switch.py")
    assert sys.modules[name].LearningSwitch.__module__ == name
    assert runner._user_module("ecmp") is None


# -- a controller the lab does not start (`tcp:HOST:PORT`) ------------------------------------------------
def test_an_external_controller_is_an_address():
    from fabriclab.apps import is_external

    assert is_external("tcp:10.0.0.5:6653") and not is_external("te:period_s=2")
    assert parsed("tcp:10.0.0.5:6653") == ("tcp:10.0.0.5:6653", {})
    assert parsed(" tcp:127.0.0.1:06653 ")[0] == "tcp:127.0.0.1:6653"
    assert Routing.parse("tcp:10.0.0.5:6653").with_seed(3) == "tcp:10.0.0.5:6653"
    assert app_info("tcp:10.0.0.5:6653").external == "tcp:10.0.0.5:6653"


@pytest.mark.parametrize("choice, said", [
    ("tcp:localhost:6653", "IPv4 address"), ("tcp:10.0.0.5", "IPv4 address"), ("tcp:10.0.0.5:0", "port 1-65535"),
    ("tcp:10.0.0.5:70000", "port 1-65535"), ("tcp:0.0.0.0:6653", "one address"), ("tcp:10.0.0.5:66x", "port"),
])
def test_an_external_controller_that_is_no_address_is_refused(choice, said):
    with pytest.raises(LabError, match=said):
        check_app(choice)
