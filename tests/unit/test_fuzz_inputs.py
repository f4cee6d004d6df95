"""Hostile input to every loader the lab has: specs, scenarios (through `scenario check`'s whole
path), hardware profiles, results documents and command lines.

Each case starts from a file the project ships (or a document it writes) and breaks it one way:
a value swapped for a hostile one (NaN, infinity, 1e30, a 5000-character string, a boolean, a
list nested 40 deep, 'no', 'maybe'), an unknown key, a key deleted, a key written twice, bytes
that are not UTF-8, a truncated file, a YAML alias bomb. The cases are drawn from a seeded
generator, so a failure names a case that reruns the same way.

Every case must end, within its time bound, in either a load or a one-line LabError; a traceback,
a hang or a message longer than a few lines' worth fails. Where a change can never be right (an
unknown key, a duplicate key, NaN, a non-boolean where a boolean goes, 1e30 where a count or a
duration goes) it must be refused, not taken.
"""

from __future__ import annotations

import copy
import json
import os
import pathlib
import random
import signal
import zlib
from contextlib import contextmanager

import pytest
import yaml

from fabriclab.errors import LabError
from fabriclab.model.hardware import PROFILE_DIR, load_profile
from fabriclab.results import compare, document
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import SPEC_DIR, load_spec
from fabriclab.workflows import scenario

from tests.unit import resultdocs as rd

REPO = pathlib.Path(__file__).resolve().parents[2]
CASES = 60                       # per base file: a few seconds per loader in all
TIME_BOUND_S = 5.0
LONGEST_MESSAGE = 600

NESTED = [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["deep"]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]
# Values that no field takes as given: must be refused wherever they land.
NEVER = [float("nan"), float("inf"), -float("inf"), 10 ** 30, "maybe", NESTED, "x" * 5000]
# Values some field might take: must not crash, may load.
ODD = [0, -1, 1e-300, 0.5, "", "no", True, False, None, [], {}, "\x00", "é" * 3, 4294967296, "1e400", "-1"]


class TooSlow(Exception):
    pass


@contextmanager
def bounded(seconds=TIME_BOUND_S):
    def expire(_signum, _frame):
        raise TooSlow(f"no answer in {seconds} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def outcome(load, path):
    """'loaded' or 'refused' (a one-line LabError); anything else fails the test."""
    try:
        with bounded():
            load(path)
    except LabError as exc:
        message = str(exc)
        assert "\n" not in message and len(message) <= LONGEST_MESSAGE, message[:300]
        return "refused"
    return "loaded"


# -- the mutations ---------------------------------------------------------------------------------
def places(doc, trail=()):
    """Every (container, key, trail) in a nested document, leaves and branches."""
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        yield doc, key, trail + (key,)
        yield from places(value, trail + (key,))


def mappings(doc):
    found = [doc] if isinstance(doc, dict) else []
    return found + [c[k] for c, k, _t in places(doc) if isinstance(c[k], dict)]


def mutate(base, rng, fmt="yaml", huge_is_wrong=True):
    """(text, must_refuse, what) for one broken copy of `base` (a parsed document), written as
    YAML or JSON. `huge_is_wrong`: 1e30 fits no field (inputs), or may be recorded (results)."""
    dump = dump_yaml if fmt == "yaml" else dump_json
    doc = copy.deepcopy(base)
    spots = list(places(doc))
    kind = rng.choice(["never", "odd", "odd", "unknown", "delete", "duplicate", "bool", "text"])
    if kind == "unknown":
        target = rng.choice(mappings(doc))
        target["efficency"] = 1
        return dump(doc), True, "an unknown key 'efficency'"
    if kind == "duplicate":
        key = rng.choice(list(doc))
        if fmt == "json":
            return "{" + json.dumps(key) + ": 1, " + dump(doc)[1:], True, f"key {key!r} twice"
        return dump(doc) + yaml.safe_dump({key: doc[key]}), True, f"key {key!r} twice"
    if kind == "text":
        text = dump(doc)
        how = rng.choice(["truncate", "bytes", "bomb", "deep"])
        if how == "truncate":
            return text[:rng.randrange(len(text))], False, "truncated"
        if how == "bytes":
            at = rng.randrange(len(text))
            return text[:at].encode() + b"\xff\xfe" + text[at:].encode(), True, "non-UTF-8 bytes"
        if how == "bomb" and fmt == "yaml":
            bomb = "".join(f"b{i}: &b{i} [" + ", ".join([f"*b{i - 1}" if i else "lol"] * 9) + "]\n"
                           for i in range(9))
            return bomb + text, True, "an alias bomb"
        deep = "[" * 200 + "]" * 200
        if fmt == "json":
            return '{"x": ' + deep + ", " + text[1:], True, "nesting 200 deep"
        return "x: " + deep + "\n" + text, True, "nesting 200 deep"
    if not spots:
        return dump(doc), False, "unchanged"
    container, key, trail = rng.choice(spots)
    where = "/".join(map(str, trail))
    if kind == "delete" and isinstance(container, dict):
        del container[key]
        return dump(doc), False, f"{where} deleted"
    if kind == "bool":
        old = container[key]
        if isinstance(old, bool):
            container[key] = rng.choice(["no", "maybe", 0, 1, "yes"])
            return dump(doc), True, f"{where}: a boolean as {container[key]!r}"
    if kind == "never" and isinstance(container[key], (int, float)) and not isinstance(container[key], bool):
        container[key] = rng.choice([float("nan"), float("inf")] + [10 ** 30] * huge_is_wrong)
        return dump(doc), True, f"{where}: a number as {str(container[key])[:20]}"
    value = rng.choice(NEVER + ODD)
    container[key] = value
    return dump(doc), False, f"{where} = {repr(value)[:30]}"


def dump_yaml(doc):
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)


def dump_json(doc):
    return json.dumps(doc)


def write(path, text):
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return path


def fuzz(base, load, tmp_path, seed, name="case.yaml"):
    rng = random.Random(seed)
    seen = {"loaded": 0, "refused": 0}
    for i in range(CASES):
        text, must_refuse, what = mutate(base, rng)
        path = write(tmp_path / name, text)
        try:
            result = outcome(load, path)
        except Exception as exc:                     # noqa: BLE001 - the point is to report it
            pytest.fail(f"seed {seed} case {i} ({what}): {type(exc).__name__}: {str(exc)[:200]}")
        if must_refuse:
            assert result == "refused", f"seed {seed} case {i}: {what} was taken"
        seen[result] += 1
    assert seen["refused"] > 0                     # the mutations did reach the checks
    return seen


# -- the loaders -----------------------------------------------------------------------------------
SPECS = sorted(SPEC_DIR.glob("*.yaml"))
SCENARIOS = sorted((REPO / "examples" / "scenarios").glob("*.yaml"))
PROFILES = sorted(PROFILE_DIR.glob("*.yaml"))


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_specs(path, tmp_path):
    fuzz(yaml.safe_load(path.read_text()), lambda p: Fabric(load_spec(p)), tmp_path, seed=zlib.crc32(path.stem.encode()))


def _check_scenario(path):
    return scenario.prepare(scenario.load(path))     # what `scenario check` (and `run`) does first


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_scenarios_through_scenario_check(path, tmp_path):
    base = yaml.safe_load(path.read_text())
    fuzz(base, _check_scenario, tmp_path, seed=len(path.stem))


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.stem)
def test_profiles(path, tmp_path):
    fuzz(yaml.safe_load(path.read_text()), load_profile, tmp_path, seed=7 + len(path.stem))


def test_results_documents_through_load_and_compare(tmp_path):
    base = rd.scenario_doc()

    def load(path):
        doc = document.load(path.parent)
        compare.rows(doc, "x")                       # what `compare` reads from every document

    rng = random.Random(3)
    for i in range(CASES):
        text, must_refuse, what = mutate(base, rng, fmt="json", huge_is_wrong=False)
        path = write(tmp_path / "results.json", text)
        try:
            result = outcome(load, path)
        except Exception as exc:                     # noqa: BLE001
            pytest.fail(f"case {i} ({what}): {type(exc).__name__}: {str(exc)[:200]}")
        if must_refuse and "unknown key" not in what:    # the schema allows extra keys in places
            assert result == "refused", f"case {i}: {what} was taken"


@pytest.mark.parametrize("text", [
    "[]", "{}", "null", '"x"', "[" * 100000, '{"schema_version": 1, "runs": 5}',
    '{"a": 1, "a": 2}', '{"schema_version": NaN}', "\ufeff{}"])
def test_results_documents_that_are_not_documents(tmp_path, text):
    write(tmp_path / "results.json", text)
    assert outcome(lambda p: document.load(p.parent), tmp_path / "results.json") == "refused"


def test_a_file_that_never_ends_is_not_read(tmp_path):
    for loader in (load_spec, load_profile, scenario.load):
        assert outcome(loader, pathlib.Path("/dev/zero")) == "refused"
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    assert outcome(load_spec, fifo) == "refused"


def test_a_huge_file_is_refused_unread(tmp_path):
    big = tmp_path / "big.yaml"
    with open(big, "wb") as f:
        f.write(b"name: big\n")
        f.truncate(2 << 30)                           # 2 GiB, sparse
    assert outcome(load_spec, big) == "refused"


# -- command lines -----------------------------------------------------------------------------
class WouldBuild(Exception):
    pass


@pytest.fixture
def no_lab(monkeypatch):
    """A command line that gets past its checks would start a lab: that is caught here."""
    from fabriclab.lab import lab as lab_mod

    def refuse(*_a, **_k):
        raise WouldBuild()

    monkeypatch.setattr(lab_mod.Lab, "start", refuse)


BAD_NUMBERS = ["nan", "inf", "-1", "0", "1e300", "1e-300", "100000", "x", ""]
# option -> a value it takes (the control: that reaches the lab) and the bad values it also takes
NUMERIC_OPTIONS = {
    ("run default", "--duration"): ("1", ()), ("run default", "--load"): ("0.3", ()),
    ("run default", "--flows-per-pair"): ("2", ()), ("run default", "--sample-ms"): ("10", ()),
    ("collective default", "--qps"): ("2", ()), ("collective default", "--channels"): ("2", ()),
    ("collective default", "--iterations"): ("2", ("100000",)), ("collective default", "--spray"): ("4", ()),
    ("collective default", "--imbalance"): ("2", ()), ("collective default", "--ack-timeout"): ("0.5", ()),
    ("collective default", "--probe-interval"): ("0.05", ()),
    ("collective default", "--cc-idle"): ("0.1", ("0", "1e-300")),
    ("collective default", "--reorder-timeout"): ("0.2", ()), ("collective default", "--sw-timeout"): ("1", ()),
    ("collective default", "--cts-buffers"): ("2", ()), ("collective default", "--probe-timeouts"): ("3", ()),
    ("collective default", "--sample-ms"): ("10", ()),
}


def _exit_code(argv):
    from fabriclab.cli.main import main

    try:
        with bounded():
            return main(argv)
    except SystemExit as exc:                          # argparse: usage and one error line
        return exc.code


@pytest.mark.parametrize("verb, option", list(NUMERIC_OPTIONS), ids=lambda v: str(v).replace(" ", "_"))
def test_command_line_numbers_out_of_range_are_refused_before_a_lab(verb, option, no_lab, capsys):
    good, also_taken = NUMERIC_OPTIONS[verb, option]
    with pytest.raises(WouldBuild):                     # the control: a sound value gets that far
        _exit_code(verb.split() + [f"{option}={good}"])
    for value in BAD_NUMBERS:
        if value in also_taken:
            continue
        argv = verb.split() + [f"{option}={value}"]
        try:
            code = _exit_code(argv)
        except WouldBuild:
            pytest.fail(f"`fabriclab {' '.join(argv)}` got past its checks to a lab")
        assert code == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert err and len(err[-1]) <= LONGEST_MESSAGE and "Traceback" not in "".join(err), argv
