"""More lab machines on this one: the full-kernel tier's guest (a distribution kernel under qemu,
sharing this machine's files) booted as machines of their own, reachable over SSH, for what spreads
work over machines (`sweep --inventory`, `doctor --inventory`, `clean --inventory`, a fabric split
over machines) and for tests of it with separate kernels (issue 21).

The guests and this machine share one virtual wire: a Linux bridge here (WIRE_HOST) with a tap per
guest, and a virtio NIC in each guest (WIRE_HOST + 1, + 2, ...: `guest_address`), so guests reach
each other as well as this machine. Each guest mounts writable state for Open vSwitch, loads the
tier's modules, starts OVS and an sshd that listens on the wire only, with a host key made for it
and an authorized key made for this run (nothing of this machine's SSH set-up is read or changed).
The inventory it writes names this machine (`here`, a local connection) and each guest (`guest`,
`guest2`, ...: over the wire, host keys pinned in the run's known_hosts).

Everything it creates carries the lab's marks, so `fabriclab clean` removes what a killed one left:
the bridge and taps are in the run's interface group, and each qemu and virtme-ng is recorded with
an argument of its own (its tap's netdev, the guest script's path in that guest).
"""

from __future__ import annotations

import ipaddress
import os
import shlex
import shutil
import subprocess
import sys
import time
import dataclasses
from dataclasses import dataclass

from fabriclab.errors import EnvironmentProblem, LabError
from fabriclab.lab.runstate import RunState
from fabriclab.system import fullkernel, patience, procs

WIRE_HOST, WIRE_PREFIX = "172.31.253.1", 28
MAX_GUESTS = 4          # each is a 2-CPU, 3 GiB qemu: four is already more than a 2-core machine runs well
# Jumbo frames on the wire: a fabric cable between the machines is a VXLAN tunnel over it, and
# carries the fabric's 9000-byte MTU only if the wire takes that plus the tunnel's 50 bytes.
WIRE_MTU = 9216
READY = "fabriclab-guest-machine: ready"
BOOT_TIMEOUT_S = 240.0
SSH_TIMEOUT_S = 180.0
SSHD = "/usr/sbin/sshd"
SSH_SETUP_FAILURES = {95: "could not bring the wire up", 96: "sshd did not start"}
# Where a guest sees its own files (its folder in the run, its one writable folder of this
# machine's): outside the lab's run root, so a `clean` in the guest never finds this machine's
# run records and takes them for its own.
GUEST_DIR = "/run/fabriclab-guest"
# root's home in a guest: a machine's own, empty, not this machine's /root. A session over SSH runs
# its shell's rc files from the home (Debian's bash reads ~/.bashrc for `ssh HOST CMD`), and this
# machine's may do anything: a pyenv set-up there took 20 s of every SSH command under emulation
# (a doctor over the inventory 171 s, 2026-11-28).
GUEST_HOME = "/tmp/fabriclab-home"


def guest_address(index):
    """The wire address of guest `index` (1, 2, ...): the addresses after this machine's."""
    return str(ipaddress.ip_address(WIRE_HOST) + index)


def guest_name(index):
    """The inventory's name for guest `index`: `guest`, then `guest2`, `guest3`, ..."""
    return "guest" if index == 1 else f"guest{index}"


WIRE_GUEST = guest_address(1)


def check_count(count, what="guest machines"):
    if not (isinstance(count, int) and not isinstance(count, bool) and 1 <= count <= MAX_GUESTS):
        raise LabError(f"{what}: between 1 and {MAX_GUESTS}, got {str(count)[:20]}")


def ssh_options(run_dir, key):
    """ssh's options to reach a guest: the run's key, its host key pinned, never a prompt."""
    return ["-i", key, "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={run_dir}/known_hosts", "-o", "ConnectTimeout=20", "-o", "LogLevel=ERROR"]


@dataclass
class Guest:
    """One guest: its inventory name, wire address and NIC, and (once started) its tap and qemu."""
    index: int
    name: str
    address: str
    mac: str
    tap: str | None = None
    proc: subprocess.Popen | None = None
    qemu_recorded: bool = False
    recorded_pids: set = dataclasses.field(default_factory=set)   # with the netdev: virtme-run, then qemu

    @property
    def netdev(self):
        """qemu's -netdev for its tap: the argument qemu is recorded (and found by clean) with."""
        return f"tap,id=wire,ifname={self.tap},script=no,downscript=no"


class GuestMachine:
    """start() boots `count` guests and returns once each answers over SSH; stop() ends every qemu
    and removes the wire. A context manager; `inventory(path)` writes an ansible inventory of this
    machine and the guests. `ssh` without a name reaches the first guest."""

    def __init__(self, kernel=None, kvm=False, count=1):
        check_count(count)
        self.tier = fullkernel.probe(kernel, force_guest=True, kvm=kvm)
        self.guests = [Guest(i, guest_name(i), guest_address(i), f"52:54:00:fa:b1:{i + 1:02x}")
                       for i in range(1, count + 1)]
        self.run = None
        self.bridge = None
        self.key = None
        self.boot_s = None

    def guest(self, name):
        found = next((g for g in self.guests if g.name == name), None)
        if found is None:
            raise LabError(f"no guest machine named {name[:40]!r}")
        return found

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self):
        if not self.tier.available:
            raise EnvironmentProblem(f"no guest machine: {self.tier.note}")
        if not os.access(SSHD, os.X_OK) or shutil.which("ssh") is None:
            raise EnvironmentProblem("no guest machine: it needs sshd and ssh (openssh-server, openssh-client; "
                                     "`sudo .venv/bin/fabriclab provision` installs them)")
        if _address_in_use(WIRE_HOST):
            raise LabError(f"the guest machines' wire address {WIRE_HOST} is already on an interface here "
                           f"(another guest machine? `fabriclab clean` removes a killed one's)")
        t0 = time.monotonic()
        fullkernel.precompile()
        self.run = RunState.create("guest-machine")
        try:
            self._keys()
            self._wire()
            for guest in self.guests:           # all boot at once; each is waited for in turn
                self._boot(guest)
            for guest in self.guests:
                self._wait_ready(guest)
            for guest in self.guests:
                self._wait_ssh(guest)
            self.boot_s = time.monotonic() - t0
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self):
        """End each qemu (its whole process group) and delete the wire; safe to call twice."""
        for guest in self.guests:
            if guest.proc is not None:
                procs.end_group(guest.proc)
                guest.proc = None
        if self.bridge is not None:
            for name in [g.tap for g in self.guests if g.tap] + [self.bridge]:
                subprocess.run(["ip", "link", "del", name], capture_output=True)
            for guest in self.guests:
                guest.tap = None
            self.bridge = None
        if self.run is not None:
            self.run.remove()
            self.run = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # -- what the others use --------------------------------------------------------------------
    def ssh(self, command, timeout=120, name="guest"):
        """Run a shell command in a guest as root; CompletedProcess (text)."""
        return subprocess.run(["ssh", *ssh_options(self.run.dir, self.key), f"root@{self.guest(name).address}",
                               command], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def inventory_text(self, project_dir, venv_dir):
        """An ansible inventory of this machine and the guests (group `lab`)."""
        args = " ".join(shlex.quote(o) for o in ssh_options(self.run.dir, self.key)[2:])
        lines = ["# written by fabriclab's guest machines: this machine and full-kernel guests on a wire",
                 "[lab]",
                 f"here ansible_connection=local ansible_python_interpreter=/usr/bin/python3 "
                 f"fabriclab_private_ip={WIRE_HOST}"]
        lines += [f"{g.name} ansible_host={g.address} ansible_user=root ansible_ssh_private_key_file={self.key} "
                  f"ansible_ssh_common_args=\"{args}\" ansible_python_interpreter=/usr/bin/python3 "
                  f"ansible_remote_tmp=/tmp/.ansible-tmp fabriclab_private_ip={g.address}" for g in self.guests]
        lines += ["[lab:vars]", f"project_dir={project_dir}", f"venv_dir={venv_dir}"]
        return "\n".join(lines) + "\n"

    def inventory(self, path, project_dir=None, venv_dir=None):
        project_dir = project_dir or os.getcwd()
        with open(path, "w") as f:
            f.write(self.inventory_text(project_dir, venv_dir or sys.prefix))
        return path

    def patience(self):
        """FABRICLAB_PATIENCE for every session in a guest, as the full-kernel tier's: under software
        emulation a controller or an agent starts several times slower than here."""
        return fullkernel.GUEST_PATIENCE if self.tier.accel != "kvm" else 1

    # -- steps ----------------------------------------------------------------------------------
    def _keygen(self, path):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"fabriclab-{self.run.id}",
                        "-f", str(path)], check=True, capture_output=True)

    def _keys(self):
        d = self.run.dir
        self._keygen(d / "id")
        self.key = str(d / "id")
        known = []
        for guest in self.guests:
            g = d / guest.name
            g.mkdir(mode=0o700)
            self._keygen(g / "host_key")
            (g / "authorized_keys").write_text((d / "id.pub").read_text())
            os.chmod(g / "authorized_keys", 0o600)
            host_key = (g / "host_key.pub").read_text().split()
            known.append(f"{guest.address} {host_key[0]} {host_key[1]}\n")
            # PAM, because the guest shares this machine's /etc/shadow, where root's password is
            # usually locked: without PAM sshd refuses a locked account even with a key.
            (g / "sshd_config").write_text(
                f"ListenAddress {guest.address}\nHostKey {GUEST_DIR}/host_key\n"
                f"AuthorizedKeysFile {GUEST_DIR}/authorized_keys\n"
                "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
                f"UsePAM yes\nStrictModes no\nPidFile {GUEST_DIR}/sshd.pid\n"
                f"SetEnv MPLCONFIGDIR={fullkernel.GUEST_MPLCONFIGDIR} {patience.ENV}={self.patience()}\n")
        (d / "known_hosts").write_text("".join(known))

    def _wire(self):
        stem = f"fabg-{self.run.id[-6:]}"
        group = str(self.run.data["link_group"])
        taps = [f"{stem}-{g.index}" for g in self.guests]
        self.run.plan([], [stem, *taps])
        # The bridge skips the host's iptables (br_netfilter): a FORWARD policy of DROP, as
        # container engines set, would otherwise cut guest from guest.
        steps = [["ip", "link", "add", stem, "group", group, "mtu", str(WIRE_MTU), "type", "bridge",
                  "nf_call_iptables", "0", "nf_call_ip6tables", "0", "nf_call_arptables", "0"]]
        self.bridge = stem
        for tap in taps:
            steps += [["ip", "tuntap", "add", tap, "mode", "tap"],
                      ["ip", "link", "set", tap, "group", group, "mtu", str(WIRE_MTU), "master", stem, "up"]]
        steps += [["ip", "addr", "add", f"{WIRE_HOST}/{WIRE_PREFIX}", "dev", stem],
                  ["ip", "link", "set", stem, "up"]]
        for argv in steps:
            proc = subprocess.run(argv, capture_output=True, text=True)
            if proc.returncode != 0:
                raise LabError(f"the guest machines' wire: `{' '.join(argv)}` failed: "
                               f"{(proc.stderr.strip() or 'no message')[:200]}")
            if argv[:3] == ["ip", "tuntap", "add"]:
                self.guests[taps.index(argv[3])].tap = argv[3]

    def guest_script(self, guest):
        return f"""#!/bin/sh
echo "{fullkernel.BOOTED} $(uname -r)"
for d in /etc/openvswitch /var/lib/openvswitch /run/openvswitch /var/log/openvswitch; do
    mkdir -p "$d" && mount -t tmpfs tmpfs "$d" || exit 91
done
modprobe -a {' '.join(fullkernel.MODULES)} || exit 92
{fullkernel.OVS_CTL} start --system-id=random >/dev/null || exit 93
dev=$(ip -o link | awk -F': ' '/{guest.mac}/ {{print $2}}')
ip link set lo up && ip link set "$dev" mtu {WIRE_MTU} && ip addr add {guest.address}/{WIRE_PREFIX} dev "$dev" \
    && ip link set "$dev" up || exit 95
mkdir -p /run/sshd {fullkernel.GUEST_MPLCONFIGDIR} && install -d -m 700 {GUEST_HOME} || exit 96
sed -i 's#^\\(root:[^:]*:0:0:[^:]*:\\)[^:]*:#\\1{GUEST_HOME}:#' /etc/passwd || exit 96
{SSHD} -f {GUEST_DIR}/sshd_config -E {GUEST_DIR}/sshd.log || exit 96
echo "{READY}"
while :; do sleep 3600; done
"""

    def _log(self, guest):
        return self.run.path(f"{guest.name}.log")

    def _boot(self, guest):
        script = self.run.path(guest.name) / "guest.sh"
        script.write_text(self.guest_script(guest))
        os.chmod(script, 0o755)
        in_guest = f"{GUEST_DIR}/guest.sh"
        argv = [*fullkernel.vng_argv(self.tier, in_guest, f"{GUEST_DIR}={self.run.dir / guest.name}"),
                f"--qemu-opts=-netdev {guest.netdev} -device virtio-net-pci,netdev=wire,mac={guest.mac}"]
        env = dict(os.environ, PATH=os.pathsep.join([fullkernel.venv_bin(), os.environ.get("PATH", "")]))
        log = open(self._log(guest), "wb")
        guest.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      env=env, start_new_session=True)
        log.close()
        self.run.add_process(guest.proc.pid, "guest-vng", in_guest)

    def _record_qemus(self):
        """Record each guest's qemu once it runs (found by its tap's netdev, its own), every
        guest's on each look: a killed lab's `clean` then finds the others' while one boots.
        virtme-run carries the netdev too and starts qemu as its child: a look between the two
        finds only virtme-run, so the look goes on until qemu itself is recorded (CI, 2026-11-28:
        a killed guest machine's qemu outlived `clean` and took a core for the rest of the run)."""
        for guest in self.guests:
            if guest.qemu_recorded:
                continue
            for pid, _ in procs.with_argument_under(guest.netdev):
                if pid in guest.recorded_pids:
                    continue
                self.run.add_process(pid, "guest-qemu", guest.netdev)
                guest.recorded_pids.add(pid)
                guest.qemu_recorded = guest.qemu_recorded or procs.runs_qemu(pid)

    def _wait_ready(self, guest):
        deadline = time.monotonic() + BOOT_TIMEOUT_S
        while time.monotonic() < deadline:
            self._record_qemus()
            if guest.proc.poll() is not None:
                why = SSH_SETUP_FAILURES.get(guest.proc.returncode) or fullkernel.SETUP_FAILURES.get(
                    guest.proc.returncode, f"exit {guest.proc.returncode}")
                raise LabError(f"the guest machine {guest.name} ({self.tier.kernel}) stopped before it was "
                               f"ready: {why} ({self._last_line(guest)})")
            if READY in self._log(guest).read_text(errors="replace"):
                return
            time.sleep(0.5)
        raise LabError(f"the guest machine {guest.name} ({self.tier.kernel}) was not ready within "
                       f"{BOOT_TIMEOUT_S:.0f} s ({self._last_line(guest)})")

    def _wait_ssh(self, guest):
        deadline = time.monotonic() + SSH_TIMEOUT_S
        last = ""
        while time.monotonic() < deadline:
            try:
                proc = self.ssh("uname -r", timeout=60, name=guest.name)
            except subprocess.TimeoutExpired:
                last = "ssh timed out"
                continue
            if proc.returncode == 0:
                return
            last = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
            time.sleep(1)
        raise LabError(f"the guest machine {guest.name} booted but did not answer over SSH within "
                       f"{SSH_TIMEOUT_S:.0f} s: {last[:200]}")

    def _last_line(self, guest):
        try:
            lines = [ln for ln in self._log(guest).read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return "no output"
        return lines[-1][:200] if lines else "no output"


def _address_in_use(address):
    out = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True).stdout
    return f" {address}/" in out
