"""Fail a leaf-spine link under all-pairs RoCEv2 traffic and watch ECMP move the load.

    sudo .venv/bin/python examples/ecmp_failover.py [SPEC]

Brings the fabric up, runs 6 s of traffic with 4 QPs per host pair, takes l1-s1 down at 2 s and
brings it back at 4 s, then prints l1's uplink rates over time and the run's totals.
"""

import sys

from fabriclab.lab.lab import Lab
from fabriclab.topologies.spec import load_spec
from fabriclab.traffic.allpairs import all_pairs_plan
from fabriclab.traffic.launcher import run_traffic


def main(spec_name="tiny"):
    with Lab(load_spec(spec_name), routing="ecmp") as lab:
        plan = all_pairs_plan(lab.fabric, load=0.5, flows_per_pair=4)
        actions = [(2.0, lambda: lab.link_down("l1", "s1")), (4.0, lambda: lab.link_up("l1", "s1"))]
        run = run_traffic(lab, plan, duration_s=6.0, actions=actions, sample_interval_s=0.5)
        uplinks = [link for link in lab.fabric.fabric_links if link.a == "l1"]
        series = {link.label: dict(run.series(link.a_intf)) for link in uplinks}
        times = sorted(next(iter(series.values())))
        print("t (s)  " + "  ".join(f"{label:>8}" for label in series))
        for t in times:
            print(f"{t:5.1f}  " + "  ".join(f"{series[label].get(t, 0):8.2f}" for label in series))
        for action in run.actions:
            print(f"at {action['at_s']:.1f} s: reprogrammed in {action['took_s']:.2f} s")
        print("totals:", run.totals())
        return run


if __name__ == "__main__":
    main(*sys.argv[1:])
