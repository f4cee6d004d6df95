"""Shared test set-up: lab tests (marked `lab`) need root and are skipped, with the reason, without it."""

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
