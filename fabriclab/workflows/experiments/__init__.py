"""Packaged experiments: one command reproduces a measurement from the papers on a real fabric.

    fabriclab experiment list
    fabriclab experiment pfc-incast [--quick] [--out DIR]

or from Python (pytest):

    doc = run_experiment("pfc-incast", quick=True, out=tmp_path)

An experiment module defines NAME, SUMMARY, DEFAULT_SPEC, REFERENCE (what the paper reports),
`prepare(spec, options)` (the spec it runs on), `cases(fabric, options)` (a list of runner.Case),
`table(doc)` and `plot(doc, folder)`; optionally `run_cases` (the runner's by default), as the
routing experiment does to switch apps and inject a fault per case. A case's `routing` (when it
has one) is the controller app it runs under. Everything is checked before the fabric is built.
"""

from __future__ import annotations

import dataclasses
import importlib
import pathlib
import time

from fabriclab.errors import LabError

EXPERIMENTS = {
    "pfc-incast": "fabriclab.workflows.experiments.incast",
    "ecn-dcqcn": "fabriclab.workflows.experiments.ecn_dcqcn",
    "victim-noise": "fabriclab.workflows.experiments.victim",
    "routing-schemes": "fabriclab.workflows.experiments.routing",
    "switchml": "fabriclab.workflows.experiments.switchml",
}


@dataclasses.dataclass
class Options:
    quick: bool = False              # smaller transfers and fewer iterations (tests, CI)
    sample_s: float = 0.005          # queue sampling interval
    routing: str = "ecmp"
    seed: int = 1


def module(name):
    if name not in EXPERIMENTS:
        raise LabError(f"unknown experiment {name!r}: choose one of {', '.join(EXPERIMENTS)}")
    return importlib.import_module(EXPERIMENTS[name])


def run_experiment(name, spec=None, out=None, options=None, progress=None, verbose=False):
    """Run experiment `name` on `spec` (a spec name, a file, or None for its default); returns
    the results document, written to `out` (default results/<time>-<name>/) with its plots."""
    from fabriclab.results import document
    from fabriclab.lab.controller import check_app
    from fabriclab.workflows.experiments.runner import run_cases
    from fabriclab.lab.lab import Lab
    from fabriclab.topologies.spec import load_spec
    from fabriclab.traffic import roce
    from fabriclab.traffic.collective import place_ranks

    mod = module(name)
    options = options or Options()
    if not options.sample_s >= 0.001:
        raise LabError(f"--sample-ms must be >= 1 ms, got {options.sample_s * 1e3:g}")
    check_app(options.routing)
    fabric_spec = mod.prepare(load_spec(spec or mod.DEFAULT_SPEC), options)
    lab = Lab(fabric_spec, routing=options.routing, verbose=verbose)
    cases = mod.cases(lab.fabric, options)
    for case in cases:
        if getattr(case, "routing", None):
            check_app(case.routing)
    if cases and getattr(cases[0], "routing", None):
        lab.routing = cases[0].routing        # start under the first case's app (not yet started)
    for case in cases:                        # hosts, ranks and settings, before anything is built
        for job in case.jobs:
            job.spec.check()
            place_ranks(lab.fabric, job.spec)
        if case.degrade is not None:
            lab.resolve_link(*case.degrade[:2])
        if getattr(case, "fault", None) is not None:
            lab.resolve_link(*case.fault)
    folder = pathlib.Path(out) if out else pathlib.Path("results") / f"{time.strftime('%Y%m%d-%H%M%S')}-{name}"
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with lab:
        case_results = getattr(mod, "run_cases", run_cases)(lab, cases, options.sample_s, folder, progress)
        doc = {**document.run_header(lab, roce.path_mtu_for(fabric_spec.mtu)),
               "kind": "experiment", "experiment": name, "summary": mod.SUMMARY,
               "reference": mod.REFERENCE, "options": dataclasses.asdict(options),
               "cases": case_results}
    doc["elapsed_s"] = round(time.monotonic() - t0, 1)
    doc["folder"] = str(folder)
    doc["valid"] = all(job["valid"] for case in case_results for job in case["jobs"].values())
    doc["routing"] = sorted({c["routing"] for c in case_results if c.get("routing")}) or doc.get("routing")
    document.write_result(doc, folder)
    mod.plot(doc, folder)
    return doc
