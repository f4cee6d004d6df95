"""Results files and the tables printed from them.

Every results.json says what ran and at what scale: the spec (link rates, buffers, time scale),
the mechanisms the kernel allowed, the routing app, the workload, and how busy the CPU was. A run
whose CPU was saturated is marked invalid, because then the software switches, not the fabric,
set the numbers.
"""

from __future__ import annotations

import json
import os
import pathlib
import platform
import time

from fabriclab import __version__

from fabriclab.measure import cpuload

from fabriclab.measure import telemetry
from fabriclab.table import format_table


def run_header(lab, payload_bytes):
    """What every results document of a lab run starts with: versions, scale, mechanisms, spec."""
    fabric = lab.fabric
    spec = fabric.spec
    return {
        "fabriclab": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"kernel": platform.release(), "cpus": os.cpu_count()},
        "scale": {
            "host_rate_mbps": spec.host_rate_mbps,
            "fabric_rate_mbps": spec.fabric_rate_mbps,
            "mtu": spec.mtu,
            "roce_payload_bytes": payload_bytes,
            "buffers_bytes": fabric.summary()["buffers_bytes"],
            "real_host_rate_mbps": spec.real_host_rate_mbps,
            "time_scale": spec.time_scale,
            "link_delay": link_delay(lab),
            "note": "emulated rates; time_scale = real_host_rate / host_rate when the spec states it",
        },
        "mechanisms": {"ovs_datapath": lab.datapath,
                       "shaping": "htb+bfifo" if getattr(lab, "queues", None) is None else "htb classes+tbf gate",
                       "ecn": getattr(lab, "ecn_mechanism", "none"),
                       "delay": getattr(lab, "delay_mechanism", "none"),
                       "queue_model": lab.queues.describe() if getattr(lab, "queues", None) else None},
        "warnings": list(getattr(lab, "warnings", ())),
        "spec": spec.to_dict(),
        "fabric": fabric.summary(),
        "routing": lab.routing,
        "timings_s": {k: round(v, 3) for k, v in lab.timings.items()},
    }


def link_delay(lab):
    """The spec's one-way delay per cable kind, real and in the lab, and whether the lab ran it."""
    spec = lab.fabric.spec
    kinds = ("host", "fabric")
    return {"real_us": {kind: getattr(spec.delay, f"{kind}_us") for kind in kinds},
            "lab_ms": {kind: spec.lab_delay_ms(kind) for kind in kinds},
            "applied": getattr(lab, "delay_mechanism", "none") == "netem"}


def build_result(lab, workload, run, extra=None):
    """The results document of one traffic run on a lab (CPU load over its steady state)."""
    cpu = run.cpu()
    links = telemetry.link_utilization(lab.fabric, *run.window)
    return {
        **run_header(lab, run.payload_bytes),
        "kind": "all-pairs",
        "workload": workload,
        "cpu": cpu,
        "valid": cpuload.valid(cpu),
        "traffic": run.totals(),
        "balance": {"up": telemetry.balance(links, "up"), "down": telemetry.balance(links, "down")},
        "links": links,
        "flows": run.flow_rows(),
        "actions": run.actions,
        **(extra or {}),
    }


def write_result(doc, out_dir=None):
    """Write results.json into out_dir (default results/<time>-<spec>/); returns the path."""
    if out_dir is None:
        out_dir = pathlib.Path("results") / f"{time.strftime('%Y%m%d-%H%M%S')}-{doc['spec']['name']}"
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "results.json"
    path.write_text(json.dumps(doc, indent=1))
    return path


def uplink_table(links, title="Fabric link utilization (steady state)"):
    """Table of telemetry.link_utilization rows."""
    rows = [(r["link"], f"{r['from']}->{r['to']}", f"{r['mbps']:.2f}", f"{100 * r['utilization']:.1f}",
             r["drops"]) for r in links]
    return format_table(("link", "direction", "Mbit/s", "util %", "drops"), rows, title=title)


def summary_table(doc):
    up, down = doc["balance"]["up"], doc["balance"]["down"]
    t = doc["traffic"]
    scale = doc["scale"]
    rows = [
        ("routing", doc["routing"]),
        ("fabric", f"{doc['fabric']['name']}: {doc['fabric']['switches']} switches, "
                   f"{doc['fabric']['hosts']} hosts, oversubscription {doc['fabric']['oversubscription']}"),
        ("link rates", f"host {scale['host_rate_mbps']} Mbit/s, fabric {scale['fabric_rate_mbps']} Mbit/s"
                       + (f" (time scale x{scale['time_scale']:.0f})" if scale["time_scale"] else "")),
        ("flows", t["flows"]),
        ("delivered", f"{t['delivered_mbps']} Mbit/s, loss {100 * (t['loss'] or 0):.2f} %, OOS {t['oos']}"),
        ("uplink max/mean", up.get("max_mean_ratio")),
        ("downlink max/mean", down.get("max_mean_ratio")),
        ("cpu busy", _cpu_text(doc["cpu"]) + ("" if doc["valid"] else "  (SATURATED: results not valid)")),
    ]
    return format_table(("metric", "value"), rows, title="Summary")


def _cpu_text(cpu):
    machine = f"machine {100 * cpu['machine']:.0f} %" if cpu.get("machine") is not None else "machine ?"
    ovs = cpu.get("ovs_forwarding")
    return machine + (f", OVS forwarding thread {100 * ovs:.0f} %" if ovs is not None else "")
