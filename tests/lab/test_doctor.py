"""The real kernel probe on this machine: it cleans up after itself and picks what the kernel has."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from fabriclab.system import doctor

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(os.geteuid() != 0, reason="the kernel probe needs root (sudo ./lab.sh test)"),
]


def probe_namespaces():
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines()
            if line.split() and line.split()[0].startswith(doctor.PROBE_PREFIX)]


def probe_links():
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True,
                         check=True).stdout
    return [line for line in out.splitlines() if " flp0" in line or " flp1" in line]


def dead_pid():
    """A pid no process has now (for a namespace left by a probe that was killed)."""
    pid = 4_000_000
    while os.path.exists(f"/proc/{pid}"):
        pid += 1
    return pid


@pytest.fixture
def netns_registry():
    """Namespaces a test creates by hand; deleted afterwards even if the test fails."""
    names = []
    yield names
    for name in names:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def test_probe_leaves_nothing_behind():
    before = probe_namespaces()
    caps = doctor.probe(refresh=True)
    assert caps.root
    assert probe_namespaces() == before == []
    assert probe_links() == []


def test_probe_cleans_up_when_it_fails_midway(monkeypatch):
    real_run = doctor._run

    def run_until_htb(argv, timeout=30):
        if argv[:1] == ["tc"] and "htb" in argv:
            assert probe_namespaces(), "the probe namespace should exist while probing"
            raise RuntimeError("probe interrupted")
        return real_run(argv, timeout)

    monkeypatch.setattr(doctor, "_run", run_until_htb)
    with pytest.raises(RuntimeError, match="probe interrupted"):
        doctor.probe(refresh=True)
    assert probe_namespaces() == []
    assert probe_links() == []


def test_stale_probe_namespace_of_a_dead_process_is_removed(netns_registry):
    stale = f"{doctor.PROBE_PREFIX}{dead_pid()}"
    netns_registry.append(stale)
    subprocess.run(["ip", "netns", "add", stale], check=True)
    assert stale in doctor.cleanup_stale_probes()
    assert stale not in probe_namespaces()


def test_required_features_present_after_provisioning():
    mechs = doctor.mechanisms(doctor.probe(refresh=True))
    assert doctor.missing_required(mechs) == [], doctor.render_table(mechs)
    assert mechs["shaping"].mechanism in ("htb", "tbf")


@pytest.mark.skipif(os.path.isdir("/sys/module/openvswitch"),
                    reason="this kernel has the openvswitch module")
def test_without_kernel_module_the_datapath_is_userspace():
    caps = doctor.probe(refresh=True)
    assert not caps.ovs_kernel_module
    assert doctor.mechanisms(caps)["ovs_datapath"].mechanism == "userspace"
    assert doctor.ovs_datapath_type(caps) == "netdev"


@pytest.mark.skipif(not os.path.isdir("/sys/module/openvswitch"),
                    reason="this kernel has no openvswitch module")
def test_with_kernel_module_the_datapath_is_kernel():
    assert doctor.ovs_datapath_type(doctor.probe(refresh=True)) == "system"


def test_bpf_probe_agrees_with_clang():
    caps = doctor.probe(refresh=True)
    if not caps.clang:
        assert caps.bpf_classifier is None
    elif caps.clsact:
        assert caps.bpf_classifier is not None, caps.note("bpf_classifier")


def test_doctor_command_json():
    proc = subprocess.run([sys.executable, "-m", "fabriclab.cli.main", "doctor", "--format", "json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["ok"] is True
    assert doc["ovs_datapath_type"] in ("system", "netdev")
    assert set(doc["features"]) >= {"ovs", "ovs_datapath", "shaping", "ecn", "delay",
                                     "queue_model", "roce"}
    assert probe_namespaces() == []


def test_doctor_and_clean_over_an_inventory_say_which_machine_is_not_ready(tmp_path):
    """The lab's own machine answers for real over ansible; one that cannot be reached and one
    without the lab are named with their reason, and make the verbs exit 1."""
    from tests.lab import labutil

    repo = pathlib.Path(__file__).resolve().parents[2]
    local = "ansible_connection=local ansible_python_interpreter=/usr/bin/python3"
    inventory = tmp_path / "inventory.ini"
    inventory.write_text(
        f"[lab]\nlocalhost {local}\n"
        "gone ansible_host=127.0.0.1 ansible_port=9 ansible_user=nobody\n"       # nothing listens there
        f"bare {local} venv_dir={tmp_path / 'novenv'}\n"
        f"[lab:vars]\nproject_dir={repo}\nvenv_dir={sys.prefix}\n")
    cli = [sys.executable, "-m", "fabriclab.cli.main"]
    before = labutil.resources()
    proc = subprocess.run(cli + ["doctor", "--inventory", str(inventory), "--format", "json"],
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    checks = {c["machine"]: c for c in json.loads(proc.stdout)}
    assert checks["localhost"]["ready"], checks["localhost"]
    assert checks["localhost"]["kernel"] == os.uname().release and checks["localhost"]["ovs"][0].isdigit()
    assert checks["gone"]["problems"][0].startswith("unreachable:") and "port 9" in checks["gone"]["problems"][0]
    assert checks["bare"]["problems"] == [f"its doctor did not run: no fabriclab at {tmp_path / 'novenv'}/bin/"
                                          f"fabriclab (run `sudo ./lab.sh bootstrap` in its checkout)"]
    assert "2 of 3 machine(s) not ready: gone, bare" in proc.stderr

    clean = subprocess.run(cli + ["clean", "--inventory", str(inventory)], capture_output=True, text=True,
                           timeout=300, stdin=subprocess.DEVNULL)
    assert clean.returncode == 1, clean.stdout + clean.stderr
    lines = clean.stdout.splitlines()
    assert "localhost: nothing to clean" in lines
    assert any(line.startswith("gone: unreachable:") for line in lines)
    assert any(line.startswith("bare: clean did not run: no fabriclab at") for line in lines)
    assert labutil.leaked(before, labutil.resources()) == {}
