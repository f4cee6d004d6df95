"""Ring AllReduce with 1, 4 and 4 shared-port QPs per connection: busbw and uplink balance.

    sudo .venv/bin/python examples/allreduce_qp_scaling.py [SPEC] [SIZE_BYTES]

One fabric, three runs of the same collective (seed 000 section 4.2): with one QP per ring
connection each leaf's cross-leaf flow hashes onto one uplink; more QPs give ECMP more UDP source
ports to spread; with one shared source port per NIC pair the extra QPs add no entropy. Prints a
row per setting and returns them.
"""

import sys

from fabriclab.lab.lab import Lab
from fabriclab.topologies.spec import load_spec
from fabriclab.traffic.collective import CollectiveSpec, run_collective

SETTINGS = [("1 QP", dict(qps=1)), ("4 QPs", dict(qps=4)),
            ("4 QPs, shared source port", dict(qps=4, sport_mode="shared"))]


def main(spec_name="default", size=1 << 20):
    rows = []
    with Lab(load_spec(spec_name)) as lab:
        for label, extra in SETTINGS:
            run = run_collective(lab, CollectiveSpec("allreduce", sizes=(size,), iterations=3,
                                                     verify=True, **extra))
            row = run.sizes[0]
            rows.append({"setting": label, "busbw_mbps": round(row["busbw_mbps"], 2),
                         "cct_ms": round(row["time_s"]["mean"] * 1e3, 1),
                         "uplink_max_mean": row["balance"]["up"]["max_mean_ratio"],
                         "sports_in_use": len({q["sport"] for f in run.finals.values()
                                               for q in f["qps"] if q["tx_packets"]}),
                         "verified": row["verify"]["ok"]})
    for row in rows:
        print(f"{row['setting']:<28} busbw {row['busbw_mbps']:6.2f} Mbit/s  CCT {row['cct_ms']:7.1f} ms"
              f"  uplink max/mean {row['uplink_max_mean']}  source ports {row['sports_in_use']}"
              f"  verified {row['verified']}")
    return rows


if __name__ == "__main__":
    main(*(sys.argv[1:2] or ["default"]), *[int(a) for a in sys.argv[2:3]])
