"""The traffic agent on real sockets: two network namespaces joined by a veth pair.

The sender's packets are captured on the receiver's veth with tcpdump and decoded with scapy, so
these tests check what is really on the wire: RoCEv2 headers, destination QPs, source ports and
a valid ICRC, and that the receiver's counters agree with what was sent.
"""

import json
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import time

import pytest

from fabriclab.traffic import roce

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(os.geteuid() != 0,
                       reason="needs root for network namespaces (sudo ./lab.sh test)"),
]

AGENT = [sys.executable, "-m", "fabriclab.traffic.generator"]
ADDR_A, ADDR_B = "10.0.1.1", "10.0.1.2"
START_DELAY_S = 1.5


def _require(*binaries):
    missing = [name for name in binaries if shutil.which(name) is None]
    if missing:
        pytest.skip(f"missing {', '.join(missing)}: apt-get install iproute2 ethtool tcpdump")


def _run(argv):
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    return done.stdout


class VethPair:
    """Namespaces `a` (10.0.1.1 on vx0) and `b` (10.0.1.2 on vx1); every process started
    through `start` is killed at teardown if it is still running."""

    def __init__(self, tag):
        self.a = f"fltest-{tag}-a"
        self.b = f"fltest-{tag}-b"
        self.namespaces = []
        self.processes = []

    def setup(self):
        for ns in (self.a, self.b):
            _run(["ip", "netns", "add", ns])
            self.namespaces.append(ns)
        # Created inside the namespaces: no name can clash with the host's or another test's.
        _run(["ip", "-n", self.a, "link", "add", "vx0", "type", "veth",
              "peer", "name", "vx1", "netns", self.b])
        for ns, dev, addr in ((self.a, "vx0", ADDR_A), (self.b, "vx1", ADDR_B)):
            _run(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev])
            _run(["ip", "-n", ns, "link", "set", dev, "up"])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            _run(["ip", "netns", "exec", ns, "ethtool", "-K", dev, "tx", "off", "rx", "off"])

    def teardown(self):
        for proc in self.processes:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for ns in reversed(self.namespaces):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)

    def start(self, ns, argv, **kwargs):
        proc = subprocess.Popen(["ip", "netns", "exec", ns, *argv], **kwargs)
        self.processes.append(proc)
        return proc


@pytest.fixture
def veth_pair():
    _require("ip", "ethtool", "tcpdump")
    pair = VethPair(f"{os.getpid() % 100000}{secrets.token_hex(2)}")
    try:
        pair.setup()
        yield pair
    finally:
        pair.teardown()


def _flow(i, rate_mbps, sport=None):
    return {"id": f"f{i}", "src": ADDR_A, "dst": ADDR_B, "src_qpn": 0x100 + i,
            "dst_qpn": 0x200 + i, "sport": sport, "rate_mbps": rate_mbps}


def _agent(pair, ns, config, tmp_path, name):
    cfg = tmp_path / f"{name}.json"
    cfg.write_text(json.dumps(config))
    out = tmp_path / f"{name}.result.json"
    proc = pair.start(ns, [*AGENT, "--config", str(cfg), "--out", str(out)],
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, out


def _finish(proc, out, timeout):
    _, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"agent exited {proc.returncode}: {err.strip()}"
    return json.loads(out.read_text())


def _start_capture(pair, tmp_path, count):
    """tcpdump on b's veth, returning once it is capturing."""
    pcap = tmp_path / "b.pcap"
    proc = pair.start(pair.b, ["tcpdump", "-i", "vx1", "-n", "-U", "-c", str(count), "-w",
                               str(pcap), "udp", "dst", "port", str(roce.ROCEV2_UDP_PORT)],
                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    ready, _, _ = select.select([proc.stderr], [], [], 10)
    assert ready and "listening on" in proc.stderr.readline(), "tcpdump did not start"
    return proc, pcap


def _read_capture(proc, pcap):
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.terminate()
        proc.wait()
    from scapy.contrib.roce import BTH
    from scapy.layers.inet import IP, UDP
    from scapy.utils import rdpcap
    packets = []
    for frame in rdpcap(str(pcap)):
        ip = frame[IP]
        datagram = bytes(ip)
        assert UDP in ip and ip[UDP].dport == roce.ROCEV2_UDP_PORT
        assert BTH in ip, "scapy did not decode a BTH"
        packets.append((ip, datagram))
    return packets


def _run_pair(pair, tmp_path, flows, *, duration_s, capture=0, **extra):
    start_at = time.time() + START_DELAY_S
    common = {"start_at": start_at, "duration_s": duration_s, "linger_s": 0.5,
              "payload_bytes": 1024, "message_bytes": 4096, **extra}
    cap = _start_capture(pair, tmp_path, capture) if capture else None
    receiver = _agent(pair, pair.b, {**common, "listen": True}, tmp_path, "b")
    sender = _agent(pair, pair.a, {**common, "flows": flows}, tmp_path, "a")
    timeout = START_DELAY_S + duration_s + 15
    sent = _finish(*sender, timeout)
    received = _finish(*receiver, timeout)
    packets = _read_capture(*cap) if cap else []
    return sent, received, packets


def _by_key(received):
    return {(r["src"], r["sport"], r["dst_qpn"]): r for r in received["received"]}


def test_three_paced_flows_arrive_complete_in_order_and_valid_on_the_wire(veth_pair, tmp_path, figure):
    rate, duration = 5.0, 2.0
    flows = [_flow(i, rate) for i in range(3)]
    sent, received, packets = _run_pair(veth_pair, tmp_path, flows, duration_s=duration,
                                        capture=40)

    assert sent["errors"] == []
    assert [w for w in sent["warnings"] if "behind its schedule" not in w] == []
    assert received["errors"] == [] and received["malformed"] == 0
    assert ADDR_B in received["host_addresses"]
    arrivals = _by_key(received)
    assert len(arrivals) == 3
    sports = set()
    for flow in flows:
        out = sent["sent"][flow["id"]]
        sports.add(out["sport"])
        assert out["sport"] == roce.udp_source_port(flow["src_qpn"], flow["dst_qpn"])
        got = arrivals[(ADDR_A, out["sport"], flow["dst_qpn"])]
        # A clean veth loses nothing and reorders nothing.
        assert (got["packets"], got["bytes"], got["wire_bytes"]) == (
            out["packets"], out["bytes"], out["wire_bytes"])
        assert got["oos"] == 0 and got["late"] == 0 and got["ce"] == 0
        assert got["dst"] == ADDR_B
        # Pacing: within 2% of the target over the time the agent was on schedule. A CPU stall
        # of the agent (a busy machine) is given up, not made good with a burst, and accounted
        # in behind_s.
        behind = figure(f"flow {flow['id']} sender behind schedule, s", out["behind_s"])
        assert behind < 0.1 * duration, f"agent starved of CPU: {out}"
        on_schedule = duration - out["behind_s"]
        sent_mbps = figure(f"flow {flow['id']} sent Mbit/s on schedule", out["wire_bytes"] * 8 / on_schedule / 1e6)
        assert sent_mbps == pytest.approx(rate, rel=0.02)
        span = got["last"] - got["first"]
        got_mbps = figure(f"flow {flow['id']} received Mbit/s on schedule",
                          got["wire_bytes"] * 8 / (span - out["behind_s"]) / 1e6)
        assert got_mbps == pytest.approx(rate, rel=0.05)
        assert out["start"] == pytest.approx(sent["config"]["start_at"], abs=0.05)
        assert out["end"] - out["start"] == pytest.approx(duration, abs=0.05)
    assert len(sports) == 3, "QP-derived source ports should differ"

    # On the wire: what the agent claims to send, with a correct ICRC.
    from scapy.contrib.roce import BTH
    from scapy.layers.inet import UDP
    assert len(packets) == 40
    expected_qps = {flow["dst_qpn"] for flow in flows}
    opcodes = set()
    for ip, datagram in packets:
        bth = ip[BTH]
        assert bth.dqpn in expected_qps
        assert ip[UDP].sport == roce.udp_source_port(0x100 + bth.dqpn - 0x200, bth.dqpn)
        assert ip.src == ADDR_A and ip.dst == ADDR_B
        assert ip.tos == (roce.DEFAULT_DSCP << 2) | roce.ECN_ECT0 and ip.flags == "DF"
        assert ip[UDP].chksum == 0
        assert bth.compute_icrc(None) == datagram[-4:], "scapy disagrees with the ICRC"
        assert roce.icrc_ok(datagram)
        opcodes.add(bth.opcode)
    assert {roce.OP_RC_RDMA_WRITE_FIRST, roce.OP_RC_RDMA_WRITE_MIDDLE,
            roce.OP_RC_RDMA_WRITE_LAST} <= opcodes


def test_shared_source_port_mode_puts_every_qp_on_one_port(veth_pair, tmp_path):
    flows = [_flow(i, 2.0) for i in range(4)]
    sent, received, packets = _run_pair(veth_pair, tmp_path, flows, duration_s=1.0, capture=40,
                                        sport_mode="shared")
    shared = roce.udp_source_port(0x100, 0x200, shared=True, src=ADDR_A, dst=ADDR_B)
    assert {out["sport"] for out in sent["sent"].values()} == {shared}

    from scapy.contrib.roce import BTH
    from scapy.layers.inet import UDP
    assert packets
    assert {ip[UDP].sport for ip, _ in packets} == {shared}
    assert {ip[BTH].dqpn for ip, _ in packets} == {flow["dst_qpn"] for flow in flows}
    assert all(roce.icrc_ok(datagram) for _, datagram in packets)

    # Only the destination QP tells the flows apart (what E-ECMP hashes on).
    arrivals = received["received"]
    assert len(arrivals) == 4
    assert {r["sport"] for r in arrivals} == {shared}
    for r in arrivals:
        out = sent["sent"][f"f{r['dst_qpn'] - 0x200}"]
        assert r["packets"] == out["packets"] and r["oos"] == 0


def test_backpressure_is_counted_and_loses_no_psn(veth_pair, tmp_path, figure):
    """A 10 Mbit/s tbf on the sender's veth against 20 Mbit/s of offered load: sends are refused
    (ENOBUFS) and retried, so the receiver still sees every PSN in order."""
    _run(["tc", "-n", veth_pair.a, "qdisc", "add", "dev", "vx0", "root", "tbf",
          "rate", "10mbit", "burst", "10kb", "limit", "20kb"])
    flows = [_flow(i, 10.0) for i in range(2)]
    sent, received, _ = _run_pair(veth_pair, tmp_path, flows, duration_s=1.5)
    assert sum(out["enobufs"] for out in sent["sent"].values()) > 0
    assert any("Mbit/s" in warning for warning in sent["warnings"])
    total = sum(out["wire_bytes"] for out in sent["sent"].values()) * 8 / 1.5 / 1e6
    assert figure("sent Mbit/s through a 10 Mbit/s tbf", total) == pytest.approx(10.0, rel=0.15)
    arrivals = _by_key(received)
    for out in sent["sent"].values():
        got = arrivals[(ADDR_A, out["sport"], out["dst_qpn"])]
        assert got["packets"] == out["packets"] and got["oos"] == 0


def test_a_withdrawn_route_is_retried_and_loses_no_psn(veth_pair, tmp_path, figure):
    """The route to the receiver goes away for 0.3 s mid-run: every send meets ENETUNREACH, the
    flow retries the same packet (send_policy's UNREACHABLE) and carries on when the route is
    back, so the receiver sees every PSN in order; the time lost is the schedule given up."""
    mac = json.loads(_run(["ip", "-n", veth_pair.b, "-j", "link", "show", "vx1"]))[0]["address"]
    # A permanent neighbour: the outage is the route's alone, not ARP's.
    _run(["ip", "-n", veth_pair.a, "neigh", "replace", ADDR_B, "lladdr", mac, "dev", "vx0",
          "nud", "permanent"])
    route = ["10.0.1.0/24", "dev", "vx0", "proto", "kernel", "scope", "link", "src", ADDR_A]
    duration, outage = 2.0, 0.3
    start_at = time.time() + START_DELAY_S
    common = {"start_at": start_at, "duration_s": duration, "linger_s": 0.5,
              "payload_bytes": 1024, "message_bytes": 4096}
    receiver = _agent(veth_pair, veth_pair.b, {**common, "listen": True}, tmp_path, "b")
    sender = _agent(veth_pair, veth_pair.a, {**common, "flows": [_flow(0, 5.0)]}, tmp_path, "a")
    time.sleep(max(0.0, start_at + 0.5 - time.time()))
    _run(["ip", "-n", veth_pair.a, "route", "del", *route])
    time.sleep(outage)
    _run(["ip", "-n", veth_pair.a, "route", "add", *route])
    timeout = START_DELAY_S + duration + 15
    sent, received = _finish(*sender, timeout), _finish(*receiver, timeout)

    out = sent["sent"]["f0"]
    assert sent["errors"] == []
    # one retry each UNREACHABLE_BACKOFF_S (10 ms) while the route was gone
    assert 0.5 * outage / 0.01 <= figure("send errors in a 0.3 s outage", out["send_errors"]) <= 1.5 * outage / 0.01
    assert any("Network is unreachable sending to 10.0.1.2 from 10.0.1.1; retried" in w
               for w in sent["warnings"]), sent["warnings"]
    assert figure("sender behind schedule after a 0.3 s outage, s", out["behind_s"]) == pytest.approx(outage, abs=0.05)
    (got,) = received["received"]
    assert got["packets"] == out["packets"] and got["oos"] == 0 and got["late"] == 0
    assert out["end"] - out["start"] == pytest.approx(duration, abs=0.05)


def test_sigterm_writes_what_it_has(veth_pair, tmp_path):
    config = {"start_at": time.time() + START_DELAY_S, "duration_s": 60, "linger_s": 0.5}
    receiver = _agent(veth_pair, veth_pair.b, {**config, "listen": True}, tmp_path, "b")
    sender = _agent(veth_pair, veth_pair.a, {**config, "flows": [_flow(0, 5.0)]}, tmp_path, "a")
    time.sleep(START_DELAY_S + 1.0)
    results = []
    for proc, out in (sender, receiver):          # the sender first, so nothing is in flight
        begun = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        results.append(_finish(proc, out, timeout=5))
        assert time.monotonic() - begun < 2.0
    sent, received = results
    assert sent["interrupted"] and received["interrupted"]
    out = sent["sent"]["f0"]
    assert out["packets"] > 0
    (got,) = received["received"]
    assert got["packets"] == out["packets"] and got["oos"] == 0


def test_source_address_not_on_the_host_is_a_one_line_error(veth_pair, tmp_path):
    flow = {**_flow(0, 1.0), "src": "10.0.1.9"}
    proc, out = _agent(veth_pair, veth_pair.a, {"duration_s": 1, "flows": [flow]}, tmp_path, "a")
    _, err = proc.communicate(timeout=15)
    assert proc.returncode == 2
    assert err.count("\n") == 1 and "10.0.1.9 is not configured on this host" in err
    assert not out.exists()
