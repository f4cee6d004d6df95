"""The guest machine's files, without booting it: the inventory ansible reads, the guest's script
and sshd set-up (fabriclab/lab/guestmachine.py; the boot itself: tests/lab/test_two_kernels.py)."""

import pathlib
import types

from fabriclab.lab import guestmachine
from fabriclab.lab.guestmachine import GUEST_DIR, WIRE_GUEST, WIRE_HOST, GuestMachine
from fabriclab.lab.runstate import RUN_ROOT
from fabriclab.system.inventory import machines


def fake(tmp_path):
    guest = GuestMachine.__new__(GuestMachine)
    guest.run = types.SimpleNamespace(dir=tmp_path, id="20261126-000000-abcdef", path=lambda n: tmp_path / n)
    guest.key = str(tmp_path / "id")
    return guest


def test_the_inventory_names_both_machines_and_pins_the_guests_host_key(tmp_path):
    path = fake(tmp_path).inventory(tmp_path / "two.ini", project_dir="/srv/fabriclab", venv_dir="/srv/venv")
    found = dict(machines(path))
    assert list(found) == ["here", "guest"]
    assert found["here"]["ansible_connection"] == "local" and found["here"]["fabriclab_private_ip"] == WIRE_HOST
    guest = found["guest"]
    assert guest["ansible_host"] == WIRE_GUEST and guest["ansible_user"] == "root"
    assert guest["ansible_ssh_private_key_file"] == str(tmp_path / "id")
    assert f"UserKnownHostsFile={tmp_path}/known_hosts" in guest["ansible_ssh_common_args"]
    assert "StrictHostKeyChecking=yes" in guest["ansible_ssh_common_args"]
    assert guest["project_dir"] == "/srv/fabriclab" and guest["venv_dir"] == "/srv/venv"


def test_the_guest_reads_its_files_outside_the_lab_run_root(tmp_path):
    """A `clean` in the guest must not find this machine's run records: everything the guest
    reads or writes is under GUEST_DIR, never under RUN_ROOT."""
    script = fake(tmp_path).guest_script()
    assert f"{guestmachine.SSHD} -f {GUEST_DIR}/sshd_config" in script
    assert f"ip addr add {WIRE_GUEST}/{guestmachine.WIRE_PREFIX}" in script and guestmachine.GUEST_MAC in script
    assert guestmachine.READY in script and "openvswitch" in script
    assert f"{RUN_ROOT}/" not in script and not pathlib.PurePath(GUEST_DIR).is_relative_to(RUN_ROOT)


def test_an_inventory_path_that_cannot_be_written_is_refused_before_booting(tmp_path, capsys):
    from fabriclab.cli.main import main

    for bad in (tmp_path / "missing" / "two.ini", tmp_path):
        assert main(["fullkernel", "machine", "--inventory", str(bad)]) == 2
        err = capsys.readouterr().err
        assert "cannot write a file there" in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []
