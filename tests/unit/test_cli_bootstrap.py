"""The CLI must load before Mininet is installed: lab.sh runs `fabriclab provision` to install it."""

import subprocess
import sys

NO_MININET = """
import sys
sys.modules["mininet"] = None          # any `import mininet...` now raises ImportError
from fabriclab.cli import main as cli
parser = cli.build_parser()
for argv in (["provision", "--check"], ["doctor"], ["clean"], ["check", "tiny"], ["specs"],
             ["run", "tiny"], ["up", "tiny"], ["demo"], ["benchmark"], ["model", "profiles"]):
    parser.parse_args(argv)
assert cli.main(["check", "tiny"]) == 0
print("ok")
"""


def test_cli_loads_and_parses_every_command_without_mininet():
    proc = subprocess.run([sys.executable, "-c", NO_MININET], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("ok")
