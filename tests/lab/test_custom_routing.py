"""A routing class of one's own, from a file (examples/routing/by_destination.py), runs as the
controller on a real fabric: a verified ring AllReduce on tiny, and each leaf's traffic to the
other leaf leaves over the one uplink the class chose for that destination."""

import json
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.lab

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHOICE = "examples/routing/by_destination.py:ByDestination"


def test_a_routing_file_carries_a_verified_ring_allreduce(tmp_path):
    out = tmp_path / "r"
    proc = subprocess.run([sys.executable, "-m", "fabriclab.cli.main", "collective", "tiny", "--routing", CHOICE,
                           "--sizes", "256K", "--iterations", "2", "--verify", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, stdin=subprocess.DEVNULL)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]       # 1: a CPU-saturated run
    doc = json.loads((out / "results.json").read_text())
    (run,) = doc["runs"]
    # recorded by its canonical label: the file's absolute path, the class, the run's seed
    assert run["routing"].startswith(f"{ROOT / CHOICE}:seed="), run["routing"]
    (job,) = run["jobs"].values()
    (size,) = job["sizes"]
    assert size["verify"]["ok"] and size["algorithm"] == "ring"
    # l1 reaches leaf 2 over its first uplink (to s1), l2 reaches leaf 1 over its second (to s2)
    sent = {(r["from"], r["to"]): r["mbps"] for r in size["links"] if r["from"].startswith("l")}
    assert set(sent) == {("l1", "s1"), ("l1", "s2"), ("l2", "s1"), ("l2", "s2")}, sent
    assert sent[("l1", "s1")] > 1 and sent[("l2", "s2")] > 1, sent          # ~5 Mbit/s of 10 each way
    assert sent[("l1", "s2")] < 0.05 and sent[("l2", "s1")] < 0.05, sent    # nothing: not even a stray flow


def test_an_osken_app_of_ones_own_is_the_whole_controller(tmp_path):
    """examples/apps/learning_switch.py, an ordinary OSKenApp (not the lab's routing API), on a
    fabric without loops: pingall reaches every host, a ring AllReduce verifies, and the results
    say which controller ran (no hash basis: the app's hashing is its own)."""
    script = tmp_path / "script"
    script.write_text("pingall\ncollective --sizes 256K --iterations 2 --verify\n")
    app = "osken:examples/apps/learning_switch.py:LearningSwitch"
    proc = subprocess.run([sys.executable, "-m", "fabriclab.cli.main", "up", "examples/apps/one_leaf.yaml",
                           "--routing", app, "--script", str(script)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-1500:] + proc.stderr[-1500:]
    assert "*** Results: 0% dropped (12/12 received)" in proc.stdout + proc.stderr, proc.stderr[-1500:]
    folder = proc.stdout.split("results: ", 1)[1].split()[0]
    doc = json.loads((ROOT / folder / "results.json").read_text())
    (run,) = doc["runs"]
    assert run["routing"] == f"osken:{ROOT / 'examples/apps/learning_switch.py'}:LearningSwitch"
    assert run["routing_state"]["hash"] is None
    (size,) = next(iter(run["jobs"].values()))["sizes"]
    assert size["verify"]["ok"] and size["algorithm"] == "ring"


@pytest.mark.parametrize("spec, app, options", [
    ("tiny", "ecmp", {"weights": False, "seed": 0, "shared_basis": False}),      # one of the lab's apps
    ("examples/apps/one_leaf.yaml", "osken:examples/apps/learning_switch.py", {}),   # an ordinary OSKenApp
])
def test_an_external_controller_carries_a_verified_ring(tmp_path, spec, app, options):
    """`--routing tcp:HOST:PORT`: the switches connect to an OpenFlow controller the lab did not
    start (here an os-ken process started beside it, given the fabric as the lab would give it);
    the lab waits until every switch is connected, and records which controller ran."""
    import socket

    from fabriclab.system import procs
    from fabriclab.topologies.fabric import Fabric
    from fabriclab.topologies.spec import load_spec

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "fabric.json").write_text(Fabric(load_spec(str(ROOT / spec) if "/" in spec else spec)).to_json())
    controller = subprocess.Popen([sys.executable, "-m", "fabriclab.apps.runner", "--app", app, "--run-dir",
                                   str(tmp_path), "--port", str(port), "--options", json.dumps(options),
                                   "--run-id", "20261128-000000-abcdef"], cwd=ROOT, start_new_session=True,
                                  stdout=subprocess.DEVNULL, stderr=open(tmp_path / "controller.log", "w"))
    try:
        out = tmp_path / "r"
        proc = subprocess.run([sys.executable, "-m", "fabriclab.cli.main", "collective", spec, "--routing",
                               f"tcp:127.0.0.1:{port}", "--sizes", "256K", "--iterations", "2", "--verify",
                               "--out", str(out)], capture_output=True, text=True, timeout=300, cwd=ROOT,
                              stdin=subprocess.DEVNULL)
        assert proc.returncode in (0, 1), proc.stderr[-2000:]       # 1: a CPU-saturated run
        assert controller.poll() is None, (tmp_path / "controller.log").read_text()[-800:]
    finally:
        procs.end_group(controller)
    doc = json.loads((out / "results.json").read_text())
    (run,) = doc["runs"]
    assert run["routing"] == f"tcp:127.0.0.1:{port}" and run["routing_state"]["hash"] is None
    (size,) = next(iter(run["jobs"].values()))["sizes"]
    assert size["verify"]["ok"] and size["algorithm"] == "ring"
