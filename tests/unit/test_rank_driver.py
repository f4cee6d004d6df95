"""The shared rank driver (the launcher's protocol, the schedule engine, QP scaling, CTS credit)
over an RNIC made of queues: ranks in threads exchange NIC messages through in-memory inboxes,
and a fake launcher speaks the real protocol to them over a real Unix socket."""

import json
import os
import queue
import socket
import threading
import time

import numpy as np
import pytest

from fabriclab.traffic import schedules
from fabriclab.traffic.engine import Memory
from fabriclab.traffic.rank_channel import LauncherGone
from fabriclab.traffic.rank_driver import Connection, QpActivity, RankDriver

# -- an RNIC made of queues ---------------------------------------------------------------------


class Wire:
    """Per rank an inbox and a pipe that wakes the rank's event loop: what one rank's RNIC puts
    in another's inbox is handled in that rank's own thread, as a NIC's packets would be."""

    def __init__(self, ranks):
        self.inboxes = [queue.SimpleQueue() for _ in range(ranks)]
        self.pipes = [os.pipe() for _ in range(ranks)]

    def send(self, rank, item):
        self.inboxes[rank].put(item)
        os.write(self.pipes[rank][1], b"!")

    def close(self):
        for read, write in self.pipes:
            os.close(read)
            os.close(write)


class LoopQp:
    def __init__(self, spec):
        self.qpn, self.peer, self.peer_qpn = spec["qpn"], spec["peer"], spec["peer_qpn"]
        self.channel, self.port_index = spec["channel"], spec["port"]
        self.activity = QpActivity()
        self.tx_bytes = self.rx_bytes = 0
        self.usable = True


class LoopRnic:
    """A NIC message is delivered whole (its bytes written into the peer's memory in verify
    mode) and acknowledged; CTS grants travel as messages too."""

    def __init__(self, config, driver, wire):
        self.config, self.driver, self.wire = config, driver, wire
        self.rank = config["rank"]
        self.by_qpn = {}

    def open(self):
        self.by_qpn = {spec["qpn"]: LoopQp(spec) for spec in self.config["qps"]}
        return list(self.by_qpn.values())

    def hello(self):
        return {"loop": True}

    def selectables(self):
        return [(self.wire.pipes[self.rank][0], self.drain)]

    def on_control(self, message):
        return {"echo": message["echo"]} if "echo" in message else None

    def make_memory(self, regions):
        return Memory(regions)

    def check_schedule(self, _schedule):
        pass

    def post(self, qp, message, data):
        qp.activity.sending(message.nbytes, time.monotonic(), self.driver.clock_offset)
        qp.tx_bytes += message.nbytes
        self.wire.send(qp.peer, ("write", qp.peer_qpn, message,
                                 bytes(data) if data is not None else None))

    def poll(self, _now):
        for conn in self.driver.connections.values():
            if conn.cts_due:
                conn.cts_due = False
                self.wire.send(conn.peer, ("cts", self.rank, conn.channel, conn.granted_by_me))
        return None

    def drain(self, now):
        os.read(self.wire.pipes[self.rank][0], 4096)
        inbox, driver = self.wire.inboxes[self.rank], self.driver
        while not inbox.empty():
            kind, *item = inbox.get()
            if kind == "write":
                qpn, message, data = item
                qp = self.by_qpn[qpn]
                if driver.memory is not None:
                    driver.memory.write(message.dst_region, message.dst_offset, data)
                qp.rx_bytes += message.nbytes
                driver.message_received(qp, message.tag, message.nbytes, now)
                self.wire.send(qp.peer, ("ack", qp.peer_qpn, message.tag))
            elif kind == "ack":
                qpn, tag = item
                self.by_qpn[qpn].activity.completed(now)
                driver.message_sent(tag, now)
            else:
                peer, channel, granted = item
                driver.grant(driver.connections[(peer, channel)], granted)

    def totals(self):
        return {"tx_bytes": sum(q.tx_bytes for q in self.by_qpn.values()),
                "rx_bytes": sum(q.rx_bytes for q in self.by_qpn.values())}

    def qp_counters(self):
        return [{"qpn": q.qpn, "tx_bytes": q.tx_bytes} for q in self.by_qpn.values()]

    def port_reports(self):
        return [{"address": a["address"]} for a in self.config["ports"]]

    def plane_bytes(self):
        out = [0] * len(self.config["ports"])
        for qp in self.by_qpn.values():
            out[qp.port_index] += qp.tx_bytes
        return out

    def plb_report(self):
        return None

    def status(self):
        return {"inbox": self.wire.inboxes[self.rank].qsize()}

    def close(self):
        pass


def _configs(n, control, *, collective="allreduce", size=96 * 1024, channels=2, qps=2,
             qp_method="split", cts=True, verify=True, in_place=False):
    schedule = schedules.build(collective, n, size, channels=channels, piece_bytes=8192, in_place=in_place)
    plans = [[] for _ in range(n)]
    qpn = 0x100
    for a, b, channel in schedule.connections():
        for _ in range(qps):
            for me, peer, mine, theirs in ((a, b, qpn, qpn + 1), (b, a, qpn + 1, qpn)):
                plans[me].append({"qpn": mine, "peer": peer, "peer_qpn": theirs,
                                  "channel": channel, "port": 0})
            qpn += 2
    ranks = [{"rank": r, "host": f"h{r + 1}", "addresses": [f"10.0.0.{r + 1}"]} for r in range(n)]
    transport = {"chunk_bytes": 16384, "qp_method": qp_method,
                 "cts": {"enabled": cts, "buffers": 2}}
    coll = {"collective": collective, "algorithm": schedule.algorithm, "channels": channels,
            "piece_bytes": 8192, "imbalance": 4.0, "seed": 1, "root": 0}
    return schedule, [{"rank": r, "ranks": ranks, "qps": plans[r],
                       "ports": [{"address": f"10.0.0.{r + 1}"}], "transport": transport,
                       "collective": coll, "sizes": [size], "verify": verify, "data_seed": 3,
                       "control": str(control)} for r in range(n)]


# -- a launcher that speaks the protocol -----------------------------------------------------------


class FakeLauncher:
    def __init__(self, path, ranks):
        # Listening before any driver starts: a driver that connected between bind and listen
        # was refused, and the launcher then waited for it until its timeout.
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(ranks)
        self.server.settimeout(10)
        self.ranks = ranks
        self.links = {}
        self.buffers = {}

    def accept_all(self):
        for _ in range(self.ranks):
            conn, _ = self.server.accept()
            conn.settimeout(10)
            hello = self._read(conn)
            self.links[hello["hello"]] = conn
            self.buffers[hello["hello"]] = b""
            self.hello = hello

    @staticmethod
    def _read(conn, buffer=b""):
        while b"\n" not in buffer:
            buffer += conn.recv(65536)
        line, _rest = buffer.split(b"\n", 1)
        return json.loads(line)

    def send(self, rank, message):
        self.links[rank].sendall((json.dumps(message) + "\n").encode())

    def receive(self, rank):
        while b"\n" not in self.buffers[rank]:
            chunk = self.links[rank].recv(65536)
            assert chunk, f"rank {rank} hung up"
            self.buffers[rank] += chunk
        line, self.buffers[rank] = self.buffers[rank].split(b"\n", 1)
        return json.loads(line)

    def gather(self, kind, ranks=None):
        got = {}
        for rank in ranks if ranks is not None else self.links:
            message = self.receive(rank)
            assert "error" not in message, message
            assert kind in message, (kind, message)
            got[rank] = message
        return got

    def close(self):
        for conn in self.links.values():
            conn.close()
        self.server.close()


@pytest.fixture
def ranks(tmp_path):
    """Start `n` rank drivers in threads over a Wire; returns (launcher, schedule, drivers)."""
    started = []

    def start(n, **kw):
        control = tmp_path / "control.sock"
        schedule, configs = _configs(n, control, **kw)
        wire = Wire(n)
        drivers = [RankDriver(c, lambda config, driver: LoopRnic(config, driver, wire))
                   for c in configs]
        errors = []

        def serve(driver):
            try:
                driver.open()
                driver.serve()
            except LauncherGone:
                pass
            except Exception as exc:        # noqa: BLE001 -- reported by the test
                errors.append(exc)
            finally:
                driver.close()

        threads = [threading.Thread(target=serve, args=(d,), daemon=True) for d in drivers]
        launcher = FakeLauncher(control, n)
        accept = threading.Thread(target=launcher.accept_all)
        accept.start()
        for thread in threads:
            thread.start()
        accept.join(15)
        assert not accept.is_alive(), f"the drivers did not all say hello: {errors}"
        started.append((launcher, threads, wire, errors))
        return launcher, schedule, drivers, errors

    yield start
    for launcher, threads, wire, errors in started:
        launcher.close()                 # a driver still serving sees the launcher go
        for thread in threads:
            thread.join(5)
        wire.close()
        assert not errors, errors


def test_ranks_run_a_verified_collective_through_the_protocol(ranks):
    launcher, schedule, _drivers, errors = ranks(4)
    assert launcher.hello["loop"] and "pid" in launcher.hello
    for rank in launcher.links:
        launcher.send(rank, {"prepare": 0})
    assert launcher.gather("ready") == {r: {"ready": 0} for r in range(4)}
    launcher.send(2, {"status": True})
    # the RNIC's own status is merged in; its inbox may still hold the CTS grants its peers sent
    # when they prepared (2 in about 1 run of 15 with the other core busy, 2026-11-28)
    state = launcher.gather("status", [2])[2]["state"]
    assert state["running"] is False and set(state) == {"running", "inbox"} and state["inbox"] >= 0
    launcher.send(1, {"echo": 7})                      # what the driver does not know: the RNIC's
    assert launcher.gather("echo", [1]) == {1: {"echo": 7}}

    for iteration in range(2):
        start_at = time.time() + 0.05
        for rank in launcher.links:
            launcher.send(rank, {"run": iteration, "start_at": start_at})
        done = launcher.gather("done")
        for rank, report in done.items():
            assert report["done"] == iteration
            assert report["verify"]["ok"], report["verify"]
            assert report["verify"]["elements"] == schedule.regions[rank]["output"] // 4
            assert report["start"] >= start_at - 0.001 and report["end"] >= report["start"]
            # this iteration's bytes only, split over both QPs of each connection
            assert report["counters"] == {"tx_bytes": schedule.sent_bytes(rank),
                                          "rx_bytes": schedule.received_bytes(rank)}
            assert sum(f["bytes"] for f in report["flows"]) == schedule.sent_bytes(rank)
            assert len(report["flows"]) == 2 * 2            # to the next rank: 2 channels x 2 QPs

    for rank in launcher.links:
        launcher.send(rank, {"stop": True})
    finals = launcher.gather("final")
    assert finals[3]["totals"]["tx_bytes"] == 2 * schedule.sent_bytes(3)
    assert finals[3]["ports"] == [{"address": "10.0.0.4"}] and "cpu_s" in finals[3]
    assert not errors


def _iteration(launcher, iteration):
    start_at = time.time() + 0.05
    for rank in launcher.links:
        launcher.send(rank, {"run": iteration, "start_at": start_at})
    return launcher.gather("done")


@pytest.mark.parametrize("collective", ["allreduce", "allgather", "reducescatter", "gather"])
def test_ranks_run_a_verified_collective_in_place(ranks, collective):
    """In place the receive buffer aliases the send buffer; the check reads the receive buffer
    where it lives, and every iteration starts from the input again (the last one overwrote it)."""
    launcher, schedule, _drivers, _errors = ranks(4, collective=collective, in_place=True)
    for rank in launcher.links:
        launcher.send(rank, {"prepare": 0, "in_place": True})
    launcher.gather("ready")
    for iteration in range(2):
        for rank, report in _iteration(launcher, iteration).items():
            assert report["verify"]["ok"], (rank, report["verify"])
            assert report["verify"]["elements"] == schedule.buffers[rank]["output"].nbytes // 4 > 0
            assert report["counters"]["tx_bytes"] == schedule.sent_bytes(rank)


def test_an_undefined_in_place_result_is_not_checked(ranks):
    launcher, _schedule, _drivers, _errors = ranks(4, collective="alltoall", in_place=True)
    for rank in launcher.links:
        launcher.send(rank, {"prepare": 0, "in_place": True})
    launcher.gather("ready")
    assert all(report["verify"] is None for report in _iteration(launcher, 0).values())


def test_in_place_check_catches_a_clobbered_send_buffer(ranks):
    """Rank 0's input lives in its receive buffer in place: a stray write there before the run is
    in every rank's sum, and each one counts its wrong elements; the next iteration, started from
    the input again, is right."""
    launcher, schedule, drivers, _errors = ranks(4, in_place=True)
    for rank in launcher.links:
        launcher.send(rank, {"prepare": 0, "in_place": True})
    launcher.gather("ready")
    assert schedule.buffers[0]["input"].region == "output"
    drivers[0].memory.arrays["output"][:10] += 1000
    for rank, report in _iteration(launcher, 0).items():
        assert not report["verify"]["ok"] and report["verify"]["mismatches"] == 10, report["verify"]
    assert all(report["verify"]["ok"] for report in _iteration(launcher, 1).values())


def test_writes_that_arrive_before_the_run_command_are_kept(ranks):
    """A fast peer may write into a rank's memory before that rank hears of the iteration: its
    outputs are cleared when an iteration is done, not when the next one is announced."""
    launcher, _schedule, drivers, _errors = ranks(3, collective="allgather", qps=1,
                                                   qp_method="round-robin", cts=False)
    for rank in launcher.links:
        launcher.send(rank, {"prepare": 0})
    launcher.gather("ready")
    start_at = time.time() + 0.02
    for rank in (1, 2):
        launcher.send(rank, {"run": 0, "start_at": start_at})
    deadline = time.monotonic() + 5
    while not drivers[0].early and time.monotonic() < deadline:
        time.sleep(0.005)
    assert drivers[0].early, "no peer wrote to rank 0 before its run command"
    launcher.send(0, {"run": 0, "start_at": start_at})
    done = launcher.gather("done")
    assert all(report["verify"]["ok"] for report in done.values()), done
    # and the outputs are zero again, ready for the next iteration's check
    assert not np.any(drivers[0].memory.arrays["output"])


def test_cts_holds_a_sender_within_the_receivers_grant(tmp_path):
    """With CTS on, a rank writes no more than its peer granted: two chunks up front, more as
    the peer's memory takes them."""
    schedule, configs = _configs(2, tmp_path / "none", collective="bisection", size=8 * 16384,
                                 channels=1, qps=1, qp_method="round-robin", verify=False)
    posted = []

    class Recorder:
        def __init__(self, config, driver):
            self.driver = driver

        def open(self):
            return [LoopQp(spec) for spec in configs[0]["qps"]]

        def check_schedule(self, _schedule):
            pass

        def post(self, qp, message, data):
            posted.append(message.nbytes)

        def totals(self):
            return {}

        def plane_bytes(self):
            return [0]

        def status(self):
            return {}

    driver = RankDriver(configs[0], Recorder)
    driver.qps = driver.rnic.open()
    conn = driver.connections[(1, 0)] = Connection(1, 0, driver.qps)
    driver.prepare(0)
    driver.run(0, time.time())
    driver.begin(time.monotonic())
    assert sum(posted) == 0                          # nothing granted yet
    driver.grant(conn, 2 * 16384)
    assert posted == [16384, 16384]
    driver.grant(conn, 16384)                        # stale: grants are cumulative
    assert len(posted) == 2
    driver.grant(conn, 8 * 16384)
    assert sum(posted) == schedule.sent_bytes(0) == 8 * 16384
    assert driver.status()["cts_blocked"] == []
