"""The guest machine's files, without booting it: the inventory ansible reads, the guest's script
and sshd set-up (fabriclab/cluster/guestmachine.py; the boot itself: tests/lab/test_two_kernels.py)."""

import ipaddress
import pathlib
import subprocess
import types

import pytest

from fabriclab.cluster import guestmachine
from fabriclab.cluster.guestmachine import GUEST_DIR, WIRE_GUEST, WIRE_HOST, GuestMachine
from fabriclab.lab.runstate import RUN_ROOT
from fabriclab.system.inventory import machines


def fake(tmp_path, count=1):
    """A GuestMachine as start() leaves it, without booting (the tier is not probed)."""
    guest = GuestMachine.__new__(GuestMachine)
    guest.guests = [guestmachine.Guest(i, guestmachine.guest_name(i), guestmachine.guest_address(i),
                                       f"52:54:00:fa:b1:{i + 1:02x}") for i in range(1, count + 1)]
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
    machine = fake(tmp_path)
    script = machine.guest_script(machine.guests[0])
    assert f"{guestmachine.SSHD} -f {GUEST_DIR}/sshd_config" in script
    assert f"ip addr add {WIRE_GUEST}/{guestmachine.WIRE_PREFIX}" in script and machine.guests[0].mac in script
    assert guestmachine.READY in script and "openvswitch" in script
    assert f"{RUN_ROOT}/" not in script and not pathlib.PurePath(GUEST_DIR).is_relative_to(RUN_ROOT)


def test_root_in_the_guest_has_a_home_of_its_own(tmp_path):
    """This machine's /root (shared with the guest) may hold rc files that cost 20 s an SSH
    command under emulation: the guest's passwd, in its own overlay of /etc, points root's home at
    an empty folder. The script's own sed line, run on a copy of a passwd file."""
    machine = fake(tmp_path)
    script = machine.guest_script(machine.guests[0])
    (line,) = [ln for ln in script.splitlines() if "/etc/passwd" in ln]
    passwd = tmp_path / "passwd"
    passwd.write_text("root:x:0:0:root:/root:/bin/bash\nrootless:x:1000:1000::/root:/bin/sh\n")
    subprocess.run(["sh", "-c", line.replace("/etc/passwd", str(passwd))], check=True)
    assert passwd.read_text().splitlines() == [f"root:x:0:0:root:{guestmachine.GUEST_HOME}:/bin/bash",
                                               "rootless:x:1000:1000::/root:/bin/sh"]
    assert f"install -d -m 700 {guestmachine.GUEST_HOME}" in script
    assert script.index("/etc/passwd") < script.index(guestmachine.SSHD)


def test_an_inventory_path_that_cannot_be_written_is_refused_before_booting(tmp_path, capsys):
    from fabriclab.cli.main import main

    for bad in (tmp_path / "missing" / "two.ini", tmp_path):
        assert main(["fullkernel", "machine", "--inventory", str(bad)]) == 2
        err = capsys.readouterr().err
        assert "cannot write a file there" in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_more_guests_get_their_own_names_addresses_and_nics_on_one_wire(tmp_path):
    machine = fake(tmp_path, count=3)
    found = dict(machines(machine.inventory(tmp_path / "four.ini", project_dir="/srv/f", venv_dir="/srv/v")))
    assert list(found) == ["here", "guest", "guest2", "guest3"]
    addresses = [found[name]["fabriclab_private_ip"] for name in found]
    assert addresses == [WIRE_HOST, "172.31.253.2", "172.31.253.3", "172.31.253.4"]
    assert [found[name]["ansible_host"] for name in found if name != "here"] == addresses[1:]
    # all on one subnet, so guests reach each other as well as this machine
    net = ipaddress.ip_network(f"{WIRE_HOST}/{guestmachine.WIRE_PREFIX}", strict=False)
    assert all(ipaddress.ip_address(a) in net for a in addresses) and len(set(addresses)) == 4
    assert net.num_addresses - 2 >= guestmachine.MAX_GUESTS + 1
    scripts = [machine.guest_script(g) for g in machine.guests]
    assert len({g.mac for g in machine.guests}) == 3
    for guest, script in zip(machine.guests, scripts):
        assert f"ip addr add {guest.address}/" in script and guest.mac in script
        assert all(other.address not in script for other in machine.guests if other is not guest)
    assert machine.guest("guest3").address == "172.31.253.4"


def test_a_count_of_guests_out_of_range_is_refused_before_anything(capsys):
    from fabriclab.cli.main import main
    from fabriclab.errors import LabError

    for bad in (0, guestmachine.MAX_GUESTS + 1, True, "2"):
        with pytest.raises(LabError, match="between 1 and"):
            GuestMachine(count=bad)
    assert main(["fullkernel", "machine", "--guests", "9"]) == 2
    err = capsys.readouterr().err
    assert "--guests: between 1 and 4, got 9" in err and err.count("\n") == 1


@pytest.mark.parametrize("accel, emulated", [("tcg", True), ("kvm", False)])
def test_every_ssh_session_in_an_emulated_guest_is_patient(tmp_path, accel, emulated):
    """Sessions over SSH get the tier's FABRICLAB_PATIENCE: in a guest under software emulation a
    controller took more than its 20 s to listen (a sweep case there, 2026-11-28)."""
    from fabriclab.system import fullkernel, patience

    expected = fullkernel.GUEST_PATIENCE if emulated else 1
    assert expected > 1 or not emulated
    machine = fake(tmp_path)
    machine.tier = types.SimpleNamespace(accel=accel)
    machine._keys()
    config = (tmp_path / "guest" / "sshd_config").read_text().splitlines()
    (setenv,) = [line for line in config if line.startswith("SetEnv ")]
    assert f"{patience.ENV}={expected}" in setenv.split()[1:]
    assert f"MPLCONFIGDIR={fullkernel.GUEST_MPLCONFIGDIR}" in setenv.split()[1:]


def test_a_guests_qemu_is_looked_for_until_qemu_itself_is_recorded(tmp_path, monkeypatch):
    """virtme-run carries the netdev too and starts qemu as its child: a look in between found
    only virtme-run, and a killed machine's qemu then outlived `clean` (CI, 2026-11-28)."""
    machine = fake(tmp_path)
    recorded = []
    machine.run.add_process = lambda pid, role, match: recorded.append((pid, role, match))
    guest = machine.guests[0]
    guest.tap = "fabg-abcdef-1"
    running = {101: "/venv/bin/python /venv/bin/virtme-run --qemu-opts"}
    monkeypatch.setattr(guestmachine.procs, "with_argument_under", lambda netdev: [(pid, netdev) for pid in running])
    monkeypatch.setattr(guestmachine.procs, "pid_cmdline", lambda pid: running.get(pid))
    machine._record_qemus()
    assert recorded == [(101, "guest-qemu", guest.netdev)] and not guest.qemu_recorded
    running[102] = "/usr/bin/qemu-system-x86_64 -name virtme-ng"
    machine._record_qemus()
    machine._record_qemus()                      # recorded once each, and no more looks once qemu is
    running[103] = "/usr/bin/qemu-system-x86_64 -name another"
    machine._record_qemus()
    assert [pid for pid, _role, _match in recorded] == [101, 102] and guest.qemu_recorded


def test_a_guest_machine_started_in_the_background_stops_on_sigint(tmp_path, monkeypatch, capsys):
    """A shell starts a background job with SIGINT ignored, so Python raises no KeyboardInterrupt:
    `kill -INT` stopped nothing. The machine now stops on SIGINT (and SIGTERM) however it started."""
    import os
    import signal
    import threading

    from fabriclab.cli import machine as machine_cli

    class Machines:
        def __init__(self, *a, **kw):
            self.guests = [types.SimpleNamespace(name="guest1", address="10.99.0.2",
                                                 proc=types.SimpleNamespace(poll=lambda: None, returncode=None))]
            self.tier = types.SimpleNamespace(kernel="6.1.0-test")
            self.boot_s = 1.0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def inventory(self, path, project_dir):
            return path

    monkeypatch.setattr(guestmachine, "GuestMachine", Machines)
    monkeypatch.setattr(machine_cli.doctor, "require_environment", lambda: None)
    def still_running(*_):
        raise AssertionError("SIGINT did not stop the guest machine within 10 s")

    before = signal.signal(signal.SIGINT, signal.SIG_IGN)          # as a background job has it
    alarm = signal.signal(signal.SIGALRM, still_running)
    signal.alarm(10)
    try:
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
        args = types.SimpleNamespace(guests=1, inventory=str(tmp_path / "two.ini"), kernel=None, kvm=False)
        assert machine_cli.run_guest_machine(args) == 0
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN                # put back as it was
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, alarm)
        signal.signal(signal.SIGINT, before)
    assert "stopped, its wire removed" in capsys.readouterr().out
