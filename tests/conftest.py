"""Shared test set-up: lab tests (marked `lab`) need root and are skipped, with the reason, without
it; the run ends with the mechanisms the `fullkernel` tests ran, and the tier they ran on."""

import os

import pytest


def is_root():
    return os.geteuid() == 0


def pytest_collection_modifyitems(config, items):
    if is_root():
        return
    skip = pytest.mark.skip(reason="lab test: needs root (run `sudo ./lab.sh test`)")
    for item in items:
        if item.get_closest_marker("lab") is not None:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter):
    lines = []
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", None) != "call":
                continue
            for name, value in getattr(report, "user_properties", ()):
                if name == "mechanism":
                    lines.append(f"{report.nodeid.split('::')[-1]}: {value}")
    if lines:
        tier = "full" if os.environ.get("FABRICLAB_TIER") == "full" else "minimal"
        terminalreporter.write_sep("-", f"mechanisms the fullkernel tests ran (tier: {tier} kernel)")
        for line in sorted(lines):
            terminalreporter.write_line(line)


@pytest.fixture
def figure(record_property):
    """figure(name, value) -> value: a measured figure the test asserts on, recorded in the JUnit
    XML as `figure:<name>` so that `./lab.sh test --repeat N` reports its spread over runs (the
    measured fact a margin is set from: docs/testing.md)."""
    def record(name, value):
        record_property(f"figure:{name}", value)
        return value
    return record
