"""Where the lab's wall time goes, read from results folders: `fabriclab benchmark --run-phases
--from DIR...`. Per experiment (or plan), the fabric's bring-up and teardown and every run's
phases (pipeline._Phases: switching the app, draining, setting up, starting the jobs, the traffic,
putting the fabric back, writing the record), summed over every results.json under the folders
(a catalogue's draws, a sweep's cases). The traffic is the measurement; the rest is overhead."""

from __future__ import annotations

import json
import pathlib

PHASES = ("routing_s", "drain_s", "setup_s", "start_s", "traffic_s", "teardown_s", "record_s")
COLUMNS = ("experiment", "documents", "runs", "up s", "down s", "routing s", "drain s", "setup s", "start s",
           "traffic s", "teardown s", "record s", "traffic share")


def read_folders(folders):
    """{name: totals} over every results.json under `folders` (derated attempts included: they
    took the time too); LabError for a folder with none."""
    from fabriclab.errors import LabError

    out = {}
    for folder in folders:
        paths = sorted(pathlib.Path(folder).rglob("results.json"))
        if not paths:
            raise LabError(f"no results.json under {str(folder)[:200]}")
        for path in paths:
            doc = json.loads(path.read_text())
            name = (doc.get("experiment") or {}).get("name") or doc.get("name", "?")
            t = out.setdefault(name, {"documents": 0, "runs": 0, "up_s": 0.0, "down_s": 0.0,
                                      **{p: 0.0 for p in PHASES}, "run_s": 0.0})
            t["documents"] += 1
            lab = doc.get("timings_s") or {}
            t["up_s"] += lab.get("up_s", 0.0)
            t["down_s"] += lab.get("down_s", 0.0)
            for run in doc.get("runs") or []:
                phases = run.get("timings_s") or {}
                t["runs"] += 1
                for p in (*PHASES, "run_s"):
                    t[p] += phases.get(p, 0.0)
    return out


def table_rows(totals):
    rows = []
    for name, t in sorted(totals.items(), key=lambda item: -(item[1]["run_s"] + item[1]["up_s"] + item[1]["down_s"])):
        whole = t["run_s"] + t["up_s"] + t["down_s"]
        share = f"{t['traffic_s'] / whole:.0%}" if whole > 0 and t["run_s"] > 0 else "-"
        rows.append((name, t["documents"], t["runs"], *(f"{t[k]:.1f}" for k in ("up_s", "down_s", *PHASES)), share))
    return rows
