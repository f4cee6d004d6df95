"""The text tables the verbs print, read from a results document (never from a live lab)."""

from __future__ import annotations

from fabriclab import jobs
from fabriclab.jobs.collective import both_modes, cross_zone_text, mode, rail_split
from fabriclab.table import format_table
from fabriclab.units import human_size


def scale_line(doc):
    scale = doc["scale"]
    return (f"links {scale['host_rate_mbps']:g} Mbit/s"
            + (f" (time scale x{scale['time_scale']:.0f})" if scale.get("time_scale") else ""))


def job_of(doc, kind):
    """(run, job name, job record) of the first measured job of `kind` in the document."""
    for run in doc["runs"]:
        for name, job in run["jobs"].items():
            if job["kind"] == kind and job["role"] == "measured":
                return run, name, job
    raise ValueError(f"no measured {kind} job in this document")


# -- all-pairs (run, demo, the prompt's traffic) ----------------------------------------------------
def uplink_table(links, title="Fabric link utilization (steady state)"):
    """Table of telemetry.link_utilization rows."""
    rows = [(r["link"], f"{r['from']}->{r['to']}", f"{r['mbps']:.2f}", f"{100 * r['utilization']:.1f}",
             r["drops"]) for r in links]
    return format_table(("link", "direction", "Mbit/s", "util %", "drops"), rows, title=title)


def allpairs_summary(doc):
    run, _name, job = job_of(doc, "all-pairs")
    up, down = job["balance"]["up"], job["balance"]["down"]
    t = job["traffic"]
    scale = doc["scale"]
    rows = [
        ("routing", run["routing"]),
        ("fabric", f"{doc['fabric']['name']}: {doc['fabric']['switches']} switches, "
                   f"{doc['fabric']['hosts']} hosts, oversubscription {doc['fabric']['oversubscription']}"),
        ("link rates", f"host {scale['host_rate_mbps']} Mbit/s, fabric {scale['fabric_rate_mbps']} Mbit/s"
                       + (f" (time scale x{scale['time_scale']:.0f})" if scale["time_scale"] else "")),
        ("flows", t["flows"]),
        ("delivered", f"{t['delivered_mbps']} Mbit/s, loss {100 * (t['loss'] or 0):.2f} %, OOS {t['oos']}"),
        ("uplink max/mean", up.get("max_mean_ratio")),
        ("downlink max/mean", down.get("max_mean_ratio")),
        ("cpu busy", cpu_text(job["cpu"]) + ("" if job["valid"] else "  (SATURATED: results not valid)")),
    ]
    for fault in run["faults"]:
        hit = fault.get("impact") or {}
        rows.append((f"fault {fault['label']}", f"at {_num(fault['at_s'])} s, delivered fell to "
                     f"{_num(hit.get('min_mbps'))} Mbit/s, recovered in {_num(hit.get('recovery_s'))} s"
                     if fault["at_s"] is not None else fault.get("note", "")))
    return format_table(("metric", "value"), rows, title="Summary")


def cpu_text(cpu):
    machine = f"machine {100 * cpu['machine']:.0f} %" if cpu.get("machine") is not None else "machine ?"
    ovs = cpu.get("ovs_forwarding")
    return machine + (f", OVS forwarding thread {100 * ovs:.0f} %" if ovs is not None else "")


# -- collectives ----------------------------------------------------------------------------------
def collective_table(doc):
    """A row per message size (and mode, when the job ran in place too) of the document's collective
    job, nccl-tests' numbers and the RNIC's."""
    run, _name, job = job_of(doc, "collective")
    modes = both_modes(job["sizes"])
    # On a multiplane fabric: what share of the data each plane carried (the PLB's split).
    shares = any(len((row.get("planes") or {}).get("share") or ()) > 1 for row in job["sizes"])
    # On a rail-cabled fabric: where an iteration's bytes went (rail-local, through the spines on
    # the rail, onto another rail, and PXN's intra-host hops).
    rails = doc["fabric"].get("cabling") == "rail" and all("rails" in row for row in job["sizes"])
    zoned = any("cross_zone" in row for row in job["sizes"])
    rows = []
    for row in job["sizes"]:
        t, c = row["cct_ms"], row["counters"]
        # n/a: verification asked, but this mode's result is undefined (in-place AlltoAll)
        unchecked = "n/a" if job["workload"].get("verify") else "-"
        verify = unchecked if row["verify"] is None else ("ok" if row["verify"]["ok"] else "FAILED")
        rows.append((human_size(row["size"]),) + ((mode(row),) if modes else ()) + (
                     f"{t['mean']:.1f}", f"{t['p50']:.1f}", f"{t['p99']:.1f}",
                     f"{row['algbw_mbps']:.2f}", f"{row['busbw_mbps']:.2f}",
                     f"{100 * row['busbw_fraction_of_nic']:.0f}",
                     row["balance"]["up"].get("max_mean_ratio"),
                     c.get("out_of_sequence", "-"), c.get("retransmitted_packets", c.get("retries", "-")),
                     c.get("local_ack_timeout_err", "-"), c.get("cnp_sent", "-"))
                    + ((plane_shares(row),) if shares else ())
                    + ((rail_split(row["rails"]),) if rails else ())
                    + ((cross_zone_text(row),) if zoned else ())
                    + (verify + (" (CPU SATURATED)" if any(r.startswith("CPU") for r in row["invalid"]) else ""),))
    w = job["workload"]
    first = job["sizes"][0]
    plb = job.get("plb")
    title = (f"{w['collective']}/{first['algorithm']} over {first['ranks']} ranks on {doc['fabric']['name']} "
             f"({run['routing']}), backend {job['backend']}, {w['channels']} channel(s), "
             f"{w['qps']} QP(s) per connection ({w['qp_method']})"
             + (f", plb {plb['mode']}" if plb else "") + f", {scale_line(doc)}")
    return format_table(("size",) + (("mode",) if modes else ()) + (
                         "CCT mean ms", "p50 ms", "p99 ms", "algbw Mbit/s", "busbw Mbit/s",
                         "busbw % NIC", "uplink max/mean", "OOS",
                         # rdma_rxe counts the requester's go-back-N restarts, not packets
                         "retries" if job["backend"] == "rdma_rxe" else "retrans",
                         "timeouts", "CNPs") + (("plane shares %",) if shares else ())
                        + (("rail-local/cross-group/cross-rail/PXN",) if rails else ())
                        + (("cross-zone MiB sched/wire",) if zoned else ()) + ("verify",),
                        rows, title=title)


# -- replayed traces ------------------------------------------------------------------------------
def replay_table(doc):
    """Per replayed job: its table (jobs/replay.py), one after another."""
    from fabriclab.jobs import replay

    return "\n\n".join(replay.table(doc, run, name, job, scale_line(doc))
                        for run in doc["runs"] for name, job in run["jobs"].items() if job["kind"] == replay.NAME)


def plane_shares(row):
    """Each plane's share of the data a size sent, in percent: `25/25/25/25`."""
    share = (row.get("planes") or {}).get("share") or ()
    return "/".join("-" if s is None else f"{100 * s:.0f}" for s in share) or "-"


# -- several runs (scenarios) -----------------------------------------------------------------------
def runs_table(doc):
    """Per run: a row per job and size, then its faults and what the symmetry check flagged."""
    out = [f"fabric {doc['fabric']['name']}, {scale_line(doc)}"]
    rows = []
    for run in doc["runs"]:
        for name, job in run["jobs"].items():
            label = name + (" (noise)" if job["role"] == "noise" else "")
            kind = jobs.recorded(job["kind"])
            rows += [(run["label"], label, *row) for row in (kind.runs_rows(job) if kind else ())]
    out.append(format_table(("run", "job", "workload", "busbw Mbit/s", "CCT p50 ms", "p99", "OOS",
                             "retrans", "LAT"), rows, title="Jobs (all-pairs: delivered Mbit/s in brackets; replay: its "
                                                           "collectives' total CCT)"))
    rows = []
    for run in doc["runs"]:
        for f in run["faults"]:
            hit = f.get("impact") or {}
            rows.append((run["label"], f["label"], _num(f["at_s"]), _num(f["until_s"]),
                         _num(hit.get("baseline_mbps")), _num(hit.get("min_mbps")),
                         _num(f.get("recovery_s_mean", hit.get("recovery_s"))), _num(hit.get("retained")),
                         f.get("note", "")))
    if rows:
        out.append(format_table(("run", "fault", "at s", "until s", "before Mbit/s", "lowest", "recovery s",
                                 "retained", "note"), rows, title="Faults (delivered traffic around each)"))
    for run in doc["runs"]:
        t = run["telemetry"]
        flagged = ", ".join(f"{member} in {group} ({metric} {100 * dev:+.0f} %)"
                            for group, member, dev, metric in t["outliers"][:6])
        if len(t["outliers"]) > 6:
            flagged += f" and {len(t['outliers']) - 6} more (report.md)"
        sampling = t["sampling"].get("reached_median_s")
        out.append(f"{run['label']}: uplink max/mean {_num(t['uplink_max_mean'])}; "
                   f"outliers: {flagged or 'none'}; stragglers: {', '.join(t['stragglers']) or 'none'}"
                   + (f"; sampled every {sampling * 1e3:.1f} ms" if sampling else ""))
    return "\n\n".join(out)


def _num(value):
    return "-" if value is None else f"{value:.3g}"
