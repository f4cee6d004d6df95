"""The command line offline: link-event parsing, argument parsing, and `check` on every spec.

Nothing here builds a fabric. `run` is only reached with arguments that must fail before a lab is
made, and `Lab` is replaced by a stub that fails the test if it is ever constructed.
"""

import json

import pytest

from fabriclab.cli import fabric as commands
from fabriclab.cli import main as cli
from fabriclab.errors import LabError
from fabriclab.workflows.faults import parse_link_event
from fabriclab.workflows.plan import link_events
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import load_spec, shipped_specs


@pytest.fixture(autouse=True)
def no_lab(monkeypatch):
    import fabriclab.lab.lab

    def refuse(*args, **kwargs):
        raise AssertionError("a unit test tried to build a lab")
    monkeypatch.setattr(fabriclab.lab.lab, "Lab", refuse)


# -- link events: `run --link-down A-B@T` is a fault on the run's timeline -------------------------

@pytest.mark.parametrize("text, up, expected", [
    ("l1-s1@2", False, (2.0, "link_down", "l1-s1")),
    ("l1-s1@2", True, (2.0, "link_up", "l1-s1")),
    ("s2-l3@0", False, (0.0, "link_down", "s2-l3")),
    ("p1l2-p1s1#2@0.5", True, (0.5, "link_up", "p1l2-p1s1#2")),
    ("l1-s1#1@1.25", False, (1.25, "link_down", "l1-s1#1")),
    ("l10-s12#16@30", False, (30.0, "link_down", "l10-s12#16")),
])
def test_parse_link_event(text, up, expected):
    fault = parse_link_event(text, up)
    assert (fault.at, fault.kind, fault.target) == expected and fault.params == {}
    assert isinstance(fault.at, float)


def test_link_events_are_one_timeline_in_time_order():
    events = link_events(down=["l1-s1@3", "l2-s1@1"], up=["l1-s1@4"])
    assert [(f.index, f.at, f.kind, f.target) for f in events] == [
        (0, 1.0, "link_down", "l2-s1"), (1, 3.0, "link_down", "l1-s1"), (2, 4.0, "link_up", "l1-s1")]


@pytest.mark.parametrize("text", [
    "l1-s1",            # no time
    "l1s1@2",           # one node
    "l1-s1@",           # empty time
    "@2",
    "l1-@2",
    "l1-s1@-1",         # negative time
    "l1-s1@2s",         # unit
    "l1-s1#@2",         # empty member
    "l1-s1#x@2",
    "l1-s1@2@3",
    " l1-s1@2",
    "l1_s1@2",
    "h1-n0-l1@2",       # interface names are not nodes
    "",
])
def test_bad_link_events_are_one_line_lab_errors(text):
    with pytest.raises(LabError) as info:
        parse_link_event(text, False)
    message = str(info.value)
    assert "\n" not in message
    assert repr(text) in message and "NODE-NODE@SECONDS" in message


def test_parallel_links_are_numbered_from_one():
    with pytest.raises(LabError, match="N >= 1") as info:
        parse_link_event("l1-s1#0@2", False)
    assert "\n" not in str(info.value)


MALFORMED_TIMES = ["l1-s1@1.2.3", "l1-s1@.", "l1-s1@1..", "l1-s1#2@.."]


@pytest.mark.parametrize("text", MALFORMED_TIMES)
def test_malformed_times_are_lab_errors(text):
    with pytest.raises(LabError):
        parse_link_event(text, False)


def test_cli_reports_a_malformed_time_in_one_line(capsys):
    assert cli.main(["run", "tiny", "--link-down", "l1-s1@1.2.3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fabriclab: error:") and err.count("\n") == 1


# -- argument parsing -----------------------------------------------------------------------------

def parse(*argv):
    return cli.build_parser().parse_args(list(argv))


def test_run_with_a_link_down():
    args = parse("run", "tiny", "--link-down", "l1-s1@1")
    assert args.command == "run" and args.spec == "tiny"
    assert args.link_down == ["l1-s1@1"] and args.link_up == []
    assert args.func is commands.cmd_run
    assert (args.routing, args.duration, args.flows_per_pair) == ("ecmp", 5.0, 1)
    assert 0 < args.load <= 1.0            # a load all_pairs_plan accepts
    assert (args.sport_mode, args.format, args.out, args.verbose) == ("qp", "table", None, False)


def test_run_help_states_the_default_load(capsys):
    default = parse("run", "tiny").load
    with pytest.raises(SystemExit) as info:
        cli.main(["run", "--help"])
    assert info.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"(default {default:g})" in help_text


def test_run_link_events_repeat():
    args = parse("run", "tiny", "--link-down", "l1-s1@1", "--link-down", "l2-s2#2@2",
                 "--link-up", "l1-s1@3", "--duration", "4", "--load", "0.5", "--flows-per-pair", "3",
                 "--sport-mode", "shared", "--format", "json")
    assert args.link_down == ["l1-s1@1", "l2-s2#2@2"] and args.link_up == ["l1-s1@3"]
    assert (args.duration, args.load, args.flows_per_pair) == (4.0, 0.5, 3)
    assert (args.sport_mode, args.format) == ("shared", "json")


def test_demo_defaults_to_the_default_spec():
    args = parse("demo")
    assert args.command == "demo" and args.spec == "default"
    assert args.func is commands.cmd_run
    assert args.routing == "ecmp"
    assert args.link_down == [] and args.link_up == []


def test_check_takes_several_specs():
    args = parse("check", "a", "b")
    assert args.specs == ["a", "b"] and args.format == "table"
    assert args.func is commands.cmd_check


def test_up_with_a_script():
    args = parse("up", "x", "--script", "f")
    assert (args.spec, args.script, args.routing) == ("x", "f", "ecmp")
    assert args.func is commands.cmd_up


def test_specs_command():
    assert parse("specs").func is commands.cmd_specs


@pytest.mark.parametrize("argv", [[], ["check"], ["run"], ["up"], ["run", "tiny", "--format", "xml"],
                                  ["run", "tiny", "--sport-mode", "random"], ["no-such-verb"]])
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2
    assert "usage:" in capsys.readouterr().err


# -- check ----------------------------------------------------------------------------------------

def test_check_prints_a_table_and_exits_0(capsys):
    assert cli.main(["check", "default", "tiny"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    lines = out.rstrip("\n").split("\n")
    assert lines[0].split()[:4] == ["spec", "kind", "cabling", "planes"] and lines[0].endswith("time scale")
    assert set(lines[1]) == {"-", " "}
    assert lines[2].split()[0] == "default"
    # tiny: 4 switches, 2 hosts, 2 host ports, 2 host + 4 fabric links, 10/20 oversubscription,
    # one zone (no cross-zone figure)
    assert lines[3].split() == ["tiny", "leafspine", "rack", "1", "4", "2", "2", "6", "0.500", "-", "40000"]
    assert lines[-1] == "ok: default, tiny"


def test_check_reports_a_threetier_specs_cross_zone_oversubscription(capsys):
    assert cli.main(["check", "meta_dc"]) == 0
    lines = capsys.readouterr().out.split("\n")
    assert "cross-zone" in lines[0]
    assert lines[2].split() == ["meta_dc", "threetier", "rack", "1", "10", "8", "8", "20", "1.000", "4.000", "20000"]


def test_check_of_an_unknown_spec_fails_in_one_line(capsys):
    assert cli.main(["check", "no-such"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("fabriclab: error:") and err.count("\n") == 1
    assert "'no-such'" in err


def test_check_stops_at_the_first_bad_spec(capsys):
    assert cli.main(["check", "tiny", "no-such"]) == 2
    assert capsys.readouterr().out == ""


def test_check_reports_a_bad_mtu_in_a_spec_file(tmp_path, capsys):
    path = tmp_path / "small.yaml"
    path.write_text("name: small\nmtu: 1400\n")
    assert cli.main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fabriclab: error:") and err.count("\n") == 1
    assert "mtu must be >= 1500" in err and "small" in err


def test_check_json_for_every_shipped_spec(capsys):
    names = shipped_specs()
    assert len(names) >= 6
    assert cli.main(["check", *names, "--format", "json"]) == 0
    docs = json.loads(capsys.readouterr().out)
    assert [d["name"] for d in docs] == names
    for name, doc in zip(names, docs):
        spec = load_spec(name)
        assert doc["mtu"] == spec.mtu
        assert {"kind", "planes", "switches", "hosts", "host_ports", "links", "host_rate_mbps",
                "fabric_rate_mbps", "oversubscription", "buffers_bytes", "time_scale"} <= set(doc)
        assert doc == json.loads(json.dumps(Fabric(spec).summary()))
        assert doc["host_ports"] == doc["hosts"] * spec.nics_per_host * spec.planes
        assert min(doc["buffers_bytes"].values()) >= 2 * (doc["mtu"] + 14)


def test_check_json_of_a_spec_file_with_an_mtu(tmp_path, capsys):
    path = tmp_path / "std.yaml"
    path.write_text("name: std\nmtu: 1500\nbuffers:\n  host: 4KiB\n")
    assert cli.main(["check", str(path), "--format", "json"]) == 0
    [doc] = json.loads(capsys.readouterr().out)
    assert doc["mtu"] == 1500 and doc["buffers_bytes"]["host"] == 4096


def test_specs_lists_every_shipped_spec(capsys):
    assert cli.main(["specs"]) == 0
    out = capsys.readouterr().out
    listed = [line.split()[0] for line in out.splitlines()[2:]]
    assert listed == shipped_specs()


def test_benchmark_refuses_an_unknown_spec_before_building_anything(capsys):
    assert cli.main(["benchmark", "--sizes", "", "--specs", "meta_dc,no-such"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fabriclab: error: no spec file 'no-such'") and err.count("\n") == 1
