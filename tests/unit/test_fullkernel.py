"""The full-kernel tier's runner without booting a kernel: finding kernels and their modules, how
the tier would run, the guest's script, and the bounds on a run that hangs or never boots."""

import io
import os
import shutil
import signal
import threading
import time

import pytest

from fabriclab.system import fullkernel, procs
from fabriclab.errors import EnvironmentProblem, LabError, Terminated


def _kernel(root, release, modules, builtin=()):
    """A fake /boot + /lib/modules entry for `release` shipping `modules` (and `builtin`)."""
    boot, mods = root / "boot", root / "modules" / release
    boot.mkdir(exist_ok=True)
    mods.mkdir(parents=True)
    (boot / f"vmlinuz-{release}").write_bytes(b"\0")
    (mods / "modules.dep").write_text("".join(
        f"kernel/net/{m}/{m.replace('_', '-') if m == 'rdma_rxe' else m}.ko.xz: kernel/x.ko\n" for m in modules))
    (mods / "modules.builtin").write_text("".join(f"kernel/net/{m}.ko\n" for m in builtin))
    return str(boot), str(root / "modules")


def test_missing_modules_reads_modules_dep_and_builtin(tmp_path):
    _, mods = _kernel(tmp_path, "6.1.0-9-amd64", ["openvswitch", "rdma_rxe"], builtin=["sch_red"])
    assert fullkernel.missing_modules("6.1.0-9-amd64", mods) == ["sch_netem"]
    assert fullkernel.missing_modules("no-such", mods) == list(fullkernel.MODULES)


def test_guest_kernels_keeps_complete_ones_newest_first(tmp_path):
    boot, mods = _kernel(tmp_path, "6.1.0-9-amd64", fullkernel.MODULES)
    _kernel(tmp_path, "6.1.0-12-amd64", fullkernel.MODULES)
    _kernel(tmp_path, "6.9.0-1-cloud", ["openvswitch"])            # lacks the rest: not a candidate
    found = fullkernel.guest_kernels(boot, mods)
    assert [r for r, _ in found] == ["6.1.0-12-amd64", "6.1.0-9-amd64"]
    assert found[0][1] == os.path.join(boot, "vmlinuz-6.1.0-12-amd64")


def test_probe_runs_natively_on_a_complete_running_kernel(tmp_path):
    boot, mods = _kernel(tmp_path, "5.15.0-91-generic", fullkernel.MODULES)
    tier = fullkernel.probe(running="5.15.0-91-generic", modules_root=mods, boot=boot)
    assert tier.available and tier.how == "native" and tier.kernel == "5.15.0-91-generic"


def test_probe_boots_a_guest_when_the_running_kernel_is_minimal(tmp_path, monkeypatch):
    boot, mods = _kernel(tmp_path, "6.1.0-9-amd64", fullkernel.MODULES)
    monkeypatch.setattr(fullkernel, "find_vng", lambda: "/x/vng")
    monkeypatch.setattr(fullkernel.shutil, "which", lambda name, path=None: f"/usr/bin/{name}")
    tier = fullkernel.probe(running="6.18.44-min", modules_root=mods, boot=boot)
    assert tier.available and tier.how == "guest" and tier.accel == "tcg"
    assert tier.image == os.path.join(boot, "vmlinuz-6.1.0-9-amd64")
    assert "lacks openvswitch" in tier.note and "software emulation" in tier.note


def test_probe_names_what_is_missing(tmp_path, monkeypatch):
    boot, mods = _kernel(tmp_path, "6.1.0-9-amd64", ["openvswitch"])
    monkeypatch.setattr(fullkernel, "find_vng", lambda: None)
    monkeypatch.setattr(fullkernel.shutil, "which", lambda name, path=None: None)
    tier = fullkernel.probe(running="6.18.44-min", modules_root=mods, boot=boot)
    assert not tier.available
    for what in ("a kernel in", "virtme-ng", "qemu-system-x86_64", "busybox", "lab.sh bootstrap"):
        assert what in tier.note
    with pytest.raises(EnvironmentProblem, match="not available"):
        monkeypatch.setattr(fullkernel, "probe", lambda *a, **k: tier)
        fullkernel.run_tests(["-q"])


def test_probe_checks_an_explicit_kernel(tmp_path):
    boot, mods = _kernel(tmp_path, "6.1.0-9-amd64", ["openvswitch"])
    tier = fullkernel.probe(kernel=os.path.join(boot, "vmlinuz-6.1.0-9-amd64"), modules_root=mods, boot=boot)
    assert not tier.available and "sch_red" in tier.note
    assert "no kernel image" in fullkernel.probe(kernel=str(tmp_path / "nope")).note


def test_guest_script_sets_up_ovs_then_runs_pytest_with_the_tier_set():
    script = fullkernel.guest_script("/venv/bin/python", "/src/lab", ["-k", "red and not slow"], "/out")
    lines = script.splitlines()
    assert lines[1].startswith(f'echo "{fullkernel.BOOTED}')         # the host times the boot by it
    assert "mount -t tmpfs tmpfs" in script                              # 9p refuses OVS's sockets
    assert "modprobe -a openvswitch sch_red sch_netem rdma_rxe" in script
    order = [next(i for i, l in enumerate(lines) if key in l)
             for key in ("mount -t tmpfs", "modprobe", "ovs-ctl start", "-m pytest")]
    assert order == sorted(order)
    assert "FABRICLAB_TIER=full" in script and "FABRICLAB_PATIENCE=8" in script
    assert "-p no:cacheprovider -k 'red and not slow'" in script          # the checkout is read-only
    assert lines[-1] == "echo $? > /out/exit"


def test_vng_argv_shares_the_result_folder_and_disables_kvm_unless_asked():
    tcg = fullkernel.Tier(True, "guest", "6.1.0-9-amd64", "/boot/vmlinuz-6.1.0-9-amd64", "tcg")
    argv = fullkernel.vng_argv(tcg, "/out/guest.sh", "/out")
    assert argv[1:3] == ["--run", "/boot/vmlinuz-6.1.0-9-amd64"]
    assert "--disable-kvm" in argv and "--force-9p" in argv and "--rwdir=/out" in argv
    assert argv[-2:] == ["--exec", "/out/guest.sh"]
    kvm = fullkernel.Tier(True, "guest", "6.1.0-9-amd64", "/boot/vmlinuz-6.1.0-9-amd64", "kvm")
    assert "--disable-kvm" not in fullkernel.vng_argv(kvm, "/out/guest.sh", "/out")


def _group_gone(pidfile):
    pid = int(open(pidfile).read())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_a_guest_that_never_boots_is_stopped_with_its_last_words(tmp_path):
    """No boot marker within the boot bound: the whole process group is killed, one-line error."""
    pidfile = tmp_path / "child"
    argv = ["sh", "-c", f"echo 'qemu: could not load kernel'; sleep 60 & echo $! > {pidfile}; wait"]
    start = time.monotonic()
    with pytest.raises(LabError, match=r"did not boot within 1 s \(last output: qemu: could not load kernel\)"):
        fullkernel._bounded(argv, 30, fullkernel.BOOTED, io.StringIO(), dict(os.environ), str(tmp_path),
                            boot_timeout_s=1)
    assert time.monotonic() - start < 10
    assert _group_gone(pidfile), "the guest's processes outlived the run"


def test_a_run_past_its_limit_is_stopped(tmp_path):
    pidfile = tmp_path / "child"
    argv = ["sh", "-c", f"echo '{fullkernel.BOOTED} 6.1'; sleep 60 & echo $! > {pidfile}; wait"]
    out = io.StringIO()
    with pytest.raises(LabError, match="outlived its 2 s limit"):
        fullkernel._bounded(argv, 2, fullkernel.BOOTED, out, dict(os.environ), str(tmp_path))
    assert fullkernel.BOOTED in out.getvalue()
    assert _group_gone(pidfile)


def test_sigterm_stops_the_guests_group_and_is_raised_not_fatal(tmp_path):
    """`lab.sh test` ends a background tier with SIGTERM: by default that ended this process alone
    and left qemu running (2026-11-29)."""
    pidfile = tmp_path / "child"
    argv = ["sh", "-c", f"echo '{fullkernel.BOOTED} 6.1'; sleep 60 & echo $! > {pidfile}; wait"]
    before = signal.getsignal(signal.SIGTERM)
    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
    with pytest.raises(Terminated, match="SIGTERM"):
        fullkernel._bounded(argv, 30, fullkernel.BOOTED, io.StringIO(), dict(os.environ), str(tmp_path))
    assert _group_gone(pidfile)
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_guests_processes_are_recorded_by_its_folder_until_qemu_and_stop_by_that_record(tmp_path):
    """What a SIGKILLed tier leaves, its run record names: every process of the guest's session
    that carries the tier's folder, each by a whole argument, recorded until qemu itself is."""
    qemu = tmp_path / "qemu-system-x86_64"
    qemu.symlink_to(shutil.which("sleep"))
    # the subshell that becomes qemu runs as sh's fork for a second first, as a child caught
    # between fork and exec does (CI, 2026-11-29: its pid was taken for sh's and qemu never seen)
    argv = ["sh", "-c", f"echo '{fullkernel.BOOTED} 6.1'; (sleep 1; exec {qemu} 60) & wait"]
    records, ended = [], []
    runner = threading.Thread(target=lambda: ended.append(fullkernel._bounded(
        argv, 30, fullkernel.BOOTED, io.StringIO(), dict(os.environ), str(tmp_path),
        tag=str(tmp_path), on_process=lambda pid, arg: records.append({"pid": pid, "match": arg}))),
        daemon=True)
    runner.start()
    deadline = time.monotonic() + 10
    while not any(r["match"] == str(qemu) for r in records) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert {r["match"] for r in records} == {argv[2], str(qemu)}, records
    # the subshell was recorded as sh's fork, then again as qemu: the stale record matches nothing
    forked = [r["pid"] for r in records if r["match"] == argv[2]]
    assert len(forked) == 2 and any(r["pid"] in forked and r["match"] == str(qemu) for r in records), records
    assert len(procs.stop_recorded(records)) == 2
    runner.join(timeout=10)
    assert ended and ended[0][0] != 0


def test_bounded_returns_the_exit_code_and_the_boot_time(tmp_path):
    argv = ["sh", "-c", f"echo '{fullkernel.BOOTED} 6.1'; echo last; exit 3"]
    code, boot_s, total_s, tail = fullkernel._bounded(argv, 30, fullkernel.BOOTED, io.StringIO(),
                                                      dict(os.environ), str(tmp_path))
    assert code == 3 and boot_s is not None and boot_s <= total_s and tail == "last"


def test_timeout_must_be_positive():
    with pytest.raises(LabError, match="--timeout must be > 0"):
        fullkernel.run_tests(["-q"], timeout_s=0)


@pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None or fullkernel.find_vng() is None,
                    reason="needs qemu-system-x86_64 and virtme-ng (installed by `./lab.sh bootstrap`)")
def test_a_kernel_image_that_cannot_boot_is_a_clear_error(tmp_path, monkeypatch):
    """The real vng and qemu, given an image that is not a kernel: one line, no test result."""
    image = tmp_path / "vmlinuz-0.0.0-bogus"
    image.write_bytes(b"this is not a kernel" * 100)
    bogus = fullkernel.Tier(True, "guest", "0.0.0-bogus", str(image), "tcg", "test")
    monkeypatch.setattr(fullkernel, "probe", lambda *a, **k: bogus)
    with pytest.raises(LabError, match="full-kernel guest .*(did not boot|gave no test result)"):
        fullkernel.run_tests(["-q"], timeout_s=120, repo=str(tmp_path), out=io.StringIO())


def test_the_checkout_is_compiled_before_a_guest_imports_it(tmp_path):
    """A guest sees the checkout read-only and compiles whatever has no bytecode, under emulation,
    in every process: precompile writes it here, for the packages guests import, once."""
    pkg = tmp_path / "fabriclab" / "lab"
    pkg.mkdir(parents=True)
    (pkg / "m.py").write_text("X = 1\n")
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "e.py").write_text("Y = 2\n")
    fullkernel.precompile(str(tmp_path))
    assert list((pkg / "__pycache__").glob("m.*.pyc"))
    assert not (tmp_path / "examples" / "__pycache__").exists()           # not a package guests import
    script = fullkernel.guest_script("/v/bin/python", "/repo", ["-m", "fullkernel"], "/out")
    assert f"MPLCONFIGDIR={fullkernel.GUEST_MPLCONFIGDIR}" in script and f"mkdir -p {fullkernel.GUEST_MPLCONFIGDIR}" in script


def test_the_default_selection_names_only_the_files_holding_the_tiers_tests(tmp_path):
    """Collected here, so the guest collects three modules, not every lab module; the marker is
    kept, so the guest runs exactly the marked tests."""
    lab = tmp_path / "tests" / "lab"
    lab.mkdir(parents=True)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    fullkernel: the tier\n")
    (lab / "test_marked.py").write_text("import pytest\npytestmark = pytest.mark.fullkernel\n"
                                        "def test_a():\n    pass\n")
    (lab / "test_mixed.py").write_text("import pytest\n@pytest.mark.fullkernel\ndef test_b():\n    pass\n"
                                       "def test_c():\n    pass\n")
    (lab / "test_plain.py").write_text("def test_d():\n    pass\n")
    assert fullkernel.default_selection(tmp_path) == [
        "-m", "fullkernel", "tests/lab/test_marked.py", "tests/lab/test_mixed.py", "-rfEs"]
    # nothing marked (or a module that does not import): the folder, and the guest says what failed
    (lab / "test_marked.py").unlink()
    (lab / "test_mixed.py").write_text("import no_such_module_here\n")
    assert fullkernel.default_selection(tmp_path) == ["-m", "fullkernel", "tests/lab", "-rfEs"]
