"""`up --metrics`: the running lab's counters in the OpenMetrics text format, read back by
prometheus_client's own parser (Prometheus' reference library, not ours): families, types, units,
labels and values as Prometheus would store them; and the endpoint answering over HTTP.
tests/lab/test_metrics.py scrapes a real fabric with Debian's prometheus server."""

import types
import urllib.error
import urllib.request

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from fabriclab.errors import LabError
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import load_spec
from fabriclab.view import metrics

FABRIC = Fabric(load_spec("tiny"))


def families(text):
    return {f.name: f for f in text_string_to_metric_families(text)}


def counters(scale=1):
    return {intf: {"tx_bytes": 1000 * scale, "rx_bytes": 900 * scale, "tx_packets": 10 * scale, "rx_packets": 9,
                   "tx_dropped": 0, "rx_dropped": 1}
            for s in FABRIC.switches for intf in FABRIC.switch_ports(s).values()}


def test_every_switch_port_is_a_sample_of_each_family_with_its_labels():
    text = metrics.render(FABRIC, counters(), None, [])
    found = families(text)
    ports = [(s, port, intf) for s in FABRIC.switches for port, intf in FABRIC.switch_ports(s).items()]
    sent = found["fabriclab_port_transmit_bytes"]
    assert sent.type == "counter" and sent.unit == "bytes"
    samples = {(x.labels["switch"], int(x.labels["port"]), x.labels["intf"]): x for x in sent.samples}
    assert set(samples) == set(ports) and all(x.name.endswith("_total") and x.value == 1000 for x in samples.values())
    # a leaf's host port names the host as its peer, an uplink the spine
    peers = {(x.labels["switch"], x.labels["intf"]): x.labels["peer"] for x in sent.samples}
    assert {p for (s, _i), p in peers.items() if s == "l1"} == {"h1", "s1", "s2"}
    rate = found["fabriclab_port_rate_bits_per_second"]
    assert rate.type == "gauge" and {x.value for x in rate.samples} == {10e6}
    assert "fabriclab_queue_bytes" not in found                      # no queue model: no queue families


def test_queue_model_fields_and_jobs_become_their_families():
    intf = FABRIC.switch_ports("l1")[1]
    queues = {intf: {"occ": 3000, "high": 9000, "marks": 5, "drops": 0, "pause_tx": 2, "paused": 1}}
    jobs = [(1, "allreduce ring", 1.0, 8.25), (2, "traffic", 0.4, None)]
    found = families(metrics.render(FABRIC, counters(), queues, jobs))
    assert [(x.labels["intf"], x.value) for x in found["fabriclab_queue_bytes"].samples] == [(intf, 3000)]
    assert found["fabriclab_pfc_pause_frames"].type == "counter"
    assert [x.value for x in found["fabriclab_pfc_pausing"].samples] == [1]
    assert {x.labels["job_number"]: x.value for x in found["fabriclab_job_progress_ratio"].samples} == {"1": 1.0, "2": 0.4}
    assert [(x.labels["job_label"], x.value) for x in found["fabriclab_job_busbw_bits_per_second"].samples] == \
        [("allreduce ring", 8.25e6)]


def test_a_label_value_with_quotes_and_newlines_is_escaped():
    found = families(metrics.render(FABRIC, counters(), None, [(3, 'say "hi"\nthere\\', 0.5, None)]))
    (sample,) = found["fabriclab_job_progress_ratio"].samples
    assert sample.labels["job_label"] == 'say "hi"\nthere\\'


def test_the_endpoint_serves_metrics_and_nothing_else(monkeypatch):
    lab = types.SimpleNamespace(fabric=FABRIC, queues=None)
    monkeypatch.setattr(metrics, "read_counters", lambda intfs, sys_net: counters(2))
    server = metrics.MetricsServer(lab, None, "127.0.0.1:0").bind().serve()
    try:
        with urllib.request.urlopen(server.url, timeout=10) as reply:
            assert reply.headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
            found = families(reply.read().decode())
        assert {x.value for x in found["fabriclab_port_transmit_bytes"].samples} == {2000}
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(server.url.replace("/metrics", "/"), timeout=10)
        assert err.value.code == 404
        with pytest.raises(LabError, match=r"cannot serve metrics on 127.0.0.1:\d+: .*--metrics HOST:PORT"):
            metrics.MetricsServer(lab, None, f"127.0.0.1:{server.port}").bind()
    finally:
        server.stop()
    with pytest.raises(LabError, match="HOST:PORT"):
        metrics.MetricsServer(lab, None, "nowhere")


def test_the_grafana_dashboard_queries_only_families_the_lab_exports():
    import json
    import pathlib
    import re

    path = pathlib.Path(__file__).resolve().parents[2] / "examples" / "grafana" / "fabriclab-dashboard.json"
    board = json.loads(path.read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
    used = {name for e in exprs for name in re.findall(r"\b(fabriclab_[a-z_]+)", e)}
    text = metrics.render(FABRIC, counters(), {FABRIC.switch_ports("l1")[1]: {
        "occ": 1, "high": 1, "marks": 1, "drops": 1, "pause_tx": 1, "paused": 0}}, [(1, "j", 1.0, 1.0)])
    exported = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    assert used and used <= exported, used - exported
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])


def test_the_prompts_jobs_become_figures_running_done_and_failed():
    from fabriclab.workflows.session import JobRecord, Session
    from tests.unit import resultdocs as rd

    session = Session(types.SimpleNamespace())
    doc = rd.doc("prompt", [rd.run("r", {"ring": rd.collective_job(71.5)})])
    session.records = [JobRecord(1, "collective", 0.0, doc=doc), JobRecord(2, "traffic 5", 0.0, fraction=0.25),
                       JobRecord(3, "collective", 0.0, error="stopped")]
    busbw = doc["runs"][0]["jobs"]["ring"]["sizes"][-1]["busbw_mbps"]
    assert session.job_figures() == [(1, "collective", 1.0, busbw), (2, "traffic 5", 0.25, None),
                                     (3, "collective", None, None)]
