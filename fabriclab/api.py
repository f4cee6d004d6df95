"""The Python API in one import: describe runs as a Plan, hand it to the one runner.

    from fabriclab import api

    spec = api.load_spec("default")
    plan = api.Plan("qp-scaling", "python", spec, [
        api.RunPlan("1 QP", jobs=[api.Job("ring", api.CollectiveSpec(qps=1))]),
        api.RunPlan("4 QPs", routing="eecmp", jobs=[api.Job("ring", api.CollectiveSpec(qps=4))]),
    ])
    result = api.run_plan(plan)                 # builds the fabric, runs, tears down
    result.doc["runs"][1]["jobs"]["ring"]["sizes"][0]["busbw_mbps"]

The command line, the prompt and the pytest fixtures build the same plans (fabriclab.workflows.plan)
and run them the same way (fabriclab.workflows.pipeline); the results document they write is
described in fabriclab/results/schema.json. Lab is there for hands-on work on a live fabric.
"""

from fabriclab.lab.lab import Lab
from fabriclab.switchml.launcher import AggregationSpec
from fabriclab.topologies.spec import load_spec
from fabriclab.traffic.allpairs import AllPairsSpec
from fabriclab.traffic.collective import CollectiveSpec
from fabriclab.workflows.experiments import build_plan as experiment_plan
from fabriclab.workflows.faults import Fault, parse_link_event
from fabriclab.workflows.pipeline import run_plan
from fabriclab.workflows.plan import Job, Metrics, Plan, RunPlan, link_events, single_run
from fabriclab.workflows.scenario import load as load_scenario
from fabriclab.workflows.scenario import to_plan as scenario_plan

__all__ = ["Lab", "AggregationSpec", "load_spec", "AllPairsSpec", "CollectiveSpec", "experiment_plan", "Fault",
           "parse_link_event", "run_plan", "Job", "Metrics", "Plan", "RunPlan", "link_events", "single_run",
           "load_scenario", "scenario_plan"]
