"""Faults on a timeline without a network: parsing a scenario's `faults:` list, resolving it against
a fabric built as plain data (a Lab that is never started), expanding it into timed steps, random
flaps, and the Timeline thread driving a stand-in lab."""

import random
import statistics
import threading
import time
import types

import pytest

from fabriclab.workflows import faults
from fabriclab.errors import LabError
from fabriclab.workflows.faults import MAX_STEPS, Step, Timeline, parse, random_flap_times, resolve, split_link, steps
from fabriclab.lab.lab import Lab
from fabriclab.topologies.spec import load_spec


@pytest.fixture(scope="module")
def lab():
    """The default 4x4 fabric (20 Mbit/s links) as a Lab object; never started."""
    return Lab(load_spec("default"))


@pytest.fixture(scope="module")
def parallel():
    """4 leaves x 2 spines with 2 parallel links per pair; never started."""
    return Lab(load_spec("parallel_links"))


def one(entry):
    return parse([entry])[0]


def error_of(entries):
    with pytest.raises(LabError) as err:
        parse(entries)
    message = str(err.value)
    assert "\n" not in message
    return message


def times_of(out):
    return [s.t for s in out]


# -- parsing --------------------------------------------------------------------------------------
@pytest.mark.parametrize("entry, kind, target, params", [
    ({"at": 1.0, "link_down": "l1-s1", "for": 0.5}, "link_down", "l1-s1", {"for": 0.5}),
    ({"at": 1, "link_up": "l1-s1"}, "link_up", "l1-s1", {}),
    ({"at": 1.0, "flap": "l1-s2", "count": 3, "down": 0.2, "up": 0.3}, "flap", "l1-s2",
     {"count": 3, "down": 0.2, "up": 0.3}),
    ({"at": 0.5, "random_flaps": "fabric", "mtbf": 4, "duration": 0.3, "until": 5, "seed": 7},
     "random_flaps", "fabric", {"mtbf": 4.0, "duration": 0.3, "until": 5.0, "seed": 7}),
    ({"at": 0, "random_flaps": ["l1-s1", "l2-s2"], "mtbf": 1, "duration": 0.1, "until": 2},
     "random_flaps", ["l1-s1", "l2-s2"], {"mtbf": 1.0, "duration": 0.1, "until": 2.0}),
    ({"at": 2.0, "degrade": "l2-s1", "rate_mbps": 2, "for": 1}, "degrade", "l2-s1",
     {"rate_mbps": 2.0, "for": 1.0}),
    ({"at": 2.0, "degrade": "l2-s1", "fraction": 0.25}, "degrade", "l2-s1", {"fraction": 0.25}),
    ({"at": 2.0, "slow_receiver": "h3", "fraction": 0.25, "for": 1}, "slow_receiver", "h3",
     {"fraction": 0.25, "for": 1.0}),
    ({"at": 1.0, "switch_down": "s2", "for": 1}, "switch_down", "s2", {"for": 1.0}),
    ({"at": 3.0, "controller_restart": True}, "controller_restart", True, {}),
    ({"at": 1.0, "loss": "fabric", "fraction": 0.001, "for": 2}, "loss", "fabric", {"fraction": 0.001, "for": 2.0}),
    ({"at": 1.0, "loss": "l1-s1", "fraction": 0.5}, "loss", "l1-s1", {"fraction": 0.5}),
])
def test_every_fault_kind_parses(entry, kind, target, params):
    """Each kind keeps its target, its `at` as a float and its parameters with the declared types."""
    fault = one(entry)
    assert (fault.index, fault.kind, fault.target, fault.params) == (0, kind, target, params)
    assert fault.at == float(entry["at"]) and isinstance(fault.at, float)
    for name, value in fault.params.items():
        assert type(value) is faults.KINDS[kind][1][name][0]


def test_faults_keep_their_index_and_labels():
    """Index is the entry's position; the label reads as words (used in reports)."""
    out = parse([{"at": 0, "link_down": "l1-s1"}, {"at": 1, "controller_restart": True},
                 {"at": 2, "random_flaps": ["l1-s1", "l2-s2"], "mtbf": 1, "duration": 0.1, "until": 3}])
    assert [f.index for f in out] == [0, 1, 2]
    assert [f.label for f in out] == ["link down l1-s1", "controller restart", "random flaps l1-s1, l2-s2"]


def test_no_faults_is_an_empty_list():
    """A scenario without `faults:` (None) has none; a non-list is an error."""
    assert parse(None) == []
    assert parse([]) == []
    assert "faults must be a list" in error_of({"at": 1, "link_down": "l1-s1"})


@pytest.mark.parametrize("entry, words", [
    ("l1-s1", "faults[0] must be a mapping"),
    ({"at": 1, "link_flap": "l1-s1"}, "faults[0] needs exactly one of link_down"),
    ({"at": 1, "link_down": "l1-s1", "link_up": "l1-s2"}, "faults[0] needs exactly one of"),
    ({"at": 1, "link_down": "l1-s1", "count": 2}, "faults[0] (link_down): unknown field 'count'"),
    ({"at": 1, "link_up": "l1-s1", "for": 1}, "faults[0] (link_up): unknown field 'for'"),
    ({"link_down": "l1-s1"}, "faults[0].at must be a number, got None"),
    ({"at": "soon", "link_down": "l1-s1"}, "faults[0].at must be a number, got 'soon'"),
    ({"at": True, "link_down": "l1-s1"}, "faults[0].at must be a number, got True"),
    ({"at": -0.5, "link_down": "l1-s1"}, "faults[0].at must be in [0, 86400], got -0.5"),
    ({"at": 1, "link_down": "l1-s1", "for": 0}, "faults[0].for must be in (0, 86400], got 0"),
    ({"at": 1, "flap": "l1-s1", "count": 0}, "faults[0].count must be in [1, 5000], got 0"),
    ({"at": 1, "flap": "l1-s1", "count": 2.5}, "faults[0].count must be a whole number, got 2.5"),
    ({"at": 1, "degrade": "l1-s1", "rate_mbps": 2, "fraction": 0.5},
     "degrade takes one of rate_mbps or fraction"),
    ({"at": 1, "degrade": "l1-s1"}, "degrade takes one of rate_mbps or fraction"),
    ({"at": 1, "degrade": "l1-s1", "fraction": 1.5}, "faults[0].fraction must be in (0, 1], got 1.5"),
    ({"at": 1, "slow_receiver": "h1", "fraction": 2}, "faults[0].fraction must be in (0, 1], got 2"),
    ({"at": 1, "slow_receiver": "h1"}, "faults[0] (slow_receiver): missing fraction"),
    ({"at": 1, "loss": "l1-s1"}, "faults[0] (loss): missing fraction"),
    ({"at": 1, "loss": "l1-s1", "fraction": 1}, "faults[0].fraction is the share of packets lost, in (0, 1); got 1"),
    ({"at": 1, "loss": "l1-s1", "fraction": 0}, "faults[0].fraction must be in (0, 1]"),
    ({"at": 1, "random_flaps": "fabric", "duration": 0.1, "until": 2}, "(random_flaps): missing mtbf"),
    ({"at": 2, "random_flaps": "fabric", "mtbf": 1, "duration": 0.1, "until": 2},
     "until (2 s) must come after at (2 s)"),
    ({"at": 3, "random_flaps": "fabric", "mtbf": 1, "duration": 0.1, "until": 2}, "must come after at (3 s)"),
    ({"at": 0, "random_flaps": "spines", "mtbf": 1, "duration": 0.1, "until": 2},
     "random_flaps takes `fabric` or a list of links"),
    ({"at": 0, "random_flaps": [], "mtbf": 1, "duration": 0.1, "until": 2}, "random_flaps takes `fabric`"),
    ({"at": 1, "controller_restart": "yes"}, "controller_restart takes `true`"),
    ({"at": 1, "controller_restart": 1}, "controller_restart takes `true`"),
    ({"at": 1, "switch_down": 2}, "switch_down takes a switch, got 2"),
    ({"at": 1, "link_down": ""}, "link_down takes a link A-B, got ''"),
])
def test_bad_fault_entries_are_one_line_errors_naming_the_entry(entry, words):
    """Every malformed entry is a LabError naming faults[i] and the offending field."""
    message = error_of([entry])
    assert message.startswith("scenario: faults[0]") or message.startswith("scenario: faults must")
    assert words in message


def test_the_error_names_the_index_of_the_bad_entry():
    """The second bad entry is faults[1], not faults[0]."""
    assert "faults[1].at must be in [0, 86400]" in error_of([{"at": 0, "link_down": "l1-s1"},
                                                    {"at": -1, "link_down": "l1-s1"}])


# -- link text ------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("l1-s1", ("l1", "s1", None)),
    ("s1-l1", ("s1", "l1", None)),
    ("l1-s1#1", ("l1", "s1", 0)),
    ("l1-s1#2", ("l1", "s1", 1)),
])
def test_split_link(text, expected):
    """A-B gives both nodes and no member; #N is the 1-based parallel member, returned 0-based."""
    assert split_link(text) == expected


@pytest.mark.parametrize("text, words", [
    ("l1", "bad link 'l1'"),
    ("a-b-c", "bad link 'a-b-c'"),
    ("-s1", "bad link '-s1'"),
    ("l1-", "bad link 'l1-'"),
    ("l1-s1#0", "bad link member"),
    ("l1-s1#x", "bad link member"),
    ("l1-s1#", "bad link member"),
])
def test_bad_link_text(text, words):
    with pytest.raises(LabError) as err:
        split_link(text)
    assert words in str(err.value)


# -- resolving against the fabric ------------------------------------------------------------------
def test_resolve_returns_the_named_links(lab, parallel):
    """A link fault names its cable(s): both parallel members unless #N picks one."""
    (link,) = resolve(one({"at": 0, "link_down": "s1-l1"}), lab)
    assert (link.a, link.b, link.kind) == ("l1", "s1", "fabric")
    both = resolve(one({"at": 0, "flap": "l1-s1"}), parallel)
    assert sorted(link.member for link in both) == [0, 1]
    (second,) = resolve(one({"at": 0, "degrade": "l1-s1#2", "fraction": 0.5}), parallel)
    assert second.member == 1 and second.label == "l1-s1#2"


def test_resolve_random_flaps(lab):
    """`fabric` means every fabric link; a list means exactly those links."""
    every = resolve(one({"at": 0, "random_flaps": "fabric", "mtbf": 1, "duration": 0.1, "until": 2}), lab)
    assert every == lab.fabric.fabric_links and len(every) == 16
    some = resolve(one({"at": 0, "random_flaps": ["l1-s1", "s2-l3"], "mtbf": 1, "duration": 0.1, "until": 2}),
                   lab)
    assert [link.label for link in some] == ["l1-s1", "l3-s2"]


def test_resolve_of_non_link_faults_checks_and_returns_nothing(lab):
    for entry in ({"at": 0, "slow_receiver": "h3", "fraction": 0.5}, {"at": 0, "switch_down": "s4"},
                  {"at": 0, "controller_restart": True}):
        assert resolve(one(entry), lab) == []


@pytest.mark.parametrize("entry, words", [
    ({"link_down": "l1-s9"}, "(link_down): no node 's9'"),
    ({"link_down": "l1-l2"}, "(link_down): no link between l1 and l2"),
    ({"flap": "l1-s1#2"}, "(flap): no link between l1 and s1 with member 2"),
    ({"degrade": "l1", "fraction": 0.5}, "(degrade): bad link 'l1'"),
    ({"link_up": "a-b-c"}, "(link_up): bad link 'a-b-c'"),
    ({"random_flaps": ["l1-s1", "l9-s1"], "mtbf": 1, "duration": 0.1, "until": 9}, "no node 'l9'"),
    ({"slow_receiver": "h99", "fraction": 0.5}, "(slow_receiver): no host 'h99'"),
    ({"switch_down": "s9"}, "(switch_down): no switch 's9'"),
    ({"switch_down": "h1"}, "(switch_down): no switch 'h1'"),
])
def test_resolve_errors_name_the_fault_index(lab, entry, words):
    """A fault naming something the fabric lacks fails with faults[i] of that fault."""
    out = parse([{"at": 0, "controller_restart": True}, {"at": 1, **entry}])
    assert resolve(out[0], lab) == []
    with pytest.raises(LabError) as err:
        resolve(out[1], lab)
    assert str(err.value).startswith("scenario: faults[1] (")
    assert words in str(err.value)
    with pytest.raises(LabError, match=r"faults\[1\]"):
        steps(out, lab)


# -- steps ----------------------------------------------------------------------------------------
def test_link_down_for_a_while_goes_down_then_up(lab):
    """`for` adds the repair: down at `at`, up at at + for, marked undo."""
    out = steps(parse([{"at": 1.0, "link_down": "l1-s1", "for": 0.5}]), lab)
    assert [(s.t, s.fault, s.action, s.args[1], s.undo) for s in out] == [
        (1.0, 0, "link", False, False), (1.5, 0, "link", True, True)]
    assert [link.label for link in out[0].args[0]] == ["l1-s1"]


def test_link_down_without_for_stays_down_and_link_up_brings_up(lab):
    out = steps(parse([{"at": 1.0, "link_down": "l1-s1"}, {"at": 2.0, "link_up": "l1-s1"}]), lab)
    assert [(s.t, s.args[1], s.undo) for s in out] == [(1.0, False, False), (2.0, True, False)]


def test_flap_alternates_down_and_up_at_the_right_times(lab):
    """count=3, down=0.2, up=0.3 from 1.0: down 1.0, up 1.2, down 1.5, up 1.7, down 2.0, up 2.2."""
    out = steps(parse([{"at": 1.0, "flap": "l1-s2", "count": 3, "down": 0.2, "up": 0.3}]), lab)
    assert len(out) == 6
    assert times_of(out) == pytest.approx([1.0, 1.2, 1.5, 1.7, 2.0, 2.2])
    assert [s.args[1] for s in out] == [False, True] * 3
    assert [s.undo for s in out] == [False, True] * 3
    assert {link.label for s in out for link in s.args[0]} == {"l1-s2"}


def test_flap_defaults_to_one_second_down_once(lab):
    out = steps(parse([{"at": 0.5, "flap": "l1-s1"}]), lab)
    assert [(s.t, s.args[1]) for s in out] == [(0.5, False), (1.5, True)]


def test_degrade_by_fraction_is_a_share_of_the_link_rate(lab):
    """default's fabric links run at 20 Mbit/s: fraction 0.25 shapes to 5 Mbit/s; the repair restores."""
    out = steps(parse([{"at": 2.0, "degrade": "l2-s1", "fraction": 0.25, "for": 1}]), lab)
    assert [(s.t, s.action, s.args[1], s.undo) for s in out] == [(2.0, "rate", 5.0, False),
                                                                  (3.0, "rate", None, True)]
    fixed = steps(parse([{"at": 2.0, "degrade": "l2-s1", "rate_mbps": 3}]), lab)
    assert [(s.t, s.args[1]) for s in fixed] == [(2.0, 3.0)]


def test_loss_on_a_link_or_every_link_and_its_repair(lab):
    """`fabric` is every cable, host links included (seed 003: loss "applied on every link")."""
    out = steps(parse([{"at": 1, "loss": "fabric", "fraction": 0.01, "for": 2},
                       {"at": 1.5, "loss": "l1-s1", "fraction": 0.2}]), lab)
    assert [(s.t, s.action, s.args[1], s.undo) for s in out] == [
        (1.0, "loss", 0.01, False), (1.5, "loss", 0.2, False), (3.0, "loss", 0.0, True)]
    assert out[0].args[0] == list(lab.fabric.links) and len(out[0].args[0]) == 24
    assert [link.label for link in out[1].args[0]] == ["l1-s1"]
    with pytest.raises(LabError, match=r"faults\[0\] \(loss\): no node 'l9'"):
        steps(parse([{"at": 1, "loss": "l9-s1", "fraction": 0.2}]), lab)


def test_receiver_switch_and_controller_steps(lab):
    out = steps(parse([{"at": 1, "slow_receiver": "h3", "fraction": 0.5, "for": 1},
                       {"at": 1.5, "switch_down": "s4", "for": 1},
                       {"at": 2.2, "controller_restart": True}]), lab)
    assert [(s.t, s.fault, s.action, s.args, s.undo) for s in out] == [
        (1.0, 0, "receiver", ("h3", 0.5), False),
        (1.5, 1, "switch", ("s4", False), False),
        (2.0, 0, "receiver", ("h3", None), True),
        (2.2, 2, "controller", (), False),
        (2.5, 1, "switch", ("s4", True), True)]


def test_steps_are_sorted_by_time_across_faults(lab):
    """Faults listed out of order interleave into one timeline; equal times keep their list order."""
    out = steps(parse([{"at": 3.0, "switch_down": "s1", "for": 1},
                       {"at": 0.5, "flap": "l1-s1", "count": 2, "down": 1, "up": 1},
                       {"at": 2.0, "link_down": "l2-s2", "for": 0.2}]), lab)
    assert times_of(out) == sorted(times_of(out))
    assert [(s.t, s.fault) for s in out] == [(0.5, 1), (1.5, 1), (2.0, 2), (2.2, 2), (2.5, 1),
                                             (3.0, 0), (3.5, 1), (4.0, 0)]


def test_random_flaps_become_down_up_pairs_of_one_link(lab):
    """Each random flap takes one link down and brings the same link up `duration` later."""
    entry = {"at": 0.5, "random_flaps": ["l1-s1", "l2-s2"], "mtbf": 1, "duration": 0.3, "until": 5, "seed": 7}
    out = steps(parse([entry]), lab)
    downs = [s for s in out if not s.undo]
    ups = [s for s in out if s.undo]
    assert len(downs) == len(ups) > 0
    assert all(s.args[1] is False and len(s.args[0]) == 1 for s in downs)
    assert all(0.5 <= s.t < 5 for s in downs)
    links = lab.resolve_link("l1", "s1") + lab.resolve_link("l2", "s2")
    expected = random_flap_times(links, 1.0, 0.3, 0.5, 5.0, random.Random(7))
    assert [(s.t, s.args[0][0]) for s in downs] == expected
    pending = {}
    for s in out:                        # every up matches the previous down of its link
        link = s.args[0][0].key
        if s.undo:
            assert s.t == pytest.approx(pending.pop(link) + 0.3)
        else:
            pending[link] = s.t
    assert not pending
    assert steps(parse([entry]), lab) == out                  # the seed makes it repeatable


def test_an_absurd_mtbf_hits_the_step_guard(lab):
    """A flap every millisecond on 16 links for 10 s is far beyond MAX_STEPS: a LabError."""
    entry = {"at": 0, "random_flaps": "fabric", "mtbf": 0.001, "duration": 0.001, "until": 10}
    with pytest.raises(LabError) as err:
        steps(parse([{"at": 0, "controller_restart": True}, entry]), lab)
    assert f"faults[1] expands to more than {MAX_STEPS} link changes" in str(err.value)


def test_the_step_guard_stops_random_flaps_before_unbounded_work(lab, monkeypatch):
    """With mtbf = duration = 1 ns the guard should fire after a bounded number of draws."""
    limit = 20 * MAX_STEPS

    class Bounded(random.Random):
        draws = 0

        def expovariate(self, lambd):
            Bounded.draws += 1
            if Bounded.draws > limit:
                raise RuntimeError(f"more than {limit} flap draws before the MAX_STEPS guard")
            return super().expovariate(lambd)

    from fabriclab.workflows.faultkinds import random_flaps

    monkeypatch.setattr(random_flaps, "random", types.SimpleNamespace(Random=Bounded))
    entry = {"at": 0, "random_flaps": "fabric", "mtbf": 1e-9, "duration": 1e-9, "until": 10}
    with pytest.raises(LabError, match="more than"):
        steps(parse([entry]), lab)


# -- random_flap_times ----------------------------------------------------------------------------
LINKS = ["a", "b", "c", "d"]


def test_random_flap_times_are_deterministic_for_a_seed():
    first = random_flap_times(LINKS, 2.0, 0.1, 1.0, 30.0, random.Random(5))
    assert first == random_flap_times(LINKS, 2.0, 0.1, 1.0, 30.0, random.Random(5))
    assert first != random_flap_times(LINKS, 2.0, 0.1, 1.0, 30.0, random.Random(6))
    assert len(first) > 0


def test_random_flap_times_stay_in_the_window_sorted_and_never_overlap():
    """Every flap starts in [start, until); per link each next flap starts after the last ended."""
    for seed in range(20):
        out = random_flap_times(LINKS, 0.5, 0.2, 2.0, 12.0, random.Random(seed))
        assert [t for t, _ in out] == sorted(t for t, _ in out)
        assert all(2.0 <= t < 12.0 for t, _ in out)
        assert {link for _, link in out} <= set(LINKS)
        for link in LINKS:
            mine = [t for t, name in out if name == link]
            assert all(b >= a + 0.2 for a, b in zip(mine, mine[1:]))


def test_random_flap_counts_follow_the_mtbf():
    """Mean flaps per link over many seeds is near window / mtbf (short flaps: duration << mtbf)."""
    window, mtbf = 20.0, 1.0
    counts = []
    for seed in range(200):
        out = random_flap_times(LINKS, mtbf, 0.01, 5.0, 5.0 + window, random.Random(seed))
        counts.extend(sum(1 for _, link in out if link == name) for name in LINKS)
    assert statistics.fmean(counts) == pytest.approx(window / mtbf, rel=0.1)
    assert statistics.pvariance(counts) == pytest.approx(window / mtbf, rel=0.3)    # Poisson: var ~ mean


def test_random_flap_gaps_count_from_the_end_of_the_previous_flap():
    """As documented, the exponential gap starts when a flap ends: long flaps mean fewer of them
    (mean count ~ window / (mtbf + duration))."""
    counts = [len(random_flap_times(["a"], 1.0, 1.0, 0.0, 40.0, random.Random(seed))) for seed in range(300)]
    assert statistics.fmean(counts) == pytest.approx(40.0 / 2.0, rel=0.1)


def test_no_links_or_an_empty_window_gives_no_flaps():
    assert random_flap_times([], 1.0, 0.1, 0.0, 10.0, random.Random(1)) == []
    assert random_flap_times(LINKS, 1.0, 0.1, 5.0, 5.0, random.Random(1)) == []


# -- apply and the Timeline thread ----------------------------------------------------------------
class StubLab:
    """Records the Lab operations `faults.apply` calls."""

    def __init__(self):
        self.calls = []

    def set_links(self, links, up, wait=True, timeout=10.0, what="", event=None):
        self.calls.append(("link", tuple(links), up, wait))

    def reshape_links(self, links, rate):
        for link in links:
            self.calls.append(("reshape", link.label, rate))
        self.calls.append(("log", "degrade" if rate else "restore_rate",
                           ", ".join(link.label for link in links), {"rate_mbps": rate}))

    def slow_receiver(self, host, fraction):
        self.calls.append(("receiver", host, fraction))

    def set_switch(self, name, up, wait=True):
        self.calls.append(("switch", name, up, wait))

    def restart_controller(self):
        raise RuntimeError("controller would not come back")


def test_apply_maps_steps_to_lab_operations_without_waiting(lab):
    stub = StubLab()
    link = lab.resolve_link("l1", "s1")[0]
    for step in (Step(0, 0, "link", ([link], False)), Step(0, 1, "rate", ([link], 5.0)),
                 Step(0, 1, "rate", ([link], None), undo=True), Step(0, 2, "receiver", ("h3", 0.5)),
                 Step(0, 3, "switch", ("s2", False))):
        faults.apply(stub, step)
    assert stub.calls == [
        ("link", (link,), False, False),
        ("reshape", "l1-s1", 5.0), ("log", "degrade", "l1-s1", {"rate_mbps": 5.0}),
        ("reshape", "l1-s1", None), ("log", "restore_rate", "l1-s1", {"rate_mbps": None}),
        ("receiver", "h3", 0.5),
        ("switch", "s2", False, False)]


def test_timeline_applies_steps_at_origin_plus_t():
    stub = StubLab()
    timeline = Timeline(stub, [Step(0.0, 0, "link", (["x"], False)),
                               Step(0.05, 0, "link", (["x"], True), undo=True)])
    timeline.start()
    time.sleep(0.02)
    assert timeline.applied == []                   # nothing before the origin is set
    origin = time.time()
    timeline.start_at(origin)
    timeline.join(5)
    assert not timeline.is_alive()
    timeline.join_checked()
    assert [c[2] for c in stub.calls] == [False, True]
    assert [step.t for step, _ in timeline.applied] == [0.0, 0.05]
    assert timeline.applied[1][1] >= origin + 0.05 - 0.005          # not (much) before its time


def test_timeline_stopped_early_applies_nothing_more():
    stub = StubLab()
    timeline = Timeline(stub, [Step(0.0, 0, "link", (["x"], False)), Step(30.0, 0, "link", (["x"], True))])
    timeline.start()
    timeline.start_at(time.time())
    deadline = time.time() + 5
    while not timeline.applied and time.time() < deadline:
        time.sleep(0.005)
    t0 = time.monotonic()
    timeline.join_checked()
    assert time.monotonic() - t0 < 5 and not timeline.is_alive()
    assert [c[2] for c in stub.calls] == [False]


def test_timeline_errors_come_back_from_join_checked():
    timeline = Timeline(StubLab(), [Step(0.0, 0, "controller", ())])
    timeline.start()
    timeline.start_at(time.time())
    timeline.join(5)
    with pytest.raises(LabError, match="fault timeline failed: controller would not come back"):
        timeline.join_checked()


def test_changes_from_several_threads_reach_the_fabric_one_at_a_time(monkeypatch):
    """The prompt, the web view and a timeline change the fabric from their own threads: the lab
    lets one change through at a time, while what it has injected stays readable meanwhile."""
    from fabriclab.lab import network

    lab = Lab(load_spec("default"))
    inside, most, reads = [0], [0], []

    def slow_set_rate(net, link, rate, mtu, nodes=None):
        inside[0] += 1
        most[0] = max(most[0], inside[0])
        reads.append(lab.injected())            # not blocked by the change in progress
        time.sleep(0.02)
        inside[0] -= 1

    monkeypatch.setattr(network, "set_rate", slow_set_rate)
    links = lab.fabric.fabric_links[:4]
    threads = [threading.Thread(target=lab.reshape_links, args=([link], 5.0)) for link in links] + \
              [threading.Thread(target=lab.restore) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert most[0] == 1 and len(reads) >= 4
    assert all(not t.is_alive() for t in threads)


def test_check_refuses_exactly_what_steps_refuses_without_making_steps(lab):
    """A plan is checked with faults.check (no Step objects: a sweep checks its timeline once a
    case); it must agree with steps, which runs make, on every mix of kinds around MAX_STEPS."""
    rng = random.Random(35)
    kinds = [lambda: {"link_down": "l1-s1", "for": 0.5}, lambda: {"link_up": "l2-s2"},
             lambda: {"flap": "l1-s2", "count": rng.choice([1, 7, MAX_STEPS // 4, MAX_STEPS // 2])},
             lambda: {"random_flaps": "fabric", "mtbf": rng.choice([0.01, 1.0]), "duration": 0.01,
                      "until": rng.choice([2.0, 30.0])},
             lambda: {"degrade": "l3-s1", "fraction": 0.5, **({"for": 1.0} if rng.random() < 0.5 else {})},
             lambda: {"slow_receiver": "h2", "fraction": 0.5}, lambda: {"switch_down": "s2", "for": 1.0},
             lambda: {"loss": "fabric", "fraction": 0.01}, lambda: {"controller_restart": True}]
    for _ in range(60):
        entries = [{"at": 1.0, **rng.choice(kinds)()} for _ in range(rng.randint(1, 4))]
        try:
            made = len(steps(parse(entries), lab))
        except LabError as exc:
            with pytest.raises(LabError, match="more than"):
                faults.check(parse(entries), lab)
            assert "more than" in str(exc)
        else:
            assert made <= MAX_STEPS
            faults.check(parse(entries), lab)


def test_every_fault_kind_is_one_module_implementing_the_protocol():
    import inspect

    from fabriclab.workflows import faultkinds

    assert list(faults.KINDS) == list(faultkinds.MODULES)
    for name, mod in faultkinds.kinds().items():
        assert isinstance(mod.TARGET, str) and isinstance(mod.PARAMS, dict), name
        for method in ("check_entry", "resolve", "steps", "count"):
            want = len(inspect.signature(getattr(faultkinds.FaultKind, method)).parameters) - 1
            assert len(inspect.signature(getattr(mod, method)).parameters) == want, (name, method)


@pytest.mark.parametrize("entry", [
    {"at": 1, "link_down": "l1-s1", "for": 0.5}, {"at": 1, "link_up": "l1-s1"},
    {"at": 1, "flap": "l1-s2", "count": 3, "down": 0.2, "up": 0.3},
    {"at": 0.5, "random_flaps": "fabric", "mtbf": 4, "duration": 0.3, "until": 9, "seed": 7},
    {"at": 2, "degrade": "l2-s1", "fraction": 0.5, "for": 1}, {"at": 2, "slow_receiver": "h3", "fraction": 0.25},
    {"at": 1, "loss": "fabric", "fraction": 0.01, "for": 1}, {"at": 1, "switch_down": "s2", "for": 1},
    {"at": 3, "controller_restart": True}])
def test_a_kind_counts_exactly_the_steps_it_makes(lab, entry):
    (fault,) = parse([entry])
    links = resolve(fault, lab)
    from fabriclab.workflows import faultkinds

    kind = faultkinds.kind(fault.kind)
    assert kind.count(fault, links, MAX_STEPS) == len(kind.steps(fault, links, MAX_STEPS)) >= 1
