"""CPU load between two samples, from crafted counters and from this machine's /proc.

`between` is plain arithmetic on jiffies and clock ticks, so it is checked with made-up samples;
`sample` reads /proc and is only checked for plausibility (it must work without root).
"""

import os
import subprocess
import sys
import time

import pytest

from fabriclab.measure import cpuload
from fabriclab.measure.cpuload import SATURATED, between, valid

TCK = os.sysconf("SC_CLK_TCK")


def cpu(time, total, idle, ovs):
    return {"time": time, "total": total, "idle": idle, "ovs": ovs}


# -- between --------------------------------------------------------------------------------------

def test_machine_share_is_busy_jiffies_over_all_jiffies():
    load = between(cpu(10.0, 1000, 600, None), cpu(12.0, 1400, 700, None))
    assert load["machine"] == 0.75          # 400 jiffies passed, 100 of them idle


def test_ovs_share_is_one_core_from_ticks_over_seconds():
    # 0.5 of one core for 2 s is TCK ticks of utime + stime
    load = between(cpu(10.0, 1000, 600, 50), cpu(12.0, 1400, 700, 50 + TCK))
    assert load["ovs_forwarding"] == 0.5


def test_ovs_share_uses_the_clock_tick_rate_of_the_system(monkeypatch):
    real = os.sysconf
    monkeypatch.setattr(cpuload.os, "sysconf",
                        lambda name: 250 if name == "SC_CLK_TCK" else real(name))
    load = between(cpu(0.0, 0, 0, 0), cpu(4.0, 100, 100, 900))
    assert load["ovs_forwarding"] == 0.9     # 900 ticks / 250 Hz / 4 s


def test_a_saturated_forwarding_thread_while_the_machine_idles():
    # the case cpuload exists for: one core flat out, the rest idle
    load = between(cpu(0.0, 0, 0, 0), cpu(1.0, 8 * TCK, 7 * TCK, TCK))
    assert load == {"machine": 0.125, "ovs_forwarding": 1.0}
    assert valid(load) is False


@pytest.mark.parametrize("a_ovs, b_ovs", [(None, 100), (100, None), (None, None)])
def test_ovs_share_is_none_when_the_thread_was_not_read(a_ovs, b_ovs):
    load = between(cpu(0.0, 100, 50, a_ovs), cpu(1.0, 200, 100, b_ovs))
    assert load == {"machine": 0.5, "ovs_forwarding": None}


def test_no_time_passed_gives_none_not_a_division_error():
    load = between(cpu(5.0, 100, 50, 10), cpu(5.0, 100, 50, 10))
    assert load == {"machine": None, "ovs_forwarding": None}


# -- valid ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("load, expected", [
    ({"machine": 0.5, "ovs_forwarding": 0.3}, True),
    ({"machine": 0.899, "ovs_forwarding": 0.899}, True),
    ({"machine": None, "ovs_forwarding": None}, True),
    ({"machine": 0.4, "ovs_forwarding": None}, True),
    ({"machine": SATURATED, "ovs_forwarding": 0.1}, False),
    ({"machine": 0.1, "ovs_forwarding": 0.90}, False),
    ({"machine": None, "ovs_forwarding": 1.2}, False),
    ({"machine": 0.95, "ovs_forwarding": None}, False),
])
def test_valid(load, expected):
    assert valid(load) is expected


def test_saturation_threshold():
    assert SATURATED == 0.90


# -- this machine ---------------------------------------------------------------------------------

def test_sample_reads_plausible_numbers():
    a = cpuload.sample()
    assert set(a) == {"time", "total", "idle", "ovs"}
    assert abs(a["time"] - time.monotonic()) < 1.0
    assert 0 <= a["idle"] <= a["total"] and a["total"] > 0
    assert a["ovs"] is None or (isinstance(a["ovs"], int) and a["ovs"] >= 0)
    time.sleep(0.2)
    b = cpuload.sample()
    assert b["time"] > a["time"] and b["total"] >= a["total"] and b["idle"] >= a["idle"]
    load = between(a, b)
    assert load["machine"] is None or 0.0 <= load["machine"] <= 1.0
    # a thread cannot use more than one core
    assert load["ovs_forwarding"] is None or 0.0 <= load["ovs_forwarding"] <= 1.05


def test_cpu_meter_reads_the_load_since_it_started():
    meter = cpuload.CpuMeter()
    time.sleep(0.1)
    load = meter.read()
    assert set(load) == {"machine", "ovs_forwarding"}
    assert load["machine"] is None or 0.0 <= load["machine"] <= 1.0


def test_missing_pidfile_means_ovs_unknown(tmp_path, monkeypatch):
    monkeypatch.setattr(cpuload, "OVS_PIDFILE", tmp_path / "absent.pid")
    assert cpuload.sample()["ovs"] is None
    (tmp_path / "garbage.pid").write_text("not a pid\n")
    monkeypatch.setattr(cpuload, "OVS_PIDFILE", tmp_path / "garbage.pid")
    assert cpuload.sample()["ovs"] is None


CHILD = r"""
import os, sys, time
with open(f"/proc/self/task/{os.getpid()}/comm", "w") as f:
    f.write("x) 1 2 3 4 5 6")          # a name with ')' and spaces, as /proc/<pid>/stat shows it
end = time.process_time() + 0.15
while time.process_time() < end:
    pass
t = os.times()
print(round((t.user + t.system) * os.sysconf("SC_CLK_TCK")), flush=True)
sys.stdin.read()
"""


def test_ovs_ticks_are_utime_plus_stime_of_the_main_thread(tmp_path, monkeypatch):
    """The pidfile names a process whose name would trip a naive split of /proc/<pid>/stat."""
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        expected = int(child.stdout.readline())
        pidfile = tmp_path / "ovs-vswitchd.pid"
        pidfile.write_text(f"{child.pid}\n")
        monkeypatch.setattr(cpuload, "OVS_PIDFILE", pidfile)
        ticks = cpuload.sample()["ovs"]
    finally:
        child.stdin.close()
        child.wait(timeout=10)
    assert expected >= 0.15 * TCK - 1
    assert abs(ticks - expected) <= 2
