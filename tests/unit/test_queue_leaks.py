"""The leak repair's arithmetic (fabriclab.queues.leaks) and the PFC agent's use of it, on crafted
counters: a count is moved only when it lies outside [0, the switch's egress occupancy], and only
once its port has been quiet for QUIET_NS."""

import types

import pytest

from fabriclab.queues.config import CLASSES, LOSSLESS, PfcSettings
from fabriclab.queues.gate import CLOSED_RATE
from fabriclab.queues.leaks import QUIET_NS, Account, LeakRepair, accounts_of
from fabriclab.queues.model import PortInfo
from fabriclab.queues.pfc import LEAK_CHECK_NS, PfcAgent

MS = 1_000_000


def stat(held=0, occ=0, rx=0, paused=0):
    return types.SimpleNamespace(held=held, occ=occ, rx_pkts=rx, paused=paused)


# One switch with ingress row 0 and egress rows 0 and 3 (two ports, lossless class), XON 1000.
ACCOUNT = Account(row=0, port="l1-eth1", cls="lossless", egress_rows=(0, 3), xon=1000, upstream=7)


def table(**rows):
    out = {0: stat(), 3: stat()}
    out.update({int(k[1:]): v for k, v in rows.items()})
    return out


def settle(repair, stats, start=0):
    """First sight of the counters, then a check once the port has been quiet long enough."""
    assert repair.check(start, stats) == []
    return repair.check(start + QUIET_NS, stats)


def test_a_count_above_the_egress_occupancy_is_a_leak_and_comes_down_to_it():
    repair = LeakRepair([ACCOUNT])
    fixes = settle(repair, table(r0=stat(held=9000, rx=5), r3=stat(occ=1500)))
    assert [(f.held_before, f.held_after, f.bias, f.bytes) for f in fixes] == [(9000, 1500, 7500, 7500)]
    # repaired once: the next check finds the account within its range
    assert repair.check(2 * QUIET_NS, table(r0=stat(held=9000, rx=5), r3=stat(occ=1500))) == []


def test_bytes_waiting_for_a_port_whose_cable_is_down_are_leaks():
    # the switch took 9000 B in for port 3, whose cable went down: the kernel dropped them, the
    # program still counts them into port 3's occupancy
    counters = table(r0=stat(held=9000, rx=5, paused=1), r3=stat(occ=9000))
    repair = LeakRepair([ACCOUNT])
    repair.set_dead([3], True)
    fixes = settle(repair, counters)
    assert [(f.held_before, f.held_after, f.resume) for f in fixes] == [(9000, 0, 7)]   # and XON sent
    # with the cable back, its queue counts again
    repair.set_dead([3], False)
    assert repair.dead == frozenset()
    assert settle(LeakRepair([ACCOUNT]), counters) == []


def test_a_count_within_the_range_is_never_touched():
    repair = LeakRepair([ACCOUNT])
    assert settle(repair, table(r0=stat(held=1200, rx=5, occ=400), r3=stat(occ=900))) == []


def test_a_busy_port_is_not_repaired_until_quiet():
    repair = LeakRepair([ACCOUNT])
    for rx in range(10):            # packets keep arriving: its bytes may still be inside OVS
        assert repair.check(rx * QUIET_NS, table(r0=stat(held=50_000, rx=rx))) == []
    last = 9 * QUIET_NS             # the last arrival was seen then
    assert repair.check(last + QUIET_NS // 2, table(r0=stat(held=50_000, rx=9))) == []
    assert len(repair.check(last + QUIET_NS, table(r0=stat(held=50_000, rx=9)))) == 1


def test_a_negative_count_goes_up_to_zero_with_a_negative_bias():
    repair = LeakRepair([ACCOUNT])
    fixes = settle(repair, table(r0=stat(held=-3000, rx=2)))
    assert [(f.held_after, f.bias) for f in fixes] == [(0, -3000)]


def test_the_bias_accumulates_over_repairs():
    repair = LeakRepair([ACCOUNT])
    settle(repair, table(r0=stat(held=4000, rx=1)))
    # the raw count went on from 4000; 2500 more leaked
    fixes = repair.check(2 * QUIET_NS, table(r0=stat(held=6500, rx=1)))
    assert [(f.held_before, f.held_after, f.bias) for f in fixes] == [(2500, 0, 6500)]


def test_a_port_left_paused_below_xon_resumes_its_upstream():
    repair = LeakRepair([ACCOUNT])
    fixes = settle(repair, table(r0=stat(held=60_000, rx=3, paused=1), r3=stat(occ=800)))
    assert fixes[0].resume == 7
    # still above XON after the repair (its egress queues hold more): stays paused
    repair = LeakRepair([ACCOUNT])
    fixes = settle(repair, table(r0=stat(held=60_000, rx=3, paused=1), r3=stat(occ=5000)))
    assert fixes[0].held_after == 5000 and fixes[0].resume is None


def test_a_quiet_port_paused_at_or_below_xon_without_a_leak_resumes_its_upstream_once():
    repair = LeakRepair([ACCOUNT])
    stuck = table(r0=stat(held=400, rx=3, paused=1), r3=stat(occ=400))     # 400 B: within range
    fixes = settle(repair, stuck)
    assert [(f.held_before, f.held_after, f.bytes, f.resume) for f in fixes] == [(400, 400, 0, 7)]
    assert repair.check(3 * QUIET_NS, stuck) == []            # once, not every check
    # paused again later (new traffic came and went): opened again
    assert repair.check(4 * QUIET_NS, table(r0=stat(held=300, rx=9, paused=1), r3=stat(occ=300))) == []
    assert len(repair.check(5 * QUIET_NS, table(r0=stat(held=300, rx=9, paused=1), r3=stat(occ=300)))) == 1
    # above XON it is a real pause: left alone
    busy = LeakRepair([ACCOUNT])
    assert settle(busy, table(r0=stat(held=1500, rx=3, paused=1), r3=stat(occ=1500))) == []


def test_a_class_without_pfc_is_repaired_but_resumes_nothing():
    lossy = Account(row=2, port="l1-eth1", cls="lossy", egress_rows=(2,), xon=None, upstream=None)
    repair = LeakRepair([lossy])
    fixes = settle(repair, {2: stat(held=3000, rx=1, paused=1)})
    assert fixes[0].held_after == 0 and fixes[0].resume is None


def test_accounts_cover_every_switch_port_and_class_with_its_switchs_egress_rows():
    def port(idx, node, role, peer):
        return PortInfo(idx, f"{node}-p{idx}", node, role, peer, "?", 10.0, 65536, None)
    ports = [port(0, "h1", "host", 1), port(1, "l1", "leaf", 0), port(2, "l1", "leaf", 3), port(3, "s1", "spine", 2)]
    accounts = accounts_of(ports, 3, CLASSES, lambda p, cls: 900 if cls == LOSSLESS else None)
    rows = {a.row: a for a in accounts}
    assert sorted(rows) == [3, 4, 5, 6, 7, 8, 9, 10, 11]      # ports 1-3, three classes; no host rows
    assert rows[3].egress_rows == (3, 6) and rows[3].upstream == 0 and rows[3].xon == 900
    assert rows[5].egress_rows == (5, 8) and rows[5].xon is None and rows[5].upstream is None
    assert rows[9].egress_rows == (9,)


class FakeMap:
    def __init__(self, values=None):
        self.values = values or {}
        self.updates = []

    def lookup_all(self, count):
        return [self.values.get(i, stat()) for i in range(count)]

    def update(self, key, value):
        self.updates.append((key, value.value))


class FakeGates:
    def __init__(self):
        self.calls = []

    def set(self, ns_pid, ifindex, rate, burst, limit, name):
        self.calls.append((name, rate))


def test_the_agent_writes_the_bias_and_opens_the_gate_left_closed():
    ports = {i: types.SimpleNamespace(ns_pid=None, ifindex=i, name=f"p{i}", open_rate_bytes=1000,
                                      open_burst=1, closed_burst=1, gate_limit=1) for i in range(3)}
    stats = FakeMap({0: stat(held=60_000, rx=4, paused=1)})
    dp = types.SimpleNamespace(stats=stats, bias=FakeMap())
    now = [0]
    gates = FakeGates()
    agent = PfcAgent(dp, ports, gates, PfcSettings(watchdog_ms=0), clock=lambda: now[0],
                     leaks=LeakRepair([Account(0, "p0", "lossless", (0,), 1000, 2)]))
    agent.state[2].wanted = True                      # the XOFF that will never be followed by an XON
    agent.tick()
    assert agent.state[2].closed and gates.calls == [("p2", CLOSED_RATE)]
    now[0] = QUIET_NS + LEAK_CHECK_NS
    agent.tick()
    assert dp.bias.updates == [(0, 60_000)]
    assert not agent.state[2].closed and gates.calls[-1] == ("p2", 1000)
    assert [r.describe()["bytes"] for r in agent.repairs] == [60_000]


@pytest.mark.parametrize("elapsed", [0, LEAK_CHECK_NS - 1])
def test_the_agent_checks_at_most_every_leak_check_interval(elapsed):
    ports = {0: types.SimpleNamespace(ns_pid=None, ifindex=0, name="p0", open_rate_bytes=1, open_burst=1,
                                      closed_burst=1, gate_limit=1)}
    calls = []
    leaks = types.SimpleNamespace(check=lambda now, stats: calls.append(now) or [])
    dp = types.SimpleNamespace(stats=FakeMap(), bias=FakeMap())
    now = [LEAK_CHECK_NS]
    agent = PfcAgent(dp, ports, FakeGates(), PfcSettings(watchdog_ms=0), clock=lambda: now[0], leaks=leaks)
    agent.tick()
    now[0] += elapsed
    agent.tick()
    assert calls == [LEAK_CHECK_NS]
