"""The Vagrantfile and the playbook, checked by their own tools without booting anything:
`vagrant validate` (Debian's vagrant) for one VM and for three, the inventory the Vagrantfile
writes, its refusal of bad settings, and ansible's syntax check of every playbook."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def vagrant(tmp_path, nodes, **env):
    exe = shutil.which("vagrant")
    if exe is None:
        pytest.fail("no vagrant: `fabriclab provision` installs Debian's package", pytrace=False)
    dot = tmp_path / f"dot{nodes}"
    environ = dict(os.environ, VAGRANT_HOME=str(tmp_path / "home"), VAGRANT_DOTFILE_PATH=str(dot),
                   LAB_NODES=str(nodes), VAGRANT_CHECKPOINT_DISABLE="1", **env)
    proc = subprocess.run([exe, "validate", "--ignore-provider"], cwd=REPO, env=environ, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    return proc, dot / "fabriclab-inventory.ini"


@pytest.mark.parametrize("nodes", [1, 3])
def test_the_vagrantfile_validates_and_writes_its_inventory(tmp_path, nodes):
    proc, inventory = vagrant(tmp_path, nodes)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Vagrantfile validated successfully" in proc.stdout
    assert [f"==> lab{i}:" in proc.stdout for i in range(1, nodes + 1)] == [True] * nodes
    lines = inventory.read_text().splitlines()
    hosts = [line.split()[0] for line in lines if line.startswith("lab") and "ansible_host=" in line]
    assert hosts == [f"lab{i}" for i in range(1, nodes + 1)]
    assert f"lab{nodes} ansible_host=192.168.56.{10 + nodes} fabriclab_private_ip=192.168.56.{10 + nodes}" in lines
    assert "[lab:vars]" in lines and "project_dir=/vagrant" in lines


def test_the_vm_is_the_distribution_ci_runs():
    text = (REPO / "Vagrantfile").read_text()
    assert 'config.vm.box = "debian/bookworm64"' in text


@pytest.mark.parametrize("env, problem", [({"LAB_NODES": "9"}, "LAB_NODES must be a whole number from 1 to 8"),
                                          ({"LAB_NODES": "two"}, "LAB_NODES must be a whole number"),
                                          ({"LAB_NET": "300.1.1"}, "LAB_NET must be the first three octets")])
def test_bad_settings_are_refused_in_one_line(tmp_path, env, problem):
    nodes = env.pop("LAB_NODES", "1")
    proc, _inventory = vagrant(tmp_path, nodes, **env)
    assert proc.returncode != 0 and problem in proc.stderr
    assert len([line for line in proc.stderr.splitlines() if line.strip()]) == 1


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "playbooks").glob("*.yml")))
def test_every_playbook_passes_ansibles_syntax_check(name):
    playbook = pathlib.Path(sys.executable).with_name("ansible-playbook")
    proc = subprocess.run([str(playbook), "--syntax-check", "-i", "localhost,", "-e", "project_dir=/tmp",
                           str(REPO / "playbooks" / name)], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
