"""The one results document: what every run of the lab writes as results.json, and reads back.

Whatever wrote it (`run`, `demo`, `collective`, `experiment`, `scenario`, `model calibrate`, the
prompt, pytest, the Python API), a results document has one shape, versioned by `schema_version`
and described by schema.json beside this module:

    header     versions, machine, scale (link rates, buffers, time scale, link delay), mechanisms
               the kernel allowed, the spec and fabric summary
    plan       what was asked: the entry point (`kind`), its input, the metrics
    runs       one record per run: its routing, jobs (each kind's record: fabriclab/jobs/),
               faults with their impact, the fault log, port telemetry, the queue model's report
    valid      false when any job ran with a saturated CPU or failed its verification

This module owns that shape: it builds the header and the document around the job records (each
job kind builds its own: fabriclab/jobs/), writes the file, and loads it back (refusing, in one line, a file it cannot read: another version, an older
format, a broken document).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
import platform
import time

from fabriclab import __version__
from fabriclab.errors import LabError
from fabriclab.loading import clip, parse_json, read_text

SCHEMA_VERSION = 1
SCHEMA_PATH = pathlib.Path(__file__).with_name("schema.json")
MAX_DOCUMENT_BYTES = 256 << 20          # results of long sweeps stay far below; anything above is not ours


# -- the header ------------------------------------------------------------------------------------
def header(lab, payload_bytes):
    """What every results document starts with: versions, scale, mechanisms, spec."""
    fabric = lab.fabric
    spec = fabric.spec
    queues = getattr(lab, "queues", None)
    return {
        "schema_version": SCHEMA_VERSION,
        "fabriclab": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"kernel": platform.release(), "cpus": os.cpu_count()},
        "scale": {
            "host_rate_mbps": spec.host_rate_mbps,
            "fabric_rate_mbps": spec.fabric_rate_mbps,
            "mtu": spec.mtu,
            "roce_payload_bytes": payload_bytes,
            "buffers_bytes": fabric.summary()["buffers_bytes"],
            "real_host_rate_mbps": spec.real_host_rate_mbps,
            "time_scale": spec.time_scale,
            "link_delay": link_delay(lab),
            "note": "emulated rates; time_scale = real_host_rate / host_rate when the spec states it",
        },
        "mechanisms": {"ovs_datapath": lab.datapath,
                       "shaping": "htb+bfifo" if queues is None else "htb classes+tbf gate",
                       "ecn": getattr(lab, "ecn_mechanism", "none"),
                       "delay": getattr(lab, "delay_mechanism", "none"),
                       "queue_model": queues.describe() if queues is not None else None},
        "warnings": list(getattr(lab, "warnings", ())),
        "spec": spec.to_dict(),
        "fabric": fabric.summary(),
        "cluster": cluster(lab),
    }


def cluster(lab):
    """The machines a split fabric ran on and its boundary links; None on one machine."""
    machines, split = getattr(lab, "machines", None), getattr(lab, "split", None)
    if not machines or split is None:
        return None
    return {"machines": [{"name": m.name, "private_ip": m.private_ip,
                          "datapath": lab.datapath if m.local else getattr(m, "datapath", None)} for m in machines],
            "split": split.summary()}


def link_delay(lab):
    """The spec's one-way delay per cable kind, real and in the lab, and whether the lab ran it."""
    spec = lab.fabric.spec
    kinds = ("host", "fabric")
    return {"real_us": {kind: getattr(spec.delay, f"{kind}_us") for kind in kinds},
            "lab_ms": {kind: spec.lab_delay_ms(kind) for kind in kinds},
            "applied": getattr(lab, "delay_mechanism", "none") == "netem"}


# -- the document ----------------------------------------------------------------------------------
def assemble(plan, head, runs, elapsed_s, folder, timings=None):
    """The whole document of a plan's runs."""
    doc = {
        **head,
        "kind": plan.kind,
        "name": plan.name,
        "description": plan.description,
        "plan": {"source": plan.source, "metrics": {**dataclasses.asdict(plan.metrics), "pingmesh_pairs": [
                     list(pair) for pair in plan.metrics.pingmesh_pairs]},
                 "runs": len(plan.runs)},
        "experiment": None,
        "routing": sorted({run["routing"] for run in runs}),
        "runs": runs,
        "valid": all(run["valid"] for run in runs),
        "elapsed_s": round(elapsed_s, 1),
        "timings_s": {k: round(v, 3) for k, v in (timings or {}).items()},
        "folder": str(folder),
    }
    if plan.experiment is not None:
        mod = plan.experiment
        doc["experiment"] = {"name": mod.NAME, "summary": mod.SUMMARY, "reference": mod.REFERENCE}
    return doc


def default_folder(name):
    return pathlib.Path("results") / f"{time.strftime('%Y%m%d-%H%M%S')}-{_slug(name)}"


def write(doc, folder):
    """Write results.json into `folder`; returns its path."""
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "results.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1, allow_nan=False))
    os.replace(tmp, path)
    return path


def load(folder):
    """The results document of a folder, checked against the schema; a one-line LabError naming
    the folder when there is none, it is of another format, or it is broken."""
    path = pathlib.Path(folder) / "results.json"
    if not path.is_file():
        raise LabError(f"{folder}: no results.json here (not a results folder?)")
    doc = parse_json(read_text(path, "results document", MAX_DOCUMENT_BYTES), clip(path))
    if not isinstance(doc, dict):
        raise LabError(f"{path}: not a results document (a JSON {type(doc).__name__}, not an object)")
    version = doc.get("schema_version")
    if version is None:
        made = doc.get("fabriclab", "an unknown version")
        raise LabError(f"{path}: written by fabriclab {str(made)[:20]} before results documents had a "
                       f"schema_version; rerun it to read it here")
    if version != SCHEMA_VERSION:
        raise LabError(f"{path}: schema_version {str(version)[:10]}; this fabriclab reads {SCHEMA_VERSION}")
    problem = first_problem(doc)
    if problem:
        raise LabError(f"{path}: {problem}")
    return doc


@functools.lru_cache(maxsize=1)
def _validator():
    import jsonschema

    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def first_problem(doc):
    """None when `doc` follows the schema, else one line naming where it does not."""
    error = next(iter(sorted(_validator().iter_errors(doc), key=lambda e: list(e.absolute_path))), None)
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "the top level"
    message = error.message if len(error.message) <= 120 else error.message[:117] + "..."
    return f"not a valid results document at {where}: {message}"


def _slug(text):
    return "".join(c if c.isalnum() else "-" for c in str(text).lower()).strip("-") or "run"
