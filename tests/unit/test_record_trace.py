"""examples/traces/record_trace.py records a job the replay reads. It needs PyTorch, which is not a
fabriclab dependency (its Linux wheels pull in gigabytes of CUDA libraries, too much for CI): the
shipped traces were recorded with it (docs/replay.md says how to record and check one by hand),
and the unit and lab tests read those. Without torch the recorder says in one line what it needs."""

import os
import pathlib
import subprocess
import sys


ROOT = pathlib.Path(__file__).resolve().parents[2]
RECORDER = ROOT / "examples" / "traces" / "record_trace.py"


def test_the_recorder_says_in_one_line_that_it_needs_pytorch():
    probe = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True)
    python = sys.executable if probe.returncode else "/usr/bin/python3"     # one without torch
    proc = subprocess.run([python, "-I", str(RECORDER), "--ranks", "2"], capture_output=True, text=True,
                          timeout=60, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith("record_trace.py needs PyTorch") and len(proc.stderr.splitlines()) == 1

