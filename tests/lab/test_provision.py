"""The provisioning playbook on this machine: idempotent, and a failure names its task.

Each playbook run takes 10-60 s, so this module runs it as few times as it can.
"""

import os
import subprocess
import sys

import pytest

from fabriclab.system import provision as prov
from fabriclab.errors import LabError

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(os.geteuid() != 0, reason="provisioning needs root (sudo ./lab.sh test)"),
    pytest.mark.skipif(sys.prefix == sys.base_prefix,
                       reason="run from the lab's venv: the playbook keeps that venv installed"),
]

VENV = sys.prefix


def test_second_run_changes_nothing():
    # If the machine was not provisioned yet this first run does it; either way the run after
    # it is a second run and must report 0 changed.
    first = prov.provision(prov.PROJECT_DIR, venv_dir=VENV, quiet=True)
    first.raise_for_failure()

    proc = subprocess.run(
        [sys.executable, "-m", "fabriclab.cli.main", "provision", "--venv", VENV],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "provision: ok, 0 changed" in proc.stdout, proc.stdout
    assert "changed:" not in proc.stdout, proc.stdout


def test_failure_names_the_task(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    result = prov.provision(prov.PROJECT_DIR, venv_dir=blocker / "venv", quiet=True)
    assert not result.ok and result.failed == 1
    with pytest.raises(LabError, match="failed at task 'python_env : Create the directory"):
        result.raise_for_failure()
