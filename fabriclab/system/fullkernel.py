"""The full-kernel test tier: run a pytest selection on a kernel that has every mechanism the lab
can use (the kernel OVS datapath, sch_red, sch_netem, rdma_rxe).

The lab's users run on such a kernel (the Vagrant VM); CI machines and this project's build machines
run a minimal one. Where the running kernel is complete, the tier runs pytest here ("native").
Otherwise it boots a distribution kernel from /boot under qemu with virtme-ng, sharing this
machine's root filesystem read-only ("guest"): the guest gets tmpfs for Open vSwitch's state (9p
refuses sockets), starts OVS, and runs pytest in the same checkout with the same venv. Either way the
tests see FABRICLAB_TIER=full, which makes the `fullkernel` tests require the full mechanisms.

Every run is bounded: a guest that does not boot, or a run that outlives its time, is killed and
reported as one line. The pytest exit code comes back through a small read-write folder.
"""

from __future__ import annotations

import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

from fabriclab.system import patience, procs
from fabriclab.errors import EnvironmentProblem, LabError, Terminated

TIER_ENV = "FABRICLAB_TIER"
MODULES = ("openvswitch", "sch_red", "sch_netem", "rdma_rxe")
OVS_CTL = "/usr/share/openvswitch/scripts/ovs-ctl"
BOOTED = "fabriclab-guest: booted"
DEFAULT_TIMEOUT_S = 1500.0
BOOT_TIMEOUT_S = 240.0          # software emulation boots in about 25 s here
# One vCPU: under software emulation qemu's main loop takes most of a core whatever the guest
# does, so a second vCPU bought nothing (2026-11-29: the tier in 164 s with 1 against 165-200 s
# with 2; the two-kernel module 284 s against 315 s) and took the core this machine's side of a
# two-kernel test runs on.
GUEST_CPUS = 1
GUEST_MEMORY = "3G"
GUEST_PATIENCE = 8              # FABRICLAB_PATIENCE in a software-emulated guest (see patience.py)
INSTALL_HINT = "run `sudo ./lab.sh bootstrap` (it installs linux-image-amd64, qemu-system-x86, virtme-ng)"


@dataclass(frozen=True)
class Tier:
    """Whether the tier can run here, and how: "native" (this kernel) or "guest" (a booted one)."""

    available: bool
    how: str = ""
    kernel: str = ""            # the kernel release that will run the tests
    image: str = ""             # its vmlinuz (guest only)
    accel: str = ""             # "kvm" or "tcg" (software emulation), guest only
    note: str = ""


# ---------------------------------------------------------------------------
# Finding a kernel and the tools.


def missing_modules(release, modules_root="/lib/modules", wanted=MODULES):
    """The modules in `wanted` that kernel `release` neither builds in nor ships as a module."""
    base = os.path.join(modules_root, release)
    names = set()
    for listing in ("modules.dep", "modules.builtin"):
        try:
            with open(os.path.join(base, listing)) as f:
                for line in f:
                    path = line.split(":", 1)[0].strip()
                    names.add(re.sub(r"\.ko(\.\w+)?$", "", os.path.basename(path)).replace("-", "_"))
        except OSError:
            continue
    return [m for m in wanted if m not in names]


def _version_key(release):
    return [int(x) if x.isdigit() else x for x in re.split(r"[.\-+~]", release)]


def guest_kernels(boot="/boot", modules_root="/lib/modules"):
    """(release, vmlinuz path) of every kernel in /boot with all the tier's modules, newest first."""
    found = []
    try:
        entries = os.listdir(boot)
    except OSError:
        return []
    for name in entries:
        if not name.startswith("vmlinuz-"):
            continue
        release = name[len("vmlinuz-"):]
        if not missing_modules(release, modules_root):
            found.append((release, os.path.join(boot, name)))
    return sorted(found, key=lambda rv: _version_key(rv[0]), reverse=True)


def venv_bin():
    return os.path.dirname(sys.executable)


def find_vng():
    """virtme-ng's `vng`, preferring the lab's venv (it calls `virtme-run` from the same folder)."""
    return shutil.which("vng", path=os.pathsep.join([venv_bin(), os.environ.get("PATH", "")]))


def probe(kernel=None, force_guest=False, running=None, modules_root="/lib/modules", boot="/boot",
          kvm=False):
    """How the tier would run on this machine (no VM is started). The guest uses software emulation
    unless `kvm`: a /dev/kvm that opens is no promise (nested under another hypervisor, qemu's KVM
    guest failed on an MSR here, then hung with the MSR masked)."""
    running = running or platform.release()
    if not force_guest and kernel is None and not missing_modules(running, modules_root):
        return Tier(True, "native", running, note=f"the running kernel {running} has {', '.join(MODULES)}")
    if kernel is not None:
        image = os.path.abspath(kernel)
        if not os.path.isfile(image):
            return Tier(False, note=f"no kernel image {kernel}")
        release = os.path.basename(image).removeprefix("vmlinuz-")
        lacking = missing_modules(release, modules_root)
        if lacking:
            return Tier(False, note=f"{image}: no modules for {', '.join(lacking)} under {modules_root}/{release}")
        kernels = [(release, image)]
    else:
        kernels = guest_kernels(boot, modules_root)
    lacking = missing_modules(running, modules_root)
    missing = []
    if not kernels:
        missing.append(f"a kernel in {boot} with {', '.join(MODULES)}")
    if find_vng() is None:
        missing.append("virtme-ng (vng)")
    if shutil.which("qemu-system-x86_64") is None:
        missing.append("qemu-system-x86_64")
    if shutil.which("busybox") is None:
        missing.append("busybox (virtme-ng's initramfs)")
    why = f"the running kernel lacks {', '.join(lacking)}" if lacking else "a guest was asked for"
    if missing:
        return Tier(False, note=f"{why}, and there is no {', '.join(missing)}: {INSTALL_HINT}")
    release, image = kernels[0]
    if kvm and not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return Tier(False, note="KVM was asked for and /dev/kvm is not usable")
    accel = "kvm" if kvm else "tcg"
    how = "KVM" if accel == "kvm" else "software emulation, slow"
    return Tier(True, "guest", release, image, accel, f"{why}: boots {image} under qemu ({how})")


# ---------------------------------------------------------------------------
# Running pytest on the tier.


# What a guest's Python processes import from the checkout: the guest sees it read-only over 9p,
# so without bytecode each process compiles every module it imports, under emulation (the lab's own
# modules took 17 s to import there, 13.7 s from bytecode; a `fabriclab` command 27 s before its
# first line). Compiled here, once, before a guest boots.
PACKAGES = ("fabriclab", "topologies", "apps", "traffic", "tests")
# matplotlib builds a font cache wherever it may write, and the guest's home is read-only: without
# a writable config folder every process builds it anew
GUEST_MPLCONFIGDIR = "/tmp/fabriclab-matplotlib"


def package_root():
    """The folder holding the `fabriclab` package (and, in a checkout, topologies/, apps/ ...)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def precompile(repo=None, python=sys.executable):
    """Bytecode for the packages guests import (PACKAGES of `repo`, by default where fabriclab is
    imported from). Quiet; cheap when nothing changed (compileall skips what is up to date)."""
    repo = repo or package_root()
    paths = [os.path.join(repo, name) for name in PACKAGES if os.path.isdir(os.path.join(repo, name))]
    if paths:
        subprocess.run([python, "-m", "compileall", "-q", "-j", "0", *paths], stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def guest_script(python, repo, pytest_args, outdir, patience_factor=GUEST_PATIENCE):
    """The shell script the guest runs: writable OVS state, the modules, OVS, then pytest."""
    q = shlex.quote
    args = " ".join(q(a) for a in pytest_args)
    return f"""#!/bin/sh
echo "{BOOTED} $(uname -r)"
for d in /etc/openvswitch /var/lib/openvswitch /run/openvswitch /var/log/openvswitch; do
    mkdir -p "$d" && mount -t tmpfs tmpfs "$d" || exit 91
done
modprobe -a {' '.join(MODULES)} || exit 92
{OVS_CTL} start --system-id=random >/dev/null || exit 93
cd {q(repo)} || exit 94
export {TIER_ENV}=full PYTHONDONTWRITEBYTECODE=1 {patience.ENV}={patience_factor} MPLCONFIGDIR={GUEST_MPLCONFIGDIR}
mkdir -p {GUEST_MPLCONFIGDIR}
{q(python)} -m pytest -p no:cacheprovider {args}
echo $? > {q(os.path.join(outdir, 'exit'))}
"""


SETUP_FAILURES = {91: "could not mount tmpfs for Open vSwitch", 92: "could not load the kernel modules",
                  93: "Open vSwitch did not start", 94: "the checkout is not visible in the guest"}


def vng_argv(tier, script, outdir, cpus=GUEST_CPUS, memory=GUEST_MEMORY):
    argv = [find_vng() or "vng", "--run", tier.image, "--force-9p", "--cpus", str(cpus),
            "--memory", memory, f"--rwdir={outdir}", "--exec", script]
    if tier.accel != "kvm":
        argv.insert(3, "--disable-kvm")
    return argv


@dataclass
class TierRun:
    exit_code: int
    how: str
    kernel: str
    boot_s: float | None        # from start until the guest printed its first line
    total_s: float


MARK = "fullkernel"
DEFAULT_PATHS = ("tests/lab",)


def default_selection(repo=None, python=sys.executable):
    """The tier's default pytest arguments: the `fullkernel` tests of tests/lab, with the folder
    narrowed to the files that hold them. Collected here (3 s), not in the guest: under emulation
    collecting every lab module took about 60 s of a 255 s tier (2026-11-28). The marker stays in
    the arguments, so the guest runs exactly what it would have; if collecting here fails, the
    folder itself is passed."""
    repo = os.path.abspath(repo or os.getcwd())
    proc = subprocess.run([python, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "-m", MARK, *DEFAULT_PATHS], cwd=repo, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL)
    files = sorted({line.split("::", 1)[0] for line in proc.stdout.splitlines() if "::" in line})
    if proc.returncode != 0 or not files:
        files = list(DEFAULT_PATHS)
    return ["-m", MARK, *files, "-rfEs"]


def run_tests(pytest_args, timeout_s=DEFAULT_TIMEOUT_S, kernel=None, force_guest=False, repo=None,
              out=sys.stdout, kvm=False, registry=None):
    """Run pytest with `pytest_args` on the full-kernel tier; returns a TierRun with pytest's exit
    code. Raises EnvironmentProblem when the tier is unavailable and LabError when the guest does not
    boot or the run outlives `timeout_s` (Terminated on SIGTERM, the guest stopped first).

    `registry()`, where given, makes the run record a guest's processes and the tier's folder go
    in (an object with add_process(pid, role, match), add_folder(path) and remove()), so that
    `clean` stops and deletes what a SIGKILL left; the record is removed when the guest has
    stopped."""
    if not timeout_s > 0:
        raise LabError(f"--timeout must be > 0 seconds, got {timeout_s}")
    tier = probe(kernel, force_guest, kvm=kvm)
    if not tier.available:
        raise EnvironmentProblem(f"the full-kernel tier is not available: {tier.note}")
    repo = os.path.abspath(repo or os.getcwd())
    print(f"full-kernel tier: {tier.note}", file=out, flush=True)
    if tier.how == "native":
        env = dict(os.environ, **{TIER_ENV: "full"})
        argv = [sys.executable, "-m", "pytest", *pytest_args]
        code, boot_s, total_s, _ = _bounded(argv, timeout_s, None, out, env=env, cwd=repo)
        return TierRun(code, "native", tier.kernel, None, total_s)
    precompile(repo)
    with tempfile.TemporaryDirectory(prefix="fabriclab-tier-") as outdir:
        script = os.path.join(outdir, "guest.sh")
        with open(script, "w") as f:
            f.write(guest_script(sys.executable, repo, pytest_args, outdir,
                                 1 if tier.accel == "kvm" else GUEST_PATIENCE))
        os.chmod(script, 0o755)
        env = dict(os.environ, PATH=os.pathsep.join([venv_bin(), os.environ.get("PATH", "")]))
        run = registry() if registry is not None else None
        if run is not None:
            run.add_folder(outdir)              # a SIGKILL leaves it: `clean` knows it by its mark
        try:
            # vng, virtme-run and qemu all carry the tier's own folder in an argument
            record = (lambda pid, arg: run.add_process(pid, "tier-guest", arg)) if run is not None else None
            code, boot_s, total_s, tail = _bounded(vng_argv(tier, script, outdir), timeout_s, BOOTED, out,
                                                   env=env, cwd=repo, tag=outdir, on_process=record)
        finally:
            if run is not None:
                run.remove()
        if boot_s is None:
            raise LabError(f"the full-kernel guest ({tier.kernel}) did not boot: "
                           f"{tail or f'no output, exit {code}'}")
        try:
            with open(os.path.join(outdir, "exit")) as f:
                pytest_code = int(f.read().strip())
        except (OSError, ValueError):
            why = SETUP_FAILURES.get(code, f"it ended with exit {code} before pytest reported")
            raise LabError(f"the full-kernel guest ({tier.kernel}) gave no test result: {why}"
                           + (f" (last output: {tail})" if tail else "")) from None
        return TierRun(pytest_code, "guest", tier.kernel, boot_s, total_s)


def _bounded(argv, timeout_s, marker, out, env, cwd, boot_timeout_s=BOOT_TIMEOUT_S, tag=None, on_process=None):
    """Run argv in its own process group, echoing its output to `out`; kill the group past timeout_s
    (or past boot_timeout_s without `marker`), on Ctrl-C and on SIGTERM (raised as Terminated: the
    default would end this process and leave the group running). Returns (exit code, seconds to
    marker or None, total seconds, last non-empty output line).

    `on_process(pid, argument)` is told of each process of the group's session with `tag` in an
    argument as it appears, until a qemu has been."""
    start = time.monotonic()
    previous = (signal.signal(signal.SIGTERM, _raise_terminated)
                if threading.current_thread() is threading.main_thread() else None)
    try:
        return _supervise(argv, timeout_s, marker, out, env, cwd, boot_timeout_s, tag, on_process, start)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _raise_terminated(signum, frame):
    raise Terminated("terminated by SIGTERM; the full-kernel guest stopped")


def _supervise(argv, timeout_s, marker, out, env, cwd, boot_timeout_s, tag, on_process, start):
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=env, cwd=cwd, start_new_session=True)
    seen = {"marker": None, "tail": "", "recorded": set(), "qemu": on_process is None}

    def pump():
        for raw in proc.stdout:
            line = raw.decode(errors="replace").rstrip("\r\n")
            if marker and seen["marker"] is None and marker in line:
                seen["marker"] = time.monotonic() - start
            if line.strip():
                seen["tail"] = line.strip()[-300:]
            print(line, file=out, flush=True)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        while proc.poll() is None:
            if not seen["qemu"]:
                _record_session(proc.pid, tag, on_process, seen)
            elapsed = time.monotonic() - start
            if elapsed > timeout_s:
                procs.end_group(proc)
                raise LabError(f"the full-kernel run outlived its {timeout_s:.0f} s limit and was stopped")
            if marker and seen["marker"] is None and elapsed > min(boot_timeout_s, timeout_s):
                procs.end_group(proc)
                raise LabError(f"the full-kernel guest did not boot within {min(boot_timeout_s, timeout_s):.0f} s"
                               + (f" (last output: {seen['tail']})" if seen["tail"] else ""))
            time.sleep(0.2)
    except BaseException:
        procs.end_group(proc)          # qemu and its helpers share the group vng started in
        raise
    reader.join(timeout=5)
    return proc.returncode, seen["marker"], time.monotonic() - start, seen["tail"]


def _record_session(sid, tag, on_process, seen):
    # By (pid, argument): a child caught between fork and exec still has its parent's arguments,
    # and is recorded again once it runs its own (the stale record matches nothing).
    for pid, arg in procs.in_session_with(sid, tag):
        if (pid, arg) not in seen["recorded"]:
            seen["recorded"].add((pid, arg))
            on_process(pid, arg)
            seen["qemu"] = seen["qemu"] or procs.runs_qemu(pid)


# ---------------------------------------------------------------------------
# CLI: `fabriclab fullkernel status|test`.
