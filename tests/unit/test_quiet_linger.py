"""A receiver's linger after the senders stop (traffic/roce_receiver.py, traffic/launcher.py):
it ends once nothing has come for the quiet period, never while packets still arrive, and the
launcher sets one only where the queue model cannot pause a port."""

import socket
import threading
import time
import types

from fabriclab.traffic import launcher
from fabriclab.traffic.roce_receiver import Receiver


def receiver():
    """A Receiver on a loopback UDP socket: what arrives there is counted as malformed RoCE."""
    r = Receiver.__new__(Receiver)
    r.counts = types.SimpleNamespace(malformed=0, add=lambda *a: None)
    r.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    r.sock.bind(("127.0.0.1", 0))
    r.sock.settimeout(0.02)
    return r


def test_without_quiet_it_counts_to_the_end_of_its_linger():
    r = receiver()
    t0 = time.monotonic()
    r.run(threading.Event(), t0 + 0.4)
    assert 0.4 <= time.monotonic() - t0 < 3


def test_it_stops_once_quiet_after_the_senders_end_and_not_while_packets_come():
    r = receiver()
    t0 = time.monotonic()
    r.run(threading.Event(), t0 + 5, quiet=(t0 + 0.1, 0.2))       # nothing comes: end + quiet
    assert 0.3 <= time.monotonic() - t0 < 3     # not 5 s: it did not wait out its linger

    r = receiver()
    address = r.sock.getsockname()
    stop_sending = threading.Event()

    def send():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as out:
            while not stop_sending.is_set():
                out.sendto(b"x" * 40, address)
                time.sleep(0.05)
    sender = threading.Thread(target=send)
    t0 = time.monotonic()
    sender.start()
    try:
        # packets every 50 ms until 0.8 s: the linger lasts until 0.2 s after the last of them
        threading.Timer(0.8, stop_sending.set).start()
        r.run(threading.Event(), t0 + 5, quiet=(t0 + 0.1, 0.2))
    finally:
        stop_sending.set()
        sender.join()
    assert 0.9 <= time.monotonic() - t0 < 3     # the last packet came at 0.75-0.8 s


def lab(queues=None):
    hosts = {f"h{i}": types.SimpleNamespace(ports=[types.SimpleNamespace(ip=f"10.0.{i}.1")]) for i in (1, 2, 3)}
    return types.SimpleNamespace(queues=queues, fabric=types.SimpleNamespace(hosts=hosts))


def test_the_launcher_waits_out_a_slow_flows_gaps_and_all_of_it_under_pfc():
    plan = {"h1": [{"dst": "10.0.2.1", "rate_mbps": 10.0}, {"dst": "10.0.3.1", "rate_mbps": 0.05}]}
    quiet = launcher.quiet_periods(lab(), plan, 1024)
    # h2's flow: a 1106-byte frame every 0.9 ms, 4 gaps is under the floor; h3's every 177 ms
    assert quiet["h2"] == launcher.QUIET_S and quiet["h1"] == launcher.QUIET_S
    assert 0.70 < quiet["h3"] < 0.71
    slower = launcher.quiet_periods(lab(), {"h1": [{"dst": "10.0.3.1", "rate_mbps": 0.001}]}, 1024)
    assert slower["h3"] == launcher.LINGER_S                  # never past the linger itself
    assert launcher.quiet_periods(lab(queues=object()), plan, 1024) == {}
