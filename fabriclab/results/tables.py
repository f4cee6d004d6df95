"""The text tables the verbs print, read from a results document (never from a live lab)."""

from __future__ import annotations

from fabriclab.table import format_table
from fabriclab.units import human_size


def scale_line(doc):
    scale = doc["scale"]
    return (f"links {scale['host_rate_mbps']:g} Mbit/s"
            + (f" (time scale x{scale['time_scale']:.0f})" if scale.get("time_scale") else ""))


def mode(row):
    """A size row's mode as the tables show it."""
    return "in-place" if row.get("in_place", False) else "out-of-place"


def both_modes(rows):
    """Whether a job's size rows hold in-place results (then the tables show every row's mode)."""
    return any(row.get("in_place", False) for row in rows)


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


def rail_split(rails):
    """One iteration's bytes between hosts on one leaf of a rail, through the spines on the rail,
    onto another rail, and PXN's first hops inside hosts: `96K/32K/0/32K`."""
    keys = ("rail_local_bytes", "cross_group_bytes", "cross_rail_bytes", "pxn_bytes")
    return "/".join(human_size(rails[k]) if rails[k] else "0" for k in keys)


def cross_zone_text(row):
    """threetier: the job's bytes between zones, from its schedule and from the super-spine
    links' counters, in MiB: `3.0/3.2`."""
    zone = row.get("cross_zone")
    if not zone:
        return "-"
    counted = zone["counted_bytes"]
    wire = "?" if counted is None else f"{counted / 2**20:.1f}"
    return f"{zone['schedule_bytes'] / 2**20:.1f}/{wire}"


# -- replayed traces ------------------------------------------------------------------------------
def replay_table(doc):
    """Per replayed job: a row per collective (the trace's size and time beside the lab's CCT and
    that CCT in real time), then the job's communication time both ways."""
    out = []
    for run in doc["runs"]:
        for name, job in run["jobs"].items():
            if job["kind"] == "replay":
                out.append(replay_job_table(doc, run, name, job))
    return "\n\n".join(out)


def replay_job_table(doc, run, name, job):
    rows = []
    for op in job["ops"]:
        verify = "-" if op["verify"] is None else ("ok" if op["verify"] else "FAILED")
        rows.append((op["index"], op["collective"], _group(op["group"]), human_size(op["trace_size"]),
                     human_size(op["size"]), f"{op['trace_ms']:.3f}", f"{op['gap_ms']:.0f}" + "*" * op["gap_clipped"],
                     f"{op['cct_ms']:.1f}", _num(op["cct_real_ms"]), _num(op["real_vs_trace"]),
                     f"{op['busbw_mbps']:.2f}", f"{100 * op['busbw_fraction_of_nic']:.0f}", _num(op["trace_busbw_mbps"]),
                     verify))
    trace, scale, t = job["trace"], job["scaling"], job["totals"]
    title = (f"{name}: {trace['format']} trace {trace['path']} ({trace['form']}, {trace['world']} ranks) on "
             f"{doc['fabric']['name']} ({run['routing']}), hosts {' '.join(job['ranks'].values())}; sizes / "
             f"{scale['size_scale']:g}, gaps x{scale['gap_scale']:g} capped at {scale['max_gap_s']:g} s; "
             f"{scale_line(doc)}")
    table = format_table(("#", "collective", "group", "trace size", "lab size", "trace ms", "gap ms",
                          "CCT ms", "real ms", "real/trace", "busbw Mbit/s", "busbw % NIC", "trace busbw", "verify"),
                         rows, title=title)
    skipped = ", ".join(f"{k} x{v}" for k, v in trace["skipped"].items()) or "none"
    summary = (f"communication: trace {t['trace_comm_ms']:.3f} ms; lab {t['lab_comm_ms']:.1f} ms "
               f"(ideal {t['lab_ideal_ms']:.1f} ms)"
               + (f" = {t['lab_comm_real_ms']:.3f} ms real, {t['real_vs_trace']:.3g}x the trace's"
                  if t["lab_comm_real_ms"] is not None and t["real_vs_trace"] is not None else "")
               + f"; gaps {t['gaps_ms']:.0f} ms ({t['gaps_clipped']} capped: *); not replayed: {skipped}")
    return table + "\n" + summary


def _group(ranks):
    """[0, 1, 2, 3] as 0-3, others as 0,2,5."""
    if ranks == list(range(ranks[0], ranks[0] + len(ranks))):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))


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
            modes = both_modes(job.get("sizes") or [])
            for size in job.get("sizes") or []:
                c = size["counters"]
                workload = f"{size['collective']} {human_size(size['size'])}" + f" {mode(size)}" * modes
                if "cross_zone" in size:
                    workload += f", cross-zone {cross_zone_text(size)} MiB"
                rows.append((run["label"], label, workload,
                             f"{size['busbw_mbps']:.2f}", f"{size['cct_ms']['p50']:.0f}", f"{size['cct_ms']['p99']:.0f}",
                             c.get("out_of_sequence", 0), c.get("retransmitted_packets", 0),
                             c.get("local_ack_timeout_err", 0)))
            if job["kind"] == "all-pairs":
                t = job["traffic"]
                rows.append((run["label"], label, f"all-pairs {t['flows']} flows", f"({t['delivered_mbps']:.2f})",
                             "-", "-", t["oos"], "-", "-"))
            if job["kind"] == "replay":
                t = job["totals"]
                counters = [size["counters"] for part in job["segments"] for size in part["sizes"]]
                rows.append((run["label"], label, f"replay {t['collectives']} collectives",
                             f"({t['lab_comm_ms']:.0f} ms)", "-", "-",
                             sum(c.get("out_of_sequence", 0) for c in counters),
                             sum(c.get("retransmitted_packets", 0) for c in counters),
                             sum(c.get("local_ack_timeout_err", 0) for c in counters)))
            if job["kind"] == "switchml":
                a = job["aggregation"]
                rows.append((run["label"], label, f"switchml {human_size(a['tensor_bytes'])}", "-",
                             f"{a['tat_s']['p50'] * 1e3:.0f}", f"{a['tat_s']['max'] * 1e3:.0f}", "-",
                             a["retransmissions"], "-"))
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
