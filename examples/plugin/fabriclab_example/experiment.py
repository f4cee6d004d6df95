"""`first-path-vs-ecmp`: all-pairs traffic on the 2x2 `tiny` fabric under ECMP and under the
`first-path` app this package adds: ECMP spreads the flows over both spines, a single path puts
them all on one, and the uplinks' max/mean says so."""

from fabriclab.results import figures
from fabriclab.table import format_table
from fabriclab.traffic.allpairs import AllPairsSpec
from fabriclab.workflows.plan import Job, RunPlan

NAME = "first-path-vs-ecmp"
SUMMARY = "all-pairs on tiny under ECMP and a single path: uplink max/mean (a plugin's experiment)"
DEFAULT_SPEC = "tiny"
DEFAULT_ROUTING = None              # its runs name their own apps
REFERENCE = {"finding": "a single path loads one uplink of each leaf and leaves the other idle"}
CASES = (("ECMP", "ecmp"), ("first path", "first-path"))


def prepare(spec, options):
    return spec


def runs(fabric, options):
    traffic = AllPairsSpec(duration_s=2.0 if options.quick else 6.0, load=0.5, flows_per_pair=8)
    return [RunPlan(label, routing, [Job("all-pairs", traffic)]) for label, routing in CASES]


def uplinks(run):
    return run["jobs"]["all-pairs"]["balance"]["up"]


def table(doc):
    rows = [(run["label"], f"{uplinks(run).get('max_mean_ratio') or 0:.2f}",
             f"{uplinks(run).get('min_mbps', 0):.2f}-{uplinks(run).get('max_mbps', 0):.2f}") for run in doc["runs"]]
    return (format_table(("case", "uplink max/mean", "uplink min-max Mbit/s"), rows,
                         title=f"uplink balance on {doc['fabric']['name']}") + "\n" + REFERENCE["finding"])


def plot(doc, folder):
    figures.compare(folder / "first_path.png", "uplink max/mean", [r["label"] for r in doc["runs"]],
                    [("uplink max/mean", [uplinks(r).get("max_mean_ratio") for r in doc["runs"]])])
