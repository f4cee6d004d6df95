"""Ring AllReduce with 1, 4 and 4 shared-port QPs per connection: busbw and uplink balance.

    sudo .venv/bin/python examples/allreduce_qp_scaling.py [SPEC] [SIZE_BYTES]

One plan, three runs of the same collective on one fabric (seed 000 section 4.2): with one QP per
ring connection each leaf's cross-leaf flow hashes onto one uplink; more QPs give ECMP more UDP
source ports to spread; with one shared source port per NIC pair the extra QPs add no entropy.
Prints a row per run and returns them; the results folder has report.md and the plots.
"""

import sys

from fabriclab.topologies.spec import load_spec
from fabriclab.traffic.collective import CollectiveSpec
from fabriclab.workflows import pipeline
from fabriclab.workflows.plan import Job, Plan, RunPlan

SETTINGS = [("1 QP", dict(qps=1)), ("4 QPs", dict(qps=4)),
            ("4 QPs, shared source port", dict(qps=4, sport_mode="shared"))]


def main(spec_name="default", size=1 << 20, out=None):
    spec = load_spec(spec_name)
    runs = [RunPlan(label, jobs=[Job("ring", CollectiveSpec("allreduce", sizes=(size,), iterations=3,
                                                             verify=True, **extra))])
            for label, extra in SETTINGS]
    result = pipeline.run_plan(Plan(f"{spec.name}-qp-scaling", "python", spec, runs), out)
    rows = []
    for run in result.doc["runs"]:
        job = run["jobs"]["ring"]
        size_row = job["sizes"][0]
        rows.append({"setting": run["label"], "busbw_mbps": round(size_row["busbw_mbps"], 2),
                     "cct_ms": round(size_row["cct_ms"]["mean"], 1),
                     "uplink_max_mean": size_row["balance"]["up"]["max_mean_ratio"],
                     "sports_in_use": len({q["sport"] for q in job["qps"] if q["tx_packets"]}),
                     "verified": size_row["verify"]["ok"]})
    for row in rows:
        print(f"{row['setting']:<28} busbw {row['busbw_mbps']:6.2f} Mbit/s  CCT {row['cct_ms']:7.1f} ms"
              f"  uplink max/mean {row['uplink_max_mean']}  source ports {row['sports_in_use']}"
              f"  verified {row['verified']}")
    print("results:", result.folder)
    return rows


if __name__ == "__main__":
    main(*(sys.argv[1:2] or ["default"]), *[int(a) for a in sys.argv[2:3]])
