"""Fabrics, workloads and failure sets whose flow-model outputs are pinned in
data/flowmodel_golden.json (recorded from the per-flow implementation before it was rewritten
for speed): test_flowmodel_golden.py holds every later version to them.

ECMP's and E-ECMP's were recorded again when each switch got a hash basis of its own (apps/hashing.py:
the model hashes as the emulation's switches do); the other schemes' are the per-flow
implementation's. Regenerate only when a change of results is intended:
    .venv/bin/python -m tests.unit.flowmodel_cases > tests/unit/data/flowmodel_golden.json
"""

import json
import random
import sys

from fabriclab.model import evaluate, flows
from fabriclab.model.graph import ClosGraph, ClosParams
from fabriclab.model.routes import Routes
from fabriclab.topologies.spec import load_spec

SCHEMES = ("ecmp", "eecmp", "te", "spray", "ideal")


def _random_down(graph, count, seed):
    return frozenset(random.Random(seed).sample(graph.fabric_cables(), count))


def cases():
    """(name, graph, collective, down cables, hash seed), small and medium."""
    out = []
    g = ClosGraph.from_spec(load_spec("default"))
    out.append(("default-alltoall-qp2", g, flows.alltoall(g, 2**20, qps=2), frozenset(), 0))
    out.append(("default-allreduce-shuffled", g, flows.ring_allreduce(g, 2**24, order="shuffled", seed=3),
                frozenset(), 5))
    out.append(("default-alltoall-1down", g, flows.alltoall(g, 2**20), _random_down(g, 1, 1), 0))
    cut = frozenset(c for c in g.fabric_cables() if g.link_label(2 * c).startswith("l1-"))
    out.append(("default-alltoall-leaf-cut", g, flows.alltoall(g, 2**20), cut, 0))
    g = ClosGraph.from_spec(load_spec("parallel_links"))
    out.append(("parallel-alltoall-shared", g, flows.alltoall(g, 2**20, qps=4, sport_mode="shared"),
                frozenset(), 0))
    out.append(("parallel-alltoall-2down", g, flows.alltoall(g, 2**20, qps=2), _random_down(g, 2, 2), 1))
    g = ClosGraph(ClosParams(name="mp", planes=2, nics_per_host=2, leaves=4, spines=3, hosts_per_leaf=3,
                             host_rate_mbps=25.0, fabric_rate_mbps=20.0))
    out.append(("multiplane-alltoall", g, flows.alltoall(g, 2**22), frozenset(), 0))
    out.append(("multiplane-allreduce-3down", g, flows.ring_allreduce(g, 2**24, order="shuffled", seed=1),
                _random_down(g, 3, 4), 2))
    g = ClosGraph(ClosParams(name="three", pods=3, leaves=3, spines=2, superspines=2, hosts_per_leaf=2,
                             parallel_links=2, core_parallel_links=2, fabric_rate_mbps=10.0,
                             core_rate_mbps=7.0))
    out.append(("3tier-alltoall-qp2", g, flows.alltoall(g, 2**20, qps=2), frozenset(), 0))
    out.append(("3tier-alltoall-4down", g, flows.alltoall(g, 2**20), _random_down(g, 4, 5), 0))
    out.append(("3tier-allreduce-6down", g, flows.ring_allreduce(g, 2**24, order="shuffled", seed=2),
                _random_down(g, 6, 6), 3))
    g = ClosGraph(ClosParams(name="medium", leaves=32, spines=8, hosts_per_leaf=8))
    out.append(("medium-allreduce-shuffled", g, flows.ring_allreduce(g, 2**26, order="shuffled", seed=0),
                frozenset(), 0))
    out.append(("medium-allreduce-8down", g, flows.ring_allreduce(g, 2**26, qps=2, order="shuffled", seed=1),
                _random_down(g, 8, 7), 0))
    g = ClosGraph(ClosParams(name="medium3", pods=4, leaves=8, spines=4, superspines=2, hosts_per_leaf=4,
                             core_rate_mbps=20.0))
    out.append(("medium3-allreduce-5down", g, flows.ring_allreduce(g, 2**26, order="shuffled", seed=4),
                _random_down(g, 5, 8), 0))
    return out


def outputs(graph, collective, down, hash_seed, schemes=SCHEMES):
    """What a scheme's evaluation says: CCT, unroutable/unsatisfied counts, the longest step's
    rates per flow and loads per link."""
    routes = Routes(graph, down)
    found = {}
    for scheme in schemes:
        o = evaluate.run(graph, routes, collective, scheme, hash_seed)
        found[scheme] = {"cct_s": o.cct_s if o.cct_s != float("inf") else None,
                         "unroutable": o.unroutable, "unsatisfied": o.unsatisfied,
                         "rates": list(o.rates),
                         "loads": {str(e): v for e, v in sorted(o.loads.items()) if v > 0}}
    return found


def main():
    doc = {name: {"down": sorted(down), "hash_seed": hs, "schemes": outputs(g, c, down, hs)}
           for name, g, c, down, hs in cases()}
    json.dump(doc, sys.stdout, separators=(",", ":"))


if __name__ == "__main__":
    main()
