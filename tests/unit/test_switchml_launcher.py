"""SwitchML's placement, steering plan and defaults on a fabric, without a network."""

import pytest

from fabriclab.lab import portloss
from fabriclab.apps.steering import steering_state
from fabriclab.errors import LabError
from fabriclab.switchml import launcher
from fabriclab.switchml.launcher import AggregationSpec
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import FabricSpec
from fabriclab.traffic import agent_process

FABRIC = Fabric(FabricSpec(name="t-sml", leaves=2, spines=2, hosts_per_leaf=4,
                           host_rate_mbps=10, fabric_rate_mbps=10))


def test_one_rack_by_default_and_every_leaf_with_hierarchy():
    p = launcher.place(FABRIC, AggregationSpec())
    assert p.aggregators == {"l1": "h4"} and p.workers == {"l1": ["h1", "h2", "h3"]}
    p = launcher.place(FABRIC, AggregationSpec(hierarchy=True))
    assert p.aggregators == {"l1": "h4", "l2": "h8"} and p.workers["l2"] == ["h5", "h6", "h7"]
    p = launcher.place(FABRIC, AggregationSpec(workers=("h2", "h3"), aggregators=("h1",)))
    assert p.aggregators == {"l1": "h1"} and p.workers == {"l1": ["h2", "h3"]}
    with pytest.raises(LabError, match="h4 cannot be both a worker and its leaf's aggregator"):
        launcher.place(FABRIC, AggregationSpec(workers=("h1", "h4")))
    with pytest.raises(LabError, match="hierarchy needs workers under at least two leaves"):
        launcher.place(FABRIC, AggregationSpec(workers=("h1", "h2"), hierarchy=True))


def test_the_plan_steers_each_leaf_and_with_hierarchy_the_spine():
    p = launcher.place(FABRIC, AggregationSpec(hierarchy=True))
    plan = launcher.steering_plan(FABRIC, p, hierarchy=True)
    services = {(e["switch"], e["address"], e["udp_dst"]) for e in plan["services"]}
    assert services == {("l1", "10.1.255.1", launcher.PORT), ("l2", "10.1.255.2", launcher.PORT),
                        ("s1", "10.1.255.101", launcher.ROOT_PORT)}
    spine_group = next(g for g in plan["groups"] if g["switch"] == "s1")
    assert [m["ip"] for m in spine_group["members"]] == [FABRIC.hosts[h].ports[0].ip for h in ("h4", "h8")]
    assert {(r["switch"], r["address"]) for r in plan["routes"]} == {
        ("l1", "10.1.255.101"), ("l2", "10.1.255.101"), ("l1", "10.1.254.101")}
    assert plan["root"]["host"] == "h4"
    steering_state(FABRIC, plan)              # the controller would take it


def test_defaults_follow_the_buffer_and_the_link_rate():
    wire = 20 + 4 * 256 + 28 + 14
    assert launcher.default_slots(FABRIC, 3, 256) == FABRIC.spec.buffers.leaf // 2 // (3 * wire)
    assert launcher.default_slots(FABRIC, 1000, 256) == 1
    ms = launcher.default_timeout_ms(FABRIC, 10, 256)
    assert ms == pytest.approx(3 * 2 * 10 * wire * 8 / 10e6 * 1e3)
    assert launcher.default_timeout_ms(FABRIC, 1, 1) == 10.0            # a floor for tiny pools


def test_loss_threshold_is_the_fraction_of_32_bits():
    assert portloss.threshold(0) == 0 and portloss.threshold(0.5) == 2**31
    assert portloss.threshold(1) == 2**32 - 1
    with pytest.raises(LabError, match="loss must be a fraction in 0..1"):
        portloss.threshold(1.5)


def test_readiness_waits_for_the_slowest_other_machine_its_hosts_use():
    import types

    from fabriclab.traffic import agent_process

    asked = []
    guest = types.SimpleNamespace(name="guest")
    cluster = types.SimpleNamespace(
        remote_machines=lambda hosts: [guest] if "h3" in list(hosts) else [],
        agent_start_s=lambda machine, module: asked.append(module) or 6.0)
    lab = types.SimpleNamespace(cluster=cluster)
    assert agent_process.ready_timeout_s(lab, ["h1", "h3"], launcher.NODE_MODULE, 1.5) == 1.5 + 1.5 * 6.0
    assert agent_process.ready_timeout_s(lab, ["h1"], launcher.NODE_MODULE, 1.5) == 1.5
    assert agent_process.ready_timeout_s(types.SimpleNamespace(), ["h3"], launcher.NODE_MODULE, 1.5) == 1.5
    assert asked == [launcher.NODE_MODULE]


def test_a_workers_result_is_read_where_it_ran_and_must_be_a_tensor(tmp_path):
    import io
    import types

    import numpy as np

    buf = io.BytesIO()
    np.save(buf, np.arange(5, dtype=np.int32))
    limits = []
    cluster = types.SimpleNamespace(
        machine_of_name=lambda name: types.SimpleNamespace(name="guest", local=False),
        pull=lambda machine, path, limit, binary=False: limits.append(limit) or buf.getvalue())
    lab = types.SimpleNamespace(cluster=cluster)
    got = launcher._tensor(lab, "h3", tmp_path / "out-1.npy", 5)
    assert got.tolist() == [0, 1, 2, 3, 4] and limits == [5 * 8 + launcher.NPY_HEADER_MAX]
    cluster.pull = lambda machine, path, limit, binary=False: b"not a tensor"
    with pytest.raises(LabError, match=r"the result of h3 \(out-1.npy\) is not a tensor"):
        launcher._tensor(lab, "h3", tmp_path / "out-1.npy", 5)


def test_a_nodes_start_time_on_its_command_line_must_be_near(tmp_path, capsys):
    import json
    import time

    from fabriclab.switchml import node

    cfg = tmp_path / "w.json"
    cfg.write_text(json.dumps({"role": "worker"}))
    for bad in ("nan", "inf", repr(time.time() + 10 * node.MAX_START_DELAY_S)):
        with pytest.raises(SystemExit):
            node.main([str(cfg), "--start-at", bad])
    assert "--start-at is not a time within" in capsys.readouterr().err


def test_an_aggregator_stops_when_its_stop_file_appears_and_reports_its_counters(tmp_path):
    import json
    import subprocess
    import sys
    import time

    stop = tmp_path / "agg.stop"
    cfg = tmp_path / "agg.json"
    cfg.write_text(json.dumps({"role": "aggregator", "name": "agg-l1", "level": 1, "capacity": 8,
                               "slot_elements": 4, "jobs": [], "bind": "127.0.0.1", "port": 0,
                               "stop_file": str(stop)}))
    proc = subprocess.Popen([sys.executable, "-m", launcher.NODE_MODULE, str(cfg)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        agent_process.wait_ready(proc, "agg-l1", time.monotonic() + 60)
        time.sleep(0.5)
        assert proc.poll() is None                      # no input to end it: it waits for the file
        stop.write_text("")
        doc = launcher._finish(proc, "agg-l1", 30)
    finally:
        proc.kill()
        proc.wait()
    assert doc["name"] == "agg-l1" and doc["counters"]["received"] == 0


@pytest.mark.parametrize("start_in_s", [0.0, 60.0, None])
def test_a_worker_stops_when_its_stop_file_appears_waiting_or_aggregating(tmp_path, start_in_s):
    # Over SSH the launcher cannot kill a cancelled worker on another machine: its stop file ends it.
    # None: a gated worker, ready and waiting for its start time on stdin
    import json
    import subprocess
    import sys
    import time

    stop = tmp_path / "w0.stop"
    cfg = tmp_path / "w0.json"
    cfg.write_text(json.dumps({
        "role": "worker", "rank": 0, "worker_id": 0, "address": "127.0.0.1", "service": "127.0.0.1",
        "iterations": 1, "start_at": None if start_in_s is None else time.time() + start_in_s,
        "timeout_s": 0.05, "deadline_s": 120,
        "output": str(tmp_path / "out-0.npy"), "stop_file": str(stop),
        "job": {"job_id": 1, "workers_here": 2, "workers": 2, "slots": 2, "elements": 4},    # no peer: never done
        "tensor": {"dtype": "int32", "elements": 16, "seed": 1}}))
    gate = start_in_s is None
    proc = subprocess.Popen([sys.executable, "-m", launcher.NODE_MODULE, str(cfg), *(["--start-on-stdin"] * gate)],
                            stdin=subprocess.PIPE if gate else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        if gate:
            agent_process.wait_ready(proc, "w0", time.monotonic() + 60)
        time.sleep(1.5)
        assert proc.poll() is None, proc.communicate()
        stop.write_text("")
        t0 = time.monotonic()
        out, _err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    assert time.monotonic() - t0 < 5 and proc.returncode == 5
    assert json.loads(out.decode().splitlines()[-1]) == {"error": "stopped by the launcher"}
    assert not (tmp_path / "out-0.npy").exists()
