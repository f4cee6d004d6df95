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


# -- control characters (issue 35) -------------------------------------------------------------------
# A NUL ends a name early in the kernel and in C libraries, an ESC rewrites the terminal that prints
# it, a lone surrogate cannot be written out as UTF-8: no key or string of an input holds one. In a
# YAML file they are refused raw (YAML's own rule) and escaped ("\0", "\e", "\uD800"); in JSON (the
# lab's results documents, which may record a program's output) only lone surrogates are.
CONTROLS = ["\x00", "\x01", "\x07", "\x08", "\x0b", "\x0c", "\x1b", "\x1f", "\x7f", "\x80", "\x85", "\x9f",
            "\ud800", "\udbff", "\udc00", "\udfff"]
SURROGATES = {c for c in CONTROLS if 0xD800 <= ord(c) <= 0xDFFF}
CONTROL_CASES = 16


def string_spots(doc):
    """(container, key, is_key) for every string value and every string key of a document."""
    out = []
    for container, key, _trail in places(doc):
        if isinstance(container, dict) and isinstance(key, str):
            out.append((container, key, True))
        if isinstance(container[key], str):
            out.append((container, key, False))
    return out


def with_control(base, rng, fmt="yaml"):
    """(text, must_refuse, what): one control character in a string value or a key of `base` (as
    the dumper escapes it), or raw anywhere in its text."""
    dump = dump_yaml if fmt == "yaml" else dump_json
    char = rng.choice(CONTROLS)
    doc = copy.deepcopy(base)
    spots = string_spots(doc)
    how = rng.choice(["value", "key", "raw"]) if spots else "raw"
    name = f"U+{ord(char):04X}"
    if how == "raw":
        text = dump(doc)
        at = rng.randrange(len(text) + 1)
        data = text[:at].encode() + char.encode("utf-8", "surrogatepass") + text[at:].encode()
        # YAML takes no control character raw but NEL (a line break to it); surrogates are not
        # UTF-8. JSON takes DEL and C1 raw inside a string.
        refuse = char in SURROGATES or (char != "\x85" if fmt == "yaml" else ord(char) < 0x20)
        return data, refuse, f"{name} raw at {at}"
    candidates = [s for s in spots if s[2] == (how == "key")] or spots
    container, key, is_key = rng.choice(candidates)
    old = key if is_key else container[key]
    at = rng.randrange(len(old) + 1)
    new = old[:at] + char + old[at:]
    if is_key:
        container[new] = container.pop(key)
    else:
        container[key] = new
    return dump(doc), fmt == "yaml" or char in SURROGATES, f"{name} in {'key' if is_key else 'value'} {old[:20]!r}"


def fuzz_controls(base, load, tmp_path, seed, name="case.yaml", fmt="yaml"):
    rng = random.Random(seed)
    for i in range(CONTROL_CASES):
        text, must_refuse, what = with_control(base, rng, fmt)
        path = write(tmp_path / name, text)
        try:
            result = outcome(load, path)
        except Exception as exc:                     # noqa: BLE001
            pytest.fail(f"seed {seed} case {i} ({what}): {type(exc).__name__}: {str(exc)[:200]}")
        if must_refuse:
            assert result == "refused", f"seed {seed} case {i}: {what} was taken"


def scenario_base(path):
    """A shipped scenario as a mapping that works from any folder (its trace paths made absolute)."""
    base = yaml.safe_load(path.read_text())
    for job in base.get("jobs", []):
        if isinstance(job, dict) and "trace" in job:
            job["trace"] = str((path.parent / job["trace"]).resolve())
    return base


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_control_characters_in_specs(path, tmp_path):
    fuzz_controls(yaml.safe_load(path.read_text()), lambda p: Fabric(load_spec(p)), tmp_path,
                  seed=zlib.crc32(b"controls" + path.stem.encode()))


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_control_characters_in_scenarios(path, tmp_path):
    fuzz_controls(scenario_base(path), _check_scenario, tmp_path, seed=zlib.crc32(b"controls" + path.stem.encode()))


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.stem)
def test_control_characters_in_profiles(path, tmp_path):
    fuzz_controls(yaml.safe_load(path.read_text()), load_profile, tmp_path, seed=zlib.crc32(path.stem.encode()))


def test_control_characters_in_results_documents(tmp_path):
    def load(path):
        compare.rows(document.load(path.parent), "x")

    fuzz_controls(rd.scenario_doc(), load, tmp_path, seed=35, name="results.json", fmt="json")


# -- counts that multiply ----------------------------------------------------------------------------
# Every whole number set huge, alone and several at once: a count that multiplies (repetitions x
# routing schemes, sizes x channels x ranks, planes x leaves x hosts) must not make a check slow.
HUGE = [64, 1000, 4096, 65536, 10 ** 6, 10 ** 9, 2 ** 31, 2 ** 32 + 1, 2 ** 53, 2 ** 63, 10 ** 30, 10 ** 40,
        10 ** 41]
COUNT_CASES = 24
# Counts a scenario's parts take that the shipped files leave at their defaults
SCENARIO_COUNTS = {"repetitions": 1}
COLLECTIVE_COUNTS = {"iterations": 5, "warmup": 1, "channels": 1, "qps": 1, "spray": 1, "cts_buffers": 2}


def with_counts(doc):
    """`doc` with the counts left at their defaults written out, so that they can be set huge."""
    doc = copy.deepcopy(doc)
    if "jobs" in doc:
        doc = {**SCENARIO_COUNTS, **doc}
        for job in doc["jobs"]:
            if isinstance(job, dict) and job.get("kind", "collective") == "collective":
                for key, value in COLLECTIVE_COUNTS.items():
                    job.setdefault(key, value)
    return doc


def huge_counts(base, rng):
    """(text, must_refuse, what): one to five whole numbers (or lists of them) set huge."""
    doc = copy.deepcopy(base)
    spots = [(c, k, t) for c, k, t in places(doc)
             if (isinstance(c[k], int) and not isinstance(c[k], bool))
             or (isinstance(c[k], list) and c[k] and all(isinstance(v, int) and not isinstance(v, bool) for v in c[k]))]
    what, refuse = [], False
    for container, key, trail in rng.sample(spots, min(len(spots), rng.choice([1, 1, 2, 3, 5]))):
        value = rng.choice(HUGE)
        # a list of counts (sizes): as long as it may be, every entry huge
        container[key] = [value] * rng.choice([1, 64, 65, 5000]) if isinstance(container[key], list) else value
        refuse |= value >= 10 ** 30                 # no count or size of an input goes that far
        what.append(f"{'/'.join(map(str, trail))}={value:.3g}")
    return dump_yaml(doc), refuse, ", ".join(what)


def fuzz_counts(base, load, tmp_path, seed):
    rng = random.Random(seed)
    for i in range(COUNT_CASES):
        text, must_refuse, what = huge_counts(base, rng)
        path = write(tmp_path / "case.yaml", text)
        try:
            result = outcome(load, path)
        except Exception as exc:                     # noqa: BLE001
            pytest.fail(f"seed {seed} case {i} ({what}): {type(exc).__name__}: {str(exc)[:200]}")
        if must_refuse:
            assert result == "refused", f"seed {seed} case {i}: {what} was taken"


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_huge_counts_in_specs(path, tmp_path):
    fuzz_counts(yaml.safe_load(path.read_text()), lambda p: Fabric(load_spec(p)), tmp_path,
                seed=zlib.crc32(b"counts" + path.stem.encode()))


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_huge_counts_in_scenarios(path, tmp_path):
    fuzz_counts(with_counts(scenario_base(path)), _check_scenario, tmp_path,
                seed=zlib.crc32(b"counts" + path.stem.encode()))


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.stem)
def test_huge_counts_in_profiles(path, tmp_path):
    fuzz_counts(yaml.safe_load(path.read_text()), load_profile, tmp_path, seed=zlib.crc32(b"counts" + path.stem.encode()))


# -- the largest shapes each bound accepts ---------------------------------------------------------
def largest_spec(doc):
    """`doc` with every count at the largest value the loader takes for its kind, combined."""
    from fabriclab.topologies import spec as spec_mod

    doc = {**doc, "leaves": spec_mod.MAX_LEAVES, "spines": spec_mod.MAX_SPINES, "parallel_links": 16,
           "hosts_per_leaf": spec_mod.MAX_PORTS_PER_LEAF, "mtu": spec_mod.MAX_MTU}
    kind = doc.get("kind", "leafspine")
    if doc.get("cabling") == "rail":
        doc.update(nics_per_host=16, leaves=spec_mod.MAX_LEAVES // 16 * 16)
    if kind == "multiplane":
        doc["planes"] = spec_mod.MAX_PLANES
    if kind == "threetier":
        doc.update(pods=spec_mod.MAX_PODS, leaves=spec_mod.MAX_LEAVES // spec_mod.MAX_PODS,
                   super_spines=spec_mod.MAX_SUPER_SPINES)
    return doc


def _check_verb(path, capsys):
    """`fabriclab check FILE` within the time bound: its exit code and its stderr's lines."""
    code = _exit_code(["check", "--format", "json", str(path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code in (0, 2) and "Traceback" not in "".join(err), err[-3:]
    assert not err or len(err[-1]) <= LONGEST_MESSAGE
    return code


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_largest_spec_shapes(path, tmp_path, capsys):
    case = write(tmp_path / "case.yaml", dump_yaml(largest_spec(yaml.safe_load(path.read_text()))))
    outcome(load_spec, case)
    _check_verb(case, capsys)                              # `check` answers from the counts


@pytest.mark.parametrize("shape", [
    # issue 35: the most planes a spec of 254 leaves takes (p100l254-eth1277 is 16 characters)
    {"kind": "multiplane", "planes": 99, "leaves": 254, "spines": 64, "hosts_per_leaf": 253, "parallel_links": 16},
    {"kind": "leafspine", "leaves": 254, "spines": 64, "hosts_per_leaf": 253, "parallel_links": 16},
    {"kind": "multiplane", "planes": 99, "cabling": "rail", "nics_per_host": 16, "leaves": 240, "spines": 64,
     "hosts_per_leaf": 253, "parallel_links": 16},
    {"kind": "threetier", "pods": 2, "leaves": 127, "spines": 64, "super_spines": 256, "hosts_per_leaf": 253,
     "parallel_links": 16},
], ids=["99-planes", "leafspine", "rail-99-planes", "threetier"])
def test_largest_accepted_specs_are_checked_at_once(shape, tmp_path, capsys):
    from fabriclab.topologies.fabric import beyond_any_lab

    case = write(tmp_path / "case.yaml", dump_yaml({"name": "largest", **shape}))
    assert _check_verb(case, capsys) == 0                  # taken, and counted, not built
    if beyond_any_lab(load_spec(case)):                    # (the largest leafspine's 2 s build:
        assert outcome(lambda p: Fabric(load_spec(p)), case) == "refused"     # test_fabric.py)


def largest_scenario(doc):
    """`doc` with its runs, its collective jobs' counts and sizes and its faults' counts at the
    largest values each bound takes, combined."""
    from fabriclab.traffic import collective
    from fabriclab.workflows import faults, plan

    doc = copy.deepcopy(doc)
    routings = doc.get("routing", "ecmp")
    doc["repetitions"] = plan.MAX_RUNS // (len(routings) if isinstance(routings, list) else 1)
    for job in doc["jobs"]:
        if job.get("kind", "collective") == "collective":
            job.update({name: high for name, (_low, high) in collective.WHOLE_BOUNDS.items()
                        if name not in ("root", "seed", "retry_limit")})
            job["sizes"] = [collective.MAX_SIZE - 4 * k for k in range(64)]
    for fault in doc.get("faults", []):
        if "count" in fault or "flap" in fault:
            fault["count"] = faults.BOUNDS["count"][1]
    return doc


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_largest_scenario_shapes(path, tmp_path):
    base = scenario_base(path)
    for doc in (largest_scenario(base), {**base, "repetitions": 1_000_000_000}):
        case = write(tmp_path / "case.yaml", dump_yaml(doc))
        try:
            outcome(_check_scenario, case)
        except Exception as exc:                     # noqa: BLE001
            pytest.fail(f"{path.stem}: {type(exc).__name__}: {str(exc)[:200]}")


def test_a_billion_repetitions_are_refused_by_scenario_check(tmp_path, capsys):
    base = scenario_base(SCENARIOS[0])
    case = write(tmp_path / "case.yaml", dump_yaml({**base, "repetitions": 1_000_000_000}))
    assert _exit_code(["scenario", "check", str(case)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "repetitions" in err[0] and len(err[0]) <= LONGEST_MESSAGE


def test_a_nul_in_a_spec_is_one_line_naming_the_field(tmp_path, capsys):
    case = write(tmp_path / "case.yaml", b"name: t\x00\nleaves: 2\n")
    assert _exit_code(["check", str(case)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "line 1" in line and "'name'" in line and "U+0000" in line


def test_the_largest_sweep_is_checked_in_bound(tmp_path):
    """A sweep multiplies a scenario by its cases: the most cases, each at the most runs a sweep
    takes, faults at their largest counts; expanded and checked against its fabric in bound."""
    from fabriclab.workflows import sweep

    base = largest_scenario(scenario_base(REPO / "examples" / "scenarios" / "flap_recovery.yaml"))
    base["jobs"][0].update(channels=1, sizes=[1 << 20])
    runs = sweep.MAX_SWEEP_RUNS // sweep.MAX_CASES // len(base["routing"])
    values = {"jobs.ring.qps": list(range(1, 65)), "jobs.ring.channels": list(range(1, 65)),
              "faults.0.at": [0.5 + k / 64 for k in range(64)], "metrics.sample_ms": list(range(1, 65))}
    fit = {"jobs.ring.qps": values["jobs.ring.qps"][:64], "jobs.ring.channels": [1, 2, 3, 4]}
    for repetitions, params, taken in ((runs, fit, True), (runs + 1, fit, False), (runs, values, False)):
        case = write(tmp_path / "sweep.yaml", dump_yaml({**base, "repetitions": repetitions, "sweep": params}))
        assert outcome(lambda p: sweep.check(sweep.load(p)), case) == ("loaded" if taken else "refused")
