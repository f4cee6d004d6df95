"""Importing the lab (and with it Mininet) does not import setuptools: in a venv, setuptools' shim
would answer Mininet's `import distutils` with all of setuptools (0.25 s a process, seconds in the
emulated guest of the full-kernel tier)."""

import subprocess
import sys


def test_building_a_lab_needs_no_setuptools():
    code = ("import sys; from fabriclab.lab.lab import Lab; import mininet.node; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('setuptools', 'pkg_resources')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    if sys.version_info < (3, 12):             # the stdlib has a distutils to use instead
        assert out.stdout.strip() == "[]", out.stdout
