"""The live web view without a network: the frames it pushes, the requests its buttons send
(checked as hostile input, carried out through the lab's API), the address and token rules, and
its server answering a page, a push channel and actions on loopback, with a recording fake lab."""

import http.client
import json
import re
import socket
import threading
import time

import pytest

from fabriclab.errors import LabError
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import load_spec
from fabriclab.view import actions, frames, live, page
from fabriclab.view.layout import link_id
from fabriclab.view.server import WebServer, is_loopback, parse_address
from fabriclab.workflows import session as session_mod
from fabriclab.workflows.session import Session


class FakeLab:
    """The lab API the view calls, recording each call and keeping the fault state as Lab does."""

    def __init__(self, spec="tiny"):
        self.fabric = Fabric(load_spec(spec))
        self.routing, self.queues, self.events, self.calls = "ecmp", None, [], []
        self.down, self.reshaped, self.lossy = {}, {}, {}

    def _log(self, event, target, **detail):
        self.events.append({"time": time.time(), "event": event, "target": target, **detail})

    def resolve_link(self, a, b, member=None):
        links = self.fabric.find_link(a, b, member)
        if not links:
            raise LabError(f"no link between {a} and {b}")
        return links

    def set_links(self, links, up, wait=True, timeout=10.0, what="the links", event=None):
        self.calls.append(("set_links", [link.label for link in links], up))
        for link in links:
            if up:
                self.down.pop(link.key, None)
            else:
                self.down[link.key] = link
        self._log(*(event or ("link_up" if up else "link_down", ", ".join(link.label for link in links))))

    def set_switch(self, name, up, wait=True, timeout=10.0):
        links = [link for link in self.fabric.links if name in (link.a, link.b)]
        self.set_links(links, up, event=("switch_up" if up else "switch_down", name))
        return links

    def reshape_links(self, links, rate):
        self.calls.append(("reshape", [link.label for link in links], rate))
        for link in links:
            if rate:
                self.reshaped[(link.key, None)] = (link, None, rate)
            else:
                self.reshaped.pop((link.key, None), None)

    def set_loss(self, links, fraction):
        self.calls.append(("loss", [link.label for link in links], fraction))
        for link in links:
            if fraction:
                self.lossy[link.key] = (link, fraction)
            else:
                self.lossy.pop(link.key, None)

    def restore(self):
        self.calls.append(("restore",))
        self.down, self.reshaped, self.lossy = {}, {}, {}

    def set_latency(self, target, us):
        self.calls.append(("latency", target if isinstance(target, str) else [k.label for k in target], us))
        return ["p1", "p2", "p3"]

    def cut_buffer(self, switch, fraction):
        self.calls.append(("buffer", switch, fraction))
        self._log("buffer_cut", switch)
        return [f"{switch}-eth1", f"{switch}-eth2"]

    def fault_state(self):
        return {"down": dict(self.down), "reshaped": dict(self.reshaped), "lossy": dict(self.lossy)}


def test_a_frame_turns_counter_deltas_into_megabits_per_direction():
    fab = Fabric(load_spec("tiny"))
    dirs = frames.directions(fab)
    before = {name: 1_000 for name in dirs}
    after = dict(before, **{"l1>s1": 1_000 + 1_250_000, "s1>l1": 500})      # 10 Mbit in 1 s; a reset
    rates = live.link_rates(dirs, before, after, 1.0)
    assert rates["l1-s1"] == {"up": 10.0, "down": 0.0}
    assert set(rates) == {link_id(link) for link in fab.links}
    assert all(rates[i] == {"up": 0.0, "down": 0.0} for i in rates if i != "l1-s1")


def test_queues_are_drawn_where_the_model_saw_something():
    fab = Fabric(load_spec("tiny"))
    dirs = frames.directions(fab)
    busy = {"occ": 1500, "high": 3000, "marks": 2, "drops": 0, "pause_tx": 1, "paused": 1}
    idle = dict.fromkeys(busy, 0)
    out = live.port_queues(dirs, {"l1-eth3": busy, "s1-eth1": idle})
    egress = {egress: (ident, way) for ident, way, egress in dirs.values()}
    ident, way = egress["l1-eth3"]
    assert out == {ident: {way: busy}}


def test_fault_marks_name_the_cables_as_the_page_does():
    lab = FakeLab("default")
    link = lab.fabric.fabric_links[0]
    host = lab.fabric.host_links[0]
    lab.set_links([link], False)
    lab.reshape_links([host], 2.5)
    lab.set_loss([host], 0.01)
    down, degraded = live.fault_marks(lab.fault_state())
    assert down == [link_id(link)]
    assert degraded == {link_id(host): "shaped to 2.5 Mbit/s; loses 1.00% of packets"}


def test_event_rows_carry_time_since_the_feed_started_and_the_clock():
    events = [{"time": 1000.0, "event": "link_down", "target": "l1-s1"},
              {"time": 1002.5, "event": "degrade", "target": "l1-s2", "rate_mbps": 2}]
    rows = live.event_rows(events, 1001.0, limit=5)
    assert [r[0] for r in rows] == [-1.0, 1.5]
    assert rows[0][1].endswith(" link down l1-s1") and rows[1][1].endswith("degrade l1-s2 rate_mbps=2")
    assert len(live.event_rows(events * 40, 0, limit=7)) == 7


@pytest.mark.parametrize("request_, problem", [
    ([], "a request is"),
    ({"action": "explode"}, "unknown action 'explode'"),
    ({"action": "link_down"}, "missing link"),
    ({"action": "link_down", "link": "l1-s1", "force": True}, "unknown key 'force'"),
    ({"action": "link_down", "link": "l9-s9"}, "no link 'l9-s9'"),
    ({"action": "link_down", "link": ["l1-s1"]}, "must be a link's name"),
    ({"action": "switch_down", "switch": "h1"}, "no switch 'h1'"),
    ({"action": "buffer", "switch": "h1", "fraction": 0.5}, "no switch 'h1'"),
    ({"action": "buffer", "switch": "s1", "fraction": 0}, "buffer fraction must be in (0, 1]"),
    ({"action": "buffer", "switch": "s1", "fraction": 1.5}, "buffer fraction must be in (0, 1]"),
    ({"action": "buffer", "switch": "s1"}, "missing fraction"),
    ({"action": "latency", "switch": "s1", "link": "l1-s1", "us": 2}, "latency takes one of switch or link"),
    ({"action": "latency", "us": 2}, "latency takes one of switch or link"),
    ({"action": "latency", "switch": "s1", "us": -2}, "latency us must be in [0, 1e+06]"),
    ({"action": "latency", "link": "l1-s9", "us": 2}, "no link 'l1-s9'"),
    ({"action": "degrade", "link": "l1-s1", "rate_mbps": 0}, "must be in (0, 1e+06]"),
    ({"action": "degrade", "link": "l1-s1", "rate_mbps": True}, "must be a number"),
    ({"action": "degrade", "link": "l1-s1", "rate_mbps": 10}, "not below the link's 10 Mbit/s"),
    ({"action": "loss", "link": "l1-s1", "fraction": 1}, "loss fraction must be in"),
    ({"action": "timeline_start", "faults": "x" * 40_000}, "at most 32768 characters"),
    ({"action": "timeline_start", "faults": "- {at: [}"}, "is not valid YAML"),
])
def test_requests_are_checked_before_the_lab_is_touched(request_, problem):
    lab = FakeLab()
    with pytest.raises(LabError, match="^.*" + problem.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("+", r"\+")) as err:
        actions.perform(lab, Session(lab), request_)
    assert "\n" not in str(err.value) and len(str(err.value)) < 200
    assert lab.calls == [] and lab.events == []


def test_actions_go_through_the_lab_api_and_its_fault_log():
    lab = FakeLab("default")
    session = Session(lab)
    member = next(link for link in lab.fabric.fabric_links if link.member == 0)
    ident = link_id(member)
    assert actions.perform(lab, session, {"action": "link_down", "link": ident}).startswith(f"{ident} down")
    assert lab.calls[-1] == ("set_links", [member.label], False)
    assert actions.perform(lab, session, {"action": "link_up", "link": ident}).startswith(f"{ident} up")
    assert actions.perform(lab, session, {"action": "degrade", "link": ident, "rate_mbps": 1.5}) \
        == f"{ident} shaped to 1.5 Mbit/s (it stays up)"
    assert lab.calls[-1] == ("reshape", [member.label], 1.5)
    actions.perform(lab, session, {"action": "restore_rate", "link": ident})
    assert lab.calls[-1] == ("reshape", [member.label], None)
    actions.perform(lab, session, {"action": "loss", "link": ident, "fraction": 0.02})
    assert lab.calls[-1] == ("loss", [member.label], 0.02)
    out = actions.perform(lab, session, {"action": "switch_down", "switch": "s1"})
    assert out.startswith("s1 down (") and lab.events[-1]["event"] == "switch_down"
    assert actions.perform(lab, session, {"action": "buffer", "switch": "s1", "fraction": 0.5}) \
        == "s1: 2 ports tail-drop past 0.5 of their buffer"
    assert lab.calls[-1] == ("buffer", "s1", 0.5)
    assert actions.perform(lab, session, {"action": "latency", "switch": "s1", "us": 2}) \
        == "s1: 3 ports 2 us (real) slower"
    assert actions.perform(lab, session, {"action": "latency", "link": ident, "us": 0}) \
        == f"{ident}: 3 ports at the spec's delay"
    assert lab.calls[-2:] == [("latency", "s1", 2), ("latency", [member.label], 0)]
    assert actions.perform(lab, session, {"action": "restore"}).startswith("every link up")
    assert [e["event"] for e in lab.events] == ["link_down", "link_up", "switch_down", "buffer_cut"]


def test_a_host_cable_is_one_nic_even_when_two_share_a_leaf():
    from fabriclab.topologies.spec import spec_from_dict

    lab = FakeLab()
    lab.fabric = Fabric(spec_from_dict({
        "name": "two-nics", "kind": "leafspine", "leaves": 2, "spines": 1, "hosts_per_leaf": 1,
        "nics_per_host": 2, "host_rate": "10Mbit", "fabric_rate": "10Mbit",
        "buffers": {"host": "64KiB", "leaf": "64KiB", "spine": "64KiB"}}))
    second = [link for link in lab.fabric.host_links if link.a == "h1"][1]
    actions.perform(lab, Session(lab), {"action": "link_down", "link": link_id(second)})
    assert list(lab.down.values()) == [second]


def test_a_timeline_from_the_page_runs_once_and_stops_from_anywhere():
    lab = FakeLab()
    session = Session(lab)
    text = "faults:\n  - {at: 0, link_down: l1-s1, for: 0.05}\n  - {at: 5, switch_down: s2}\n"
    assert actions.perform(lab, session, {"action": "timeline_start", "faults": text}) \
        == "3 fault step(s) over 5 s started"
    with pytest.raises(LabError, match="already running"):
        actions.perform(lab, session, {"action": "timeline_start", "faults": text})
    deadline = time.monotonic() + 5
    while len(lab.events) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [(e["event"], e["target"]) for e in lab.events] == [("link_down", "l1-s1"), ("link_up", "l1-s1")]
    assert session.timeline_state() == {"running": True, "steps": 3, "applied": 2, "error": None}
    assert actions.perform(lab, session, {"action": "timeline_stop"}) == "fault timeline stopped"
    assert not session.timeline_running() and len(lab.events) == 2
    assert actions.perform(lab, session, {"action": "timeline_stop"}) == "no fault timeline is running"


def test_a_job_is_summarised_by_its_last_sizes_busbw_and_cct():
    record = session_mod.JobRecord(3, "allreduce 1M", 0.0)
    assert session_mod.job_summary(record)["state"] == "running"
    record.fraction = 0.4
    assert session_mod.job_summary(record)["state"] == "running (40 %)"
    record.doc = {"folder": "results/x", "runs": [{"jobs": {"ring": {"sizes": [
        {"busbw_mbps": 1.0, "cct_ms": {"p50": 9.0}}, {"busbw_mbps": 4.256, "cct_ms": {"p50": 812.34}}]}}}]}
    assert session_mod.job_summary(record) == {"number": 3, "label": "allreduce 1M", "state": "done",
                                               "busbw": "4.26 Mbit/s", "cct": "812.3 ms", "results": "results/x"}
    failed = session_mod.JobRecord(4, "x", 0.0, error="no host h9")
    assert session_mod.job_summary(failed)["state"] == "failed: no host h9"
    assert session_mod.headline({"runs": [{"jobs": {"traffic": {"traffic": {}}}}]}) == (None, None)


@pytest.mark.parametrize("text, expect", [("127.0.0.1:8765", ("127.0.0.1", 8765)), ("[::1]:0", ("::1", 0)),
                                          ("0.0.0.0:80", ("0.0.0.0", 80)), ("localhost:9000", ("localhost", 9000))])
def test_addresses(text, expect):
    assert parse_address(text) == expect


@pytest.mark.parametrize("text", ["8765", "host:", "host:99999", ":8765", "a/b:80", "127.0.0.1:-1", "", "x" * 400])
def test_bad_addresses_are_one_line(text):
    with pytest.raises(LabError, match="web address"):
        parse_address(text)


def test_loopback_is_what_the_kernel_calls_loopback():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5") and not is_loopback("example.org")


def test_the_live_page_is_self_contained_and_carries_its_token():
    lab = FakeLab()
    text = page.render_live(lab, "TOKEN123", 0.5)
    data = json.loads(text.split('id="fabric-data">', 1)[1].split("</script>", 1)[0])
    assert data["mode"] == "live" and data["live"]["events"] == "events?token=TOKEN123"
    assert data["live"]["action"] == "action?token=TOKEN123" and data["runs"] == []
    assert {n["id"] for n in data["layout"]["nodes"]} == {*lab.fabric.switches, *lab.fabric.hosts}
    assert not re.search(r"(src|href)\s*=\s*[\"']?[a-z]+:|url\(|@import", text)       # nothing fetched
    assert "time scale x40000" in text


# -- the server, on loopback, with the fake lab and fake port counters ------------------------------
def fake_counters(lab, sys_net):
    """A /sys/class/net look-alike under `sys_net`: every counter the feed reads, at 0."""
    for col in live.portsampler.columns(lab.fabric):
        folder = sys_net / col.intf / "statistics"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / col.counter).write_text("0\n")


@pytest.fixture
def served(tmp_path):
    lab = FakeLab()
    fake_counters(lab, tmp_path)
    session = Session(lab)
    web = WebServer(lab, session, "127.0.0.1:0", refresh_s=0.05, sys_net=str(tmp_path)).start()
    session.web = web
    yield lab, session, web, tmp_path
    session.close()


def ask(web, method, path, body=None, token=True, raw=None):
    conn = http.client.HTTPConnection("127.0.0.1", web.port, timeout=10)
    sep = "&" if "?" in path else "?"
    url = path + (f"{sep}token={web.token}" if token else "")
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    conn.request(method, url, body=data, headers={"Content-Type": "application/json"})
    answer = conn.getresponse()
    payload = answer.read()
    conn.close()
    return answer, payload


def test_every_path_wants_the_token(served):
    _lab, _session, web, _dir = served
    for method, path in [("GET", "/"), ("GET", "/state"), ("GET", "/events"), ("POST", "/action")]:
        answer, _ = ask(web, method, path, token=False)
        assert answer.status == 403
        answer, _ = ask(web, method, path + "?token=" + "x" * len(web.token), token=False)
        assert answer.status == 403
    answer, body = ask(web, "GET", "/")
    assert answer.status == 200 and b'"mode":"live"' in body
    assert "default-src 'none'" in answer.getheader("Content-Security-Policy")
    assert ask(web, "GET", "/nothing")[0].status == 404


def test_the_server_reads_the_counters_and_carries_out_actions(served):
    lab, _session, web, sys_net = served
    up = next(c for c in live.portsampler.columns(lab.fabric) if c.name == "l1>s1")
    counter = sys_net / up.intf / "statistics" / up.counter
    deadline, sent, state = time.monotonic() + 10, 0, {}
    # the counter keeps moving, so whichever frame the poll reads has seen it move
    while time.monotonic() < deadline and not (state.get("rates", {}).get("l1-s1", {}).get("up") or 0) > 0:
        sent += 125_000
        counter.write_text(f"{sent}\n")
        time.sleep(0.02)
        state = json.loads(ask(web, "GET", "/state")[1] or b"{}")
    assert state["rates"]["l1-s1"]["up"] > 0 and state["error"] is None
    answer, body = ask(web, "POST", "/action", {"action": "link_down", "link": "l1-s1"})
    assert answer.status == 200 and json.loads(body) == {"ok": True, "message": json.loads(body)["message"]}
    assert lab.calls == [("set_links", ["l1-s1"], False)]
    answer, body = ask(web, "POST", "/action", {"action": "link_down", "link": "nowhere"})
    assert answer.status == 400 and json.loads(body) == {"ok": False, "error": "no link 'nowhere' in fabric 'tiny'"}
    answer, body = ask(web, "POST", "/action", raw=b'{"action": "restore", "action": "restore"}')
    assert answer.status == 400 and "appears twice" in json.loads(body)["error"]
    answer, body = ask(web, "POST", "/action", raw=b"x" * 70_000)
    assert answer.status == 413
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and state.get("down") != ["l1-s1"]:
        state = json.loads(ask(web, "GET", "/state")[1])
    assert state["down"] == ["l1-s1"] and state["events"][-1][1].endswith("link down l1-s1")


def test_the_push_channel_sends_frames_then_says_goodbye_and_frees_the_port(served):
    _lab, session, web, _dir = served
    sock = socket.create_connection(("127.0.0.1", web.port), timeout=10)
    sock.sendall(f"GET /events?token={web.token} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    got = b""
    while got.count(b"\ndata: {") < 2:
        got += sock.recv(65536)
    assert b"Content-Type: text/event-stream" in got
    first = json.loads(got.split(b"\ndata: ", 1)[1].split(b"\n", 1)[0])
    assert {"seq", "t", "rates", "queues", "down", "events", "jobs"} <= set(first)
    done = threading.Event()
    closer = threading.Thread(target=lambda: (session.close(), done.set()))
    closer.start()
    while b"event: bye" not in got:
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    sock.close()
    closer.join(10)
    assert b"event: bye" in got and b"the lab stopped" in got and done.is_set()
    with socket.socket() as again:               # nothing is left listening
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", web.port))
        again.listen()


def test_a_busy_address_is_refused_before_a_fabric_is_built():
    lab = FakeLab()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(LabError, match=f"cannot serve the web view on 127.0.0.1:{port}"):
            WebServer(lab, Session(lab), f"127.0.0.1:{port}").bind()


def test_a_reading_that_fails_is_shown_and_the_feed_goes_on(tmp_path):
    lab = FakeLab()
    fake_counters(lab, tmp_path)
    real, calls = lab.fault_state, []

    def flaky():
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("dictionary changed size during iteration")
        return real()
    lab.fault_state = flaky
    feed = live.LiveFeed(lab, Session(lab), refresh_s=0.02, sys_net=str(tmp_path)).start()
    try:
        seen, seq = [], 0
        while len(seen) < 4:
            frame = feed.wait(seq, 5)
            assert frame is not None
            seq = frame["seq"]
            seen.append(frame["error"])
        assert seen[0] is None and seen[1] == "RuntimeError: dictionary changed size during iteration"
        assert seen[2:] == [None, None]                  # the feed read on
    finally:
        feed.stop()
