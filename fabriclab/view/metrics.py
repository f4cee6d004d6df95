"""A running lab's counters for Prometheus, in the OpenMetrics text format:

    sudo .venv/bin/fabriclab up default --metrics 127.0.0.1:9464
    curl -s http://127.0.0.1:9464/metrics

Per switch port (labels `switch`, `port` its OpenFlow number, `intf`, `peer`): bytes, packets and
drops each way, the link's rate; with the queue model, its lossless queue's occupancy and high
water mark, ECN marks, the queue's drops, the pause frames it sent and whether it is pausing
its peer now. Per job started at the prompt (labels `job_number`, `job_label`; `job` is
Prometheus' own): its progress, and once done its bus bandwidth. Names and units follow Prometheus' conventions (base units, `_total` on
counters); every scrape reads the counters then, so Prometheus' own `rate()` gives the rates.

The endpoint serves `/metrics` only, with no token (a scraper sends none): it binds loopback by
default, and the address is taken before the fabric is built, so a busy port costs nothing.
"""

from __future__ import annotations

import http.server
import threading

from fabriclab.measure.counters import SYS_NET, read_counters
from fabriclab.view import METRICS_ADDRESS
from fabriclab.view.live import read_queue_ports
from fabriclab.view.server import http_server, is_loopback, parse_address

CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
# (family, type, help, counter, unit): the port families, read from /sys/class/net statistics
PORT_FAMILIES = (
    ("fabriclab_port_transmit_bytes", "counter", "bytes a switch port sent", "tx_bytes", "bytes"),
    ("fabriclab_port_receive_bytes", "counter", "bytes a switch port received", "rx_bytes", "bytes"),
    ("fabriclab_port_transmit_packets", "counter", "packets a switch port sent", "tx_packets", ""),
    ("fabriclab_port_receive_packets", "counter", "packets a switch port received", "rx_packets", ""),
    ("fabriclab_port_transmit_drops", "counter", "packets a switch port dropped on sending", "tx_dropped", ""),
    ("fabriclab_port_receive_drops", "counter", "packets a switch port dropped on receiving", "rx_dropped", ""),
)
# the queue model's fields (queues/ stats map, classes summed): (family, type, help, field, unit)
QUEUE_FAMILIES = (
    ("fabriclab_queue_bytes", "gauge", "bytes in the port's lossless queue now", "occ", "bytes"),
    ("fabriclab_queue_high_water_bytes", "gauge", "the lossless queue's high water mark", "high", "bytes"),
    ("fabriclab_queue_ecn_marks", "counter", "packets the queue marked ECN CE", "marks", ""),
    ("fabriclab_queue_drops", "counter", "packets the queue model dropped", "drops", ""),
    ("fabriclab_pfc_pause_frames", "counter", "PFC pause frames the port sent its peer", "pause_tx", ""),
    ("fabriclab_pfc_pausing", "gauge", "1 while the port holds its peer paused", "paused", ""),
)


def _labels(**labels):
    def value(text):
        return str(text).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')

    return "{" + ",".join(f'{k}="{value(v)}"' for k, v in labels.items()) + "}"


def _family(lines, name, kind, text, unit, samples):
    """One metric family: its metadata, then a sample per (labels, value)."""
    lines.append(f"# TYPE {name} {kind}")
    if unit:
        lines.append(f"# UNIT {name} {unit}")
    lines.append(f"# HELP {name} {text}.")
    suffix = "_total" if kind == "counter" else ""
    lines += [f"{name}{suffix}{labels} {value}" for labels, value in samples]


def ports(fabric):
    """[(labels, interface)] of every switch port, in the fabric's order."""
    peers = {}
    for link in fabric.links:
        peers[link.a_intf], peers[link.b_intf] = link.b, link.a
    return [(_labels(switch=s, port=port, intf=intf, peer=peers.get(intf, "")), intf)
            for s in fabric.switches for port, intf in fabric.switch_ports(s).items()]


def render(fabric, counters, queues=None, jobs=()):
    """The exposition: `counters` {interface: {tx_bytes, ...}} (read_counters), `queues` {port:
    fields} of the queue model (None without one), `jobs` [(number, label, progress 0-1, busbw
    Mbit/s or None)]."""
    lines = []
    rows = ports(fabric)
    for name, kind, text, counter, unit in PORT_FAMILIES:
        _family(lines, name, kind, text, unit,
                [(labels, counters[intf][counter]) for labels, intf in rows if counter in counters.get(intf, {})])
    rates = {}
    for link in fabric.links:
        rates[link.a_intf] = rates[link.b_intf] = link.rate_mbps * 1e6
    _family(lines, "fabriclab_port_rate_bits_per_second", "gauge", "the link's rate in the lab (the spec's)",
            "", [(labels, f"{rates[intf]:g}") for labels, intf in rows if intf in rates])
    if queues is not None:
        for name, kind, text, field, unit in QUEUE_FAMILIES:
            _family(lines, name, kind, text, unit,
                    [(labels, int(queues[intf][field])) for labels, intf in rows if field in queues.get(intf, {})])
    _family(lines, "fabriclab_job_progress_ratio", "gauge", "how far a job started at the prompt has run (1: done)",
            "", [(_labels(job_number=n, job_label=label), f"{p:g}") for n, label, p, _b in jobs if p is not None])
    _family(lines, "fabriclab_job_busbw_bits_per_second", "gauge", "a finished job's bus bandwidth (its last size)",
            "", [(_labels(job_number=n, job_label=label), f"{b * 1e6:g}") for n, label, _p, b in jobs if b is not None])
    return "\n".join(lines + ["# EOF", ""])


class MetricsServer:
    """`/metrics` of a running lab on its own address (bind() before the fabric is built)."""

    def __init__(self, lab, session=None, address=METRICS_ADDRESS, sys_net=SYS_NET):
        self.lab, self.session, self.sys_net = lab, session, sys_net
        self.host, self.port = parse_address(address, "metrics address")
        self.httpd = None
        self.thread = None

    def bind(self):
        self.httpd = http_server(self.host, self.port, _Handler, "metrics", "--metrics")
        self.httpd.metrics = self
        self.port = self.httpd.server_address[1]
        return self

    def serve(self):
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                       name="metrics", daemon=True)
        self.thread.start()
        return self

    @property
    def url(self):
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def banner(self):
        where = "" if is_loopback(self.host) else " (not loopback: anyone who reaches it reads the counters)"
        return f"Prometheus metrics: {self.url}{where}"

    def text(self):
        fabric = self.lab.fabric
        intfs = [intf for _labels, intf in ports(fabric)]
        counters = read_counters(intfs, sys_net=self.sys_net)
        jobs = self.session.job_figures() if self.session is not None else []
        return render(fabric, counters, read_queue_ports(self.lab.queues), jobs)

    def stop(self):
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None


class _Handler(http.server.BaseHTTPRequestHandler):
    server_version = "fabriclab-metrics"

    def log_message(self, *_args):          # the prompt's terminal is not a web log
        pass

    def do_GET(self):
        if self.path.split("?", 1)[0] != "/metrics":
            self._send(404, b"only /metrics here\n", "text/plain; charset=utf-8")
            return
        try:
            body = self.server.metrics.text().encode()
        except Exception as exc:          # noqa: BLE001 - a scrape that fails says why, the lab goes on
            self._send(500, f"reading the lab failed: {type(exc).__name__}: {exc}\n".encode()[:500],
                       "text/plain; charset=utf-8")
            return
        self._send(200, body, CONTENT_TYPE)

    def _send(self, code, body, kind):
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)
