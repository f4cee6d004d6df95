"""The cluster and the layers below it meet only through fabriclab.system.spread.Spread: the
Cluster implements every member with the same parameters, and the lab, the measurements and the
traffic engine call nothing else on it."""

import inspect
import pathlib
import re

from fabriclab.cluster.cluster import Cluster
from fabriclab.cluster.machine import Machine
from fabriclab.system.spread import Spread

REPO = pathlib.Path(__file__).resolve().parents[2]
BELOW = ["fabriclab/lab", "fabriclab/measure", "fabriclab/jobs", "fabriclab/switchml", "fabriclab/queues",
         "traffic", "apps", "topologies", "fabriclab/system"]
MEMBERS = {name for name in dir(Spread) if not name.startswith("_")} | set(Spread.__annotations__)


def test_the_spread_names_what_a_cluster_does():
    assert {"connect", "queue_model", "read_counters_all", "port_sampler", "host_class", "machines"} <= MEMBERS


def test_the_cluster_implements_every_member_with_the_same_parameters():
    cluster = Cluster([Machine("here", "10.0.0.1", local=True)])
    assert isinstance(cluster, Spread)
    for name in MEMBERS:
        assert hasattr(cluster, name), name
        wanted = getattr(Spread, name, None)
        if inspect.isfunction(wanted):
            got = list(inspect.signature(getattr(Cluster, name)).parameters)
            assert got == list(inspect.signature(wanted).parameters), name


def test_the_layers_below_call_nothing_else_on_a_cluster():
    pattern = re.compile(r"\bcluster\.([a-z_]+)\b")
    used = {}
    for folder in BELOW:
        for path in (REPO / folder).rglob("*.py"):
            code = "\n".join(line for line in path.read_text().splitlines()
                             if not line.lstrip().startswith("#"))
            # docstrings name the module fabriclab.cluster.cluster; only calls and attributes count
            for m in pattern.finditer(code):
                if code[max(0, m.start() - 10):m.start()].endswith("fabriclab."):
                    continue
                used.setdefault(m.group(1), set()).add(path.relative_to(REPO).as_posix())
    assert "machine_of_name" in used and "queue_model" in used     # the scan sees the real uses
    assert {name: sorted(where) for name, where in used.items() if name not in MEMBERS} == {}
