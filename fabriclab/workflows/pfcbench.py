"""The PFC agent's reaction over whole experiments: `fabriclab benchmark --pfc-reaction`.

Runs packaged experiments that pause (pfc-incast, ar-fabric, ecn-dcqcn by default) N times each
on this machine, with the rest of the lab as busy as those experiments make it, and tabulates
every run's XOFF-to-gate-closed delay (p50, p99, max of wall time; the longest wait for the
agent and the longest netlink gate change, the two parts of a reaction), its lossless drops and how
the agent was scheduled; or reads the same from results folders already written (`--from`).
The headroom (`reaction_ms`, default 5 ms) must cover the worst of these.
"""

from __future__ import annotations

import json
import pathlib

DEFAULT_EXPERIMENTS = ("pfc-incast", "ar-fabric", "ecn-dcqcn")
COLUMNS = ("experiment", "draw", "case", "pauses", "p50 ms", "p99 ms", "max ms", "wait max", "change max",
           "lossless drops", "agent")


def rows_of(doc, draw):
    """A row per run of a results document that paused at least once, or says it did not."""
    out = []
    for run in doc.get("runs") or []:
        report = (run.get("queues") or {}).get("report") or {}
        reaction = report.get("pfc_reaction") or {}
        totals = report.get("totals") or {}
        out.append({"experiment": (doc.get("experiment") or {}).get("name") or doc.get("name", "?"),
                    "draw": draw, "case": run.get("label", "?"), "pauses": reaction.get("pauses", 0),
                    "p50_ms": reaction.get("p50_ms"), "p99_ms": reaction.get("p99_ms"),
                    "max_ms": reaction.get("max_ms"), "max_wait_ms": reaction.get("max_wait_ms"),
                    "max_gate_change_ms": reaction.get("max_gate_change_ms"),
                    "lossless_drops": totals.get("lossless_drops", 0),
                    "scheduling": reaction.get("scheduling", "-")})
    return out


def summary(rows):
    """Per experiment: runs, pauses, the largest p99 and max, and the lossless drops, over `rows`."""
    out = {}
    for r in rows:
        s = out.setdefault(r["experiment"], {"runs": 0, "pauses": 0, "worst_p99_ms": 0.0, "worst_max_ms": 0.0,
                                             "lossless_drops": 0, "draws": set()})
        s["runs"] += 1
        s["draws"].add(r["draw"])
        s["pauses"] += r["pauses"]
        s["lossless_drops"] += r["lossless_drops"] or 0
        for key, col in (("worst_p99_ms", "p99_ms"), ("worst_max_ms", "max_ms")):
            if r[col] is not None:
                s[key] = max(s[key], r[col])
    return {name: {**s, "draws": len(s["draws"])} for name, s in out.items()}


def read_folders(folders):
    """Rows of every results.json under `folders` (an experiment's folder, a catalogue, ...)."""
    rows = []
    for folder in folders:
        paths = sorted(pathlib.Path(folder).rglob("results.json"))
        if not paths:
            from fabriclab.errors import LabError

            raise LabError(f"no results.json under {str(folder)[:200]}")
        for path in paths:
            if ".attempt-" in str(path):
                continue                   # a derated experiment: its judged attempt is the folder itself
            doc = json.loads(path.read_text())
            draw = f"{pathlib.Path(folder).name}/{path.parent.name}"
            rows += [r for r in rows_of(doc, draw) if r["pauses"] or r["lossless_drops"]]
    return rows


def run_draws(experiments, draws, quick, out, progress=print):
    """Run each experiment `draws` times (seeds 1..draws) into `out`/<experiment>/draw-<k>; rows.
    A run that saturates the CPU is kept, not rerun slower: the agent must react then too, and
    that is the load it meets worst."""
    from fabriclab.workflows.experiments import Options, run_experiment

    rows = []
    for name in experiments:
        for k in range(1, draws + 1):
            folder = pathlib.Path(out) / name / f"draw-{k}"
            progress(f"{name}, draw {k} of {draws} -> {folder}")
            doc = run_experiment(name, None, folder, Options(quick=quick, seed=k), run_plots=False,
                                 derate=False)
            rows += rows_of(doc, k)
    return rows


def table_rows(rows):
    def f(value):
        return "-" if value is None else f"{value:.3f}"

    return [(r["experiment"], r["draw"], r["case"][:32], r["pauses"], f(r["p50_ms"]), f(r["p99_ms"]),
             f(r["max_ms"]), f(r.get("max_wait_ms")), f(r.get("max_gate_change_ms")), r["lossless_drops"],
             r["scheduling"]) for r in rows]
