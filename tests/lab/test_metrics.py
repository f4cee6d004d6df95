"""`up --metrics` scraped by a real Prometheus (Debian's server, started here on free ports with a
configuration of its own): while the prompt runs traffic and a verified collective on tiny, the
server stores every switch port's counters, and its queries see the bytes an uplink carried and
the finished collective's bus bandwidth."""

import json
import pathlib
import socket
import subprocess
import sys
import urllib.parse
import urllib.request

import pytest

from fabriclab.system import procs

pytestmark = pytest.mark.lab

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROMETHEUS = "/usr/bin/prometheus"         # installed by the provisioning (playbooks/roles/packages)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def query(port, expr):
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as reply:
        answer = json.loads(reply.read())
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def test_prometheus_scrapes_the_running_fabric(tmp_path, figure):
    metrics_port, prometheus_port = free_port(), free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        f"scrape_configs:\n  - job_name: fabriclab\n    static_configs:\n      - targets: ['127.0.0.1:{metrics_port}']\n")
    server = subprocess.Popen([PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
                               f"--storage.tsdb.path={tmp_path / 'data'}",
                               f"--web.listen-address=127.0.0.1:{prometheus_port}"],
                              stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "w"),
                              start_new_session=True)
    try:
        script = tmp_path / "script"
        # the collective runs between two traffic phases: the second lets a scrape see it done
        script.write_text("traffic 6 0.5\ncollective --sizes 256K --iterations 2 --verify\ntraffic 4 0.5\n")
        lab = subprocess.run([sys.executable, "-m", "fabriclab.cli.main", "up", "tiny", "--metrics",
                              f"127.0.0.1:{metrics_port}", "--script", str(script)],
                             capture_output=True, text=True, timeout=300, cwd=ROOT, stdin=subprocess.DEVNULL)
        assert lab.returncode == 0, lab.stdout[-1500:] + lab.stderr[-1500:]
        assert f"Prometheus metrics: http://127.0.0.1:{metrics_port}/metrics" in lab.stdout
        # what the server stored while the lab ran (the lab is gone now: the queries read its TSDB)
        scraped = query(prometheus_port, 'max_over_time(up{job="fabriclab"}[5m])')
        assert scraped and scraped[0]["value"][1] == "1", (scraped, (tmp_path / "prometheus.log").read_text()[-800:])
        sent = query(prometheus_port, 'max by (switch, peer) (max_over_time('
                                      'fabriclab_port_transmit_bytes_total{switch="l1"}[5m]))')
        by_peer = {r["metric"]["peer"]: float(r["value"][1]) for r in sent}
        assert set(by_peer) == {"h1", "s1", "s2"}, sent
        # ~10 s of half-rate all-pairs traffic at 10 Mbit/s: megabytes to the host and up the uplinks
        assert by_peer["h1"] > 1e6 and by_peer["s1"] + by_peer["s2"] > 1e6, by_peer
        rates = query(prometheus_port, 'max_over_time(rate(fabriclab_port_transmit_bytes_total{switch="l1",'
                                       'peer="h1"}[3s])[5m:1s])')
        # bytes/s: some, and not above the 10 Mbit/s link's (a quarter over it allows Prometheus'
        # scrape timestamps, taken before the counters are read, and htb's burst of two frames).
        # Measured over 10 runs (2026-11-28, ./lab.sh test --repeat 10): 625,400-627,400 B/s
        # (sd 861), the half load of the link; the bounds are 12x below and 2.5x above.
        assert 0.5e5 < figure("l1 -> h1 peak 3 s rate, B/s", float(rates[0]["value"][1])) < 10e6 / 8 * 1.25, rates
        busbw = query(prometheus_port, 'max_over_time(fabriclab_job_busbw_bits_per_second{job_number="2"}[5m])')
        assert busbw and 1e6 < float(busbw[0]["value"][1]) < 12e6, busbw     # a 10 Mbit/s NIC
        assert busbw[0]["metric"]["job_label"].startswith("collective")
    finally:
        procs.end_group(server)
