"""The flake finder: run chosen tests N times, each in a fresh pytest process, and print each
test's pass rate and the spread of every figure it asserts on.

    sudo ./lab.sh test --repeat 10 tests/lab/test_queues.py -k pauses
    .venv/bin/python -m tests.repeat 10 tests/unit/test_table.py
    .venv/bin/python -m tests.repeat --catalogues DIR [DIR...] -- tests/lab/test_ecmp_tiers.py

The tests that read the `reproduce --quick` catalogue can instead be run once against each of
several catalogues run before (each CI run leaves one, with its draws): `--catalogues` sets
FABRICLAB_QUICK_CATALOGUE to each folder in turn, so their figures' spread is over every draw of
every catalogue without running the catalogue again.

A test names the figures it asserts on with the `figure` fixture (tests/conftest.py); pytest
writes them into its JUnit XML as `figure:<name>` properties, which this reads back. A margin in a
lab test is set from this table: the spread of each figure over at least 10 runs
(docs/testing.md, "How a margin is chosen").
"""

from __future__ import annotations

import math
import pathlib
import statistics
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree

MAX_REPEATS = 1000
FIGURE = "figure:"


def outcome_of(case):
    """passed, failed, error or skipped: a JUnit <testcase>'s outcome."""
    for tag in ("failure", "error", "skipped"):
        if case.find(tag) is not None:
            return {"failure": "failed"}.get(tag, tag)
    return "passed"


def read_run(path):
    """{test id: (outcome, {figure: value})} of one pytest run's JUnit XML (a run that wrote none,
    having crashed, gives nothing)."""
    try:
        root = ElementTree.parse(path).getroot()
    except (OSError, ElementTree.ParseError):
        return {}
    tests = {}
    for case in root.iter("testcase"):
        test = f"{case.get('classname', '')}::{case.get('name', '')}"
        figures = {}
        for prop in case.iter("property"):
            name, value = prop.get("name", ""), prop.get("value", "")
            if name.startswith(FIGURE):
                try:
                    figures[name[len(FIGURE):]] = float(value)
                except ValueError:
                    continue
        outcome = outcome_of(case)
        if test in tests and tests[test][0] != "passed":      # set-up and call both report
            outcome = tests[test][0]
        tests[test] = (outcome, {**tests.get(test, ("", {}))[1], **figures})
    return tests


def summarize(runs):
    """Rows (test, figure or "", passed, ran, min, median, max, sd) over the runs' results: one row
    per test with its pass rate, then one per figure with its spread."""
    tests = {}
    for run in runs:
        for test, (outcome, figures) in run.items():
            entry = tests.setdefault(test, {"passed": 0, "ran": 0, "figures": {}})
            if outcome == "skipped":
                continue
            entry["ran"] += 1
            entry["passed"] += outcome == "passed"
            for name, value in figures.items():
                if math.isfinite(value):
                    entry["figures"].setdefault(name, []).append(value)
    rows = []
    for test in sorted(tests):
        entry = tests[test]
        rows.append((test, "", entry["passed"], entry["ran"], None, None, None, None))
        for name, values in sorted(entry["figures"].items()):
            sd = statistics.stdev(values) if len(values) > 1 else 0.0
            rows.append((test, name, None, len(values), min(values), statistics.median(values), max(values), sd))
    return rows


def table(rows):
    from fabriclab.table import format_table

    def num(v):
        return "" if v is None else f"{v:.4g}"

    out = []
    for test, figure, passed, ran, lo, mid, hi, sd in rows:
        if not figure:
            rate = f"{passed}/{ran} ({passed / ran:.0%})" if ran else "skipped"
            out.append((test.rsplit("::", 1)[-1][:70], rate, "", "", "", "", ""))
        else:
            out.append(("  " + figure[:68], "", ran, num(lo), num(mid), num(hi), num(sd)))
    return format_table(("test / figure", "passed", "n", "min", "median", "max", "sd"), out)


USAGE = (f"usage: python -m tests.repeat N [pytest args]   (N: 1-{MAX_REPEATS})\n"
         f"       python -m tests.repeat --catalogues DIR [DIR...] -- [pytest args]")


def parse(argv):
    """(runs' environments, pytest args) from the command line, or None when it is not one."""
    import os

    if argv and argv[0] == "--catalogues":
        if "--" not in argv:
            return None
        cut = argv.index("--")
        folders = argv[1:cut]
        if not 1 <= len(folders) <= MAX_REPEATS or not all(
                (pathlib.Path(f) / "catalogue.json").is_file() for f in folders):
            return None
        return [{**os.environ, "FABRICLAB_QUICK_CATALOGUE": str(pathlib.Path(f).resolve())}
                for f in folders], argv[cut + 1:]
    if not argv or not argv[0].isdigit() or not 1 <= int(argv[0]) <= MAX_REPEATS:
        return None
    return [None] * int(argv[0]), argv[1:]


def main(argv=None):
    parsed = parse(list(sys.argv[1:] if argv is None else argv))
    if parsed is None:
        print(USAGE, file=sys.stderr)
        return 2
    envs, args = parsed
    n = len(envs)
    folder = pathlib.Path("results") / f"repeat-{time.strftime('%Y%m%d-%H%M%S')}"
    folder.mkdir(parents=True, exist_ok=True)
    runs = []
    for k, env in enumerate(envs, 1):
        xml = folder / f"run-{k}.xml"
        t0 = time.monotonic()
        code = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
                               "-o", "junit_family=xunit1",        # keeps each test's properties
                               f"--junitxml={xml}",
                               # a temporary folder of its own: pytest keeps only its 3 newest in
                               # /tmp/pytest-of-USER, so each run there would delete another's
                               # (a CI run's beside it, say)
                               f"--basetemp={folder / 'tmp'}", *args], stdin=subprocess.DEVNULL, env=env).returncode
        run = read_run(xml)
        runs.append(run)
        failed = sorted(t for t, (o, _f) in run.items() if o in ("failed", "error"))
        print(f"repeat: run {k} of {n}: pytest exit {code} in {time.monotonic() - t0:.0f} s"
              + (f"; failed: {', '.join(failed)}" if failed else ""), flush=True)
        if code not in (0, 1):           # 2-5: interrupted, a usage error, nothing collected
            print(f"repeat: pytest exited {code}: stopping", file=sys.stderr)
            break
    report = table(summarize(runs))
    (folder / "summary.txt").write_text(report + "\n")
    print("\n" + report + f"\n\nrepeat: JUnit XML of each run and this table in {folder}/")
    flaky = [row for row in summarize(runs) if not row[1] and row[3] and row[2] < row[3]]
    return 1 if flaky else 0


if __name__ == "__main__":
    sys.exit(main())
