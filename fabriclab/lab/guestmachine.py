"""A second lab machine on this one: the full-kernel tier's guest (a distribution kernel under qemu,
sharing this machine's files) booted as a machine of its own, reachable over SSH, for what spreads
work over machines (`sweep --inventory`, `doctor --inventory`, `clean --inventory`) and for tests of
it with two separate kernels (issue 21).

The guest and this machine are joined by one virtual wire: a tap here and a virtio NIC there, on a
private /30 (WIRE_HOST, WIRE_GUEST). The guest mounts writable state for Open vSwitch, loads the
tier's modules, starts OVS and an sshd that listens on the wire only, with a host key and an
authorized key made for this run (nothing of this machine's SSH set-up is read or changed). The
inventory it writes names this machine (`here`, a local connection) and the guest (`guest`, over
the wire, its host key pinned in the run's known_hosts).

Everything it creates carries the lab's marks, so `fabriclab clean` removes what a killed one left:
the tap is in the run's interface group, and qemu and virtme-ng are recorded with an argument of
their own (the tap's netdev, the guest script's path in the guest).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time

from fabriclab.errors import EnvironmentProblem, LabError
from fabriclab.lab.runstate import RunState
from fabriclab.system import fullkernel, procs

WIRE_HOST, WIRE_GUEST, WIRE_PREFIX = "172.31.253.1", "172.31.253.2", 30
GUEST_MAC = "52:54:00:fa:b1:02"
# Jumbo frames on the wire: a fabric cable between the machines is a VXLAN tunnel over it, and
# carries the fabric's 9000-byte MTU only if the wire takes that plus the tunnel's 50 bytes.
WIRE_MTU = 9216
READY = "fabriclab-guest-machine: ready"
BOOT_TIMEOUT_S = 240.0
SSH_TIMEOUT_S = 180.0
SSHD = "/usr/sbin/sshd"
SSH_SETUP_FAILURES = {95: "could not bring the wire up", 96: "sshd did not start"}
# Where the guest sees its own files (the run's `guest` folder, its one writable folder of this
# machine's): outside the lab's run root, so a `clean` in the guest never finds this machine's
# run records and takes them for its own.
GUEST_DIR = "/run/fabriclab-guest"


def ssh_options(run_dir, key):
    """ssh's options to reach the guest: the run's key, its host key pinned, never a prompt."""
    return ["-i", key, "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={run_dir}/known_hosts", "-o", "ConnectTimeout=20", "-o", "LogLevel=ERROR"]


class GuestMachine:
    """start() boots the guest and returns once it answers over SSH; stop() ends qemu and removes
    the wire. A context manager; `inventory(path)` writes an ansible inventory of both machines."""

    def __init__(self, kernel=None, kvm=False):
        self.tier = fullkernel.probe(kernel, force_guest=True, kvm=kvm)
        self.run = None
        self.proc = None
        self.tap = None
        self.key = None
        self.boot_s = None

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self):
        if not self.tier.available:
            raise EnvironmentProblem(f"no guest machine: {self.tier.note}")
        if not os.access(SSHD, os.X_OK) or shutil.which("ssh") is None:
            raise EnvironmentProblem("no guest machine: it needs sshd and ssh (openssh-server, openssh-client; "
                                     "`sudo .venv/bin/fabriclab provision` installs them)")
        if _address_in_use(WIRE_HOST):
            raise LabError(f"the guest machine's wire address {WIRE_HOST} is already on an interface here "
                           f"(another guest machine? `fabriclab clean` removes a killed one's)")
        t0 = time.monotonic()
        self.run = RunState.create("guest-machine")
        try:
            self._keys()
            self._wire()
            self._boot()
            self._wait_ssh(t0)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self):
        """End qemu (its whole process group) and delete the wire; safe to call twice."""
        if self.proc is not None:
            procs.end_group(self.proc)
            self.proc = None
        if self.tap is not None:
            subprocess.run(["ip", "link", "del", self.tap], capture_output=True)
            self.tap = None
        if self.run is not None:
            self.run.remove()
            self.run = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # -- what the others use --------------------------------------------------------------------
    def ssh(self, command, timeout=120):
        """Run a shell command in the guest as root; CompletedProcess (text)."""
        return subprocess.run(["ssh", *ssh_options(self.run.dir, self.key), f"root@{WIRE_GUEST}", command],
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def inventory_text(self, project_dir, venv_dir):
        """An ansible inventory of this machine and the guest (group `lab`)."""
        args = " ".join(shlex.quote(o) for o in ssh_options(self.run.dir, self.key)[2:])
        return (
            "# written by fabriclab's guest machine: this machine and a full-kernel guest on a wire\n"
            "[lab]\n"
            f"here ansible_connection=local ansible_python_interpreter=/usr/bin/python3 "
            f"fabriclab_private_ip={WIRE_HOST}\n"
            f"guest ansible_host={WIRE_GUEST} ansible_user=root ansible_ssh_private_key_file={self.key} "
            f"ansible_ssh_common_args=\"{args}\" ansible_python_interpreter=/usr/bin/python3 "
            f"ansible_remote_tmp=/tmp/.ansible-tmp fabriclab_private_ip={WIRE_GUEST}\n"
            "[lab:vars]\n"
            f"project_dir={project_dir}\nvenv_dir={venv_dir}\n")

    def inventory(self, path, project_dir=None, venv_dir=None):
        project_dir = project_dir or os.getcwd()
        with open(path, "w") as f:
            f.write(self.inventory_text(project_dir, venv_dir or sys.prefix))
        return path

    # -- steps ----------------------------------------------------------------------------------
    def _keys(self):
        d, g = self.run.dir, self.run.dir / "guest"
        g.mkdir(mode=0o700)
        for path in (d / "id", g / "host_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"fabriclab-{self.run.id}",
                            "-f", str(path)], check=True, capture_output=True)
        self.key = str(d / "id")
        (g / "authorized_keys").write_text((d / "id.pub").read_text())
        os.chmod(g / "authorized_keys", 0o600)
        host_key = (g / "host_key.pub").read_text().split()
        (d / "known_hosts").write_text(f"{WIRE_GUEST} {host_key[0]} {host_key[1]}\n")
        # PAM, because the guest shares this machine's /etc/shadow, where root's password is
        # usually locked: without PAM sshd refuses a locked account even with a key.
        (g / "sshd_config").write_text(
            f"ListenAddress {WIRE_GUEST}\nHostKey {GUEST_DIR}/host_key\n"
            f"AuthorizedKeysFile {GUEST_DIR}/authorized_keys\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            f"UsePAM yes\nStrictModes no\nPidFile {GUEST_DIR}/sshd.pid\n")

    def _wire(self):
        tap = f"fabg-{self.run.id[-6:]}"
        group = self.run.data["link_group"]
        self.run.plan([], [tap])
        for argv in (["ip", "tuntap", "add", tap, "mode", "tap"],
                     ["ip", "link", "set", tap, "group", str(group)],
                     ["ip", "link", "set", tap, "mtu", str(WIRE_MTU)],
                     ["ip", "addr", "add", f"{WIRE_HOST}/{WIRE_PREFIX}", "dev", tap],
                     ["ip", "link", "set", tap, "up"]):
            proc = subprocess.run(argv, capture_output=True, text=True)
            if proc.returncode != 0:
                raise LabError(f"the guest machine's wire: `{' '.join(argv)}` failed: "
                               f"{(proc.stderr.strip() or 'no message')[:200]}")
            self.tap = tap

    def guest_script(self):
        return f"""#!/bin/sh
echo "{fullkernel.BOOTED} $(uname -r)"
for d in /etc/openvswitch /var/lib/openvswitch /run/openvswitch /var/log/openvswitch; do
    mkdir -p "$d" && mount -t tmpfs tmpfs "$d" || exit 91
done
modprobe -a {' '.join(fullkernel.MODULES)} || exit 92
{fullkernel.OVS_CTL} start --system-id=random >/dev/null || exit 93
dev=$(ip -o link | awk -F': ' '/{GUEST_MAC}/ {{print $2}}')
ip link set lo up && ip link set "$dev" mtu {WIRE_MTU} && ip addr add {WIRE_GUEST}/{WIRE_PREFIX} dev "$dev" \
    && ip link set "$dev" up || exit 95
mkdir -p /run/sshd
{SSHD} -f {GUEST_DIR}/sshd_config -E {GUEST_DIR}/sshd.log || exit 96
echo "{READY}"
while :; do sleep 3600; done
"""

    def _boot(self):
        script = self.run.path("guest") / "guest.sh"
        script.write_text(self.guest_script())
        os.chmod(script, 0o755)
        netdev = f"tap,id=wire,ifname={self.tap},script=no,downscript=no"
        in_guest = f"{GUEST_DIR}/guest.sh"
        argv = [*fullkernel.vng_argv(self.tier, in_guest, f"{GUEST_DIR}={self.run.dir / 'guest'}"),
                f"--qemu-opts=-netdev {netdev} -device virtio-net-pci,netdev=wire,mac={GUEST_MAC}"]
        env = dict(os.environ, PATH=os.pathsep.join([fullkernel.venv_bin(), os.environ.get("PATH", "")]))
        log = open(self.run.path("guest.log"), "wb")
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env, start_new_session=True)
        log.close()
        self.run.add_process(self.proc.pid, "guest-vng", in_guest)
        deadline = time.monotonic() + BOOT_TIMEOUT_S
        recorded = False
        while time.monotonic() < deadline:
            if not recorded:
                for pid, _ in procs.with_argument_under(netdev):      # qemu: the wire is its own
                    self.run.add_process(pid, "guest-qemu", netdev)
                    recorded = True
            if self.proc.poll() is not None:
                why = SSH_SETUP_FAILURES.get(self.proc.returncode) or fullkernel.SETUP_FAILURES.get(
                    self.proc.returncode, f"exit {self.proc.returncode}")
                raise LabError(f"the guest machine ({self.tier.kernel}) stopped before it was ready: {why} "
                               f"({self._last_line()})")
            if READY in self.run.path("guest.log").read_text(errors="replace"):
                return
            time.sleep(0.5)
        raise LabError(f"the guest machine ({self.tier.kernel}) was not ready within {BOOT_TIMEOUT_S:.0f} s "
                       f"({self._last_line()})")

    def _wait_ssh(self, t0):
        deadline = time.monotonic() + SSH_TIMEOUT_S
        last = ""
        while time.monotonic() < deadline:
            try:
                proc = self.ssh("uname -r", timeout=60)
            except subprocess.TimeoutExpired:
                last = "ssh timed out"
                continue
            if proc.returncode == 0:
                self.boot_s = time.monotonic() - t0
                return
            last = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
            time.sleep(1)
        raise LabError(f"the guest machine booted but did not answer over SSH within {SSH_TIMEOUT_S:.0f} s: "
                       f"{last[:200]}")

    def _last_line(self):
        try:
            lines = [ln for ln in self.run.path("guest.log").read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return "no output"
        return lines[-1][:200] if lines else "no output"


def _address_in_use(address):
    out = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True).stdout
    return f" {address}/" in out
