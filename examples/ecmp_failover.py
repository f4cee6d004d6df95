"""Fail a leaf-spine link under all-pairs RoCEv2 traffic and watch ECMP move the load.

    sudo .venv/bin/python examples/ecmp_failover.py [SPEC]

The same plan as `fabriclab run SPEC --duration 6 --flows-per-pair 4 --link-down l1-s1@2
--link-up l1-s1@4`, run from Python: brings the fabric up, runs 6 s of traffic with 4 QPs per host
pair, takes l1-s1 down at 2 s and brings it back at 4 s, then prints l1's uplink rates each half
second, how long the delivered traffic took to recover after each event, and the traffic's totals.
"""

import sys

from fabriclab.topologies.spec import load_spec
from fabriclab.traffic.allpairs import AllPairsSpec
from fabriclab.workflows import pipeline
from fabriclab.workflows.plan import Job, link_events, single_run


def main(spec_name="tiny", out=None):
    spec = load_spec(spec_name)
    plan = single_run(f"{spec.name}-failover", "run", spec,
                      Job("traffic", AllPairsSpec(duration_s=6.0, load=0.5, flows_per_pair=4)),
                      faults=link_events(down=["l1-s1@2"], up=["l1-s1@4"]))
    result = pipeline.run_plan(plan, out)
    (run,) = result.runs
    uplinks = [c.name for c in run.series.columns if c.kind == "up" and c.src == "l1"]
    print("t (s)  " + "  ".join(f"{name:>8}" for name in uplinks))
    for i in range(12):
        start, end = 0.5 * i, 0.5 * (i + 1)
        print(f"{end:5.1f}  " + "  ".join(f"{run.mean_mbps(name, start, end):8.2f}" for name in uplinks))
    for fault in run.record["faults"]:
        hit = fault["impact"]
        after = "never fell" if not hit["fell"] else f"recovered in {hit['recovery_s']} s"
        print(f"{fault['label']} at {fault['at_s']:.2f} s: delivered {hit['baseline_mbps']} Mbit/s before, {after}")
    print("totals:", run.record["jobs"]["traffic"]["traffic"])
    print("results:", result.folder)
    return run


if __name__ == "__main__":
    main(*sys.argv[1:])
