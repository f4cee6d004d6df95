"""`fabriclab capture` on a running fabric, read by tools nobody on the team wrote: while the prompt
runs traffic and a verified ring AllReduce on tiny, a capture of a switch port and a host port
decodes in tshark (Debian's) as InfiniBand over UDP with no malformed packet or expert warning,
each frame on its port's interface, and every ICRC matches the one scapy computes; the prompt's
own `capture` runs beside it. Bad input is refused in one line, and a killed capture leaves no
tcpdump behind."""

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest
from scapy.contrib.roce import BTH
from scapy.utils import PcapNgReader

pytestmark = pytest.mark.lab

ROOT = pathlib.Path(__file__).resolve().parents[2]
FABRICLAB = [sys.executable, "-m", "fabriclab.cli.main"]
TSHARK = "/usr/bin/tshark"            # installed by the provisioning (playbooks/roles/packages)


def capture(*args, **kwargs):
    return subprocess.Popen(FABRICLAB + ["capture", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, stdin=subprocess.DEVNULL, cwd=ROOT, **kwargs)


def tcpdumps_on(port):
    return subprocess.run(["pgrep", "-f", f"tcpdump -i {port} "], capture_output=True).returncode == 0


def tshark(pcap, *args):
    out = subprocess.run([TSHARK, "-r", str(pcap), *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-800:]
    return out.stdout


def test_a_capture_of_a_running_fabric_reads_in_tshark_as_rocev2(tmp_path):
    script = tmp_path / "script"
    # traffic first: the capture attaches while it runs, before the collective starts
    at_prompt = tmp_path / "prompt.pcapng"
    script.write_text(f"capture l2-eth2 l2-eth3 -w {at_prompt} --filter 'udp port 4791'\ntraffic 8 0.5\n"
                      "collective --sizes 256K --iterations 2 --verify\ncapture\ncapture stop\n")
    lab = subprocess.Popen(FABRICLAB + ["up", "tiny", "--script", str(script)], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, cwd=ROOT, stdin=subprocess.DEVNULL)
    pcap = tmp_path / "roce.pcapng"
    try:
        deadline = time.monotonic() + 120
        while not os.path.exists("/sys/class/net/l1-eth3") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert lab.poll() is None, lab.stdout.read()
        job = capture("l1-eth2", "h1-n0", "-w", pcap, "--filter", "udp port 4791")
        started = job.stderr.readline()
        assert started.startswith("capturing l1-eth2, h1-n0 of run "), started + job.stderr.read()

        # refused in one line, nothing started: a port the run does not have, a filter that does not compile
        for args, said in ((["l9-eth9", "-w", tmp_path / "x"], "has no port 'l9-eth9'"),
                           (["l1-eth3", "-w", tmp_path / "y", "--filter", "udp port"], "tcpdump on l1-eth3 refused")):
            bad = capture(*args)
            err = bad.communicate(timeout=60)[1]
            assert bad.returncode == 2 and said in err and len(err.strip().splitlines()) == 1, err
            assert not args[2].exists()                     # no empty file left either
        assert not tcpdumps_on("l1-eth3")

        # a killed capture: its tcpdump dies with it (PR_SET_PDEATHSIG)
        killed = capture("l1-eth3", "-w", tmp_path / "killed.pcapng")
        assert killed.stderr.readline().startswith("capturing l1-eth3"), killed.stderr.read()
        assert tcpdumps_on("l1-eth3")
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        deadline = time.monotonic() + 5
        while tcpdumps_on("l1-eth3") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not tcpdumps_on("l1-eth3")

        out, _ = lab.communicate(timeout=300)
        assert lab.returncode == 0, out[-2000:]
        summary = job.communicate(timeout=30)[1]
        assert job.returncode == 0 and "captured " in summary, summary
    finally:
        for proc in (lab, job) if "job" in locals() else (lab,):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert " ok" in out.split("256K", 1)[1].splitlines()[0], out[-1500:]      # the ring verified
    # the prompt's own capture, in the background from the start, ended by `capture stop`
    assert f"capturing l2-eth2, l2-eth3 to {at_prompt}" in out and "stopped: capture stop" in out, out[-1500:]
    spine_side = tshark(at_prompt, "-T", "fields", "-e", "frame.interface_name", "-e", "frame.protocols").splitlines()
    assert len(spine_side) > 100 and {line.split("\t")[0] for line in spine_side} <= {"l2-eth2", "l2-eth3"}
    assert all(line.endswith("infiniband") or ":infiniband" in line for line in spine_side), spine_side[:3]

    frames = tshark(pcap, "-T", "fields", "-e", "frame.interface_name", "-e", "frame.protocols").splitlines()
    assert len(frames) > 500, len(frames)
    assert {line.split("\t")[0] for line in frames} == {"l1-eth2", "h1-n0"}
    assert {line.split("\t")[1].split(":infiniband")[0] for line in frames} == {"eth:ethertype:ip:udp"}, frames[:3]
    assert tshark(pcap, "-Y", "_ws.malformed || _ws.expert") == ""
    icrcs = [(bytes(p[BTH])[-4:], p[BTH].compute_icrc(None)) for p in PcapNgReader(str(pcap)) if BTH in p]
    assert len(icrcs) == len(frames) and all(wire == mine for wire, mine in icrcs), icrcs[:3]
