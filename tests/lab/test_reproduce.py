"""`fabriclab reproduce --quick` on real fabrics, as CI runs it: every claim judged over its draws
(an interval that straddles is inconclusive, which is not a failure), none flipped, no lossless
class dropping a packet on any draw, a plot per measured claim; then the same folder judged again
offline (`--from`) to the same verdicts. The experiment tests read this run's folders."""

import json

import pytest

from fabriclab.cli.main import main
from fabriclab.workflows.reproduce import CLAIMS
from fabriclab.workflows.reproduce.claim import FLIPPED, NOT_JUDGED

pytestmark = pytest.mark.lab


def test_reproduce_quick_judges_every_claim_and_none_flips(quick_catalogue, capsys):
    data = quick_catalogue.data()
    rows = {r["id"]: r for r in data["claims"]}
    assert list(rows) == [c.id for c in CLAIMS] and data["quick"] is True
    unjudged = {i: (r["agreement"], r["invalid"][:2]) for i, r in rows.items() if r["status"] in (FLIPPED, NOT_JUDGED)}
    assert not unjudged, unjudged
    for name, experiment in data["experiments"].items():
        assert experiment["error"] is None, (name, experiment["error"])
        assert experiment["lossless_drops"] == [], (name, experiment["lossless_drops"])
        assert experiment["draws"] >= 2 and (quick_catalogue.folder_of(name, experiment["draws"]) / "results.json").is_file()
    assert quick_catalogue.exit_code == 0
    for claim in CLAIMS:
        row = rows[claim.id]
        assert row["lab"] != "-" and row["direction"] and row["effects"], claim.id
        assert row["judged_draws"] == row["draws"] == claim.draws_for(quick=True), claim.id
        for effect in row["effects"]:            # each judged on its interval over the draws
            assert effect["n"] == row["draws"] and effect["lo"] <= effect["mean"] <= effect["hi"], (claim.id, effect)
            if not claim.experiments:             # a model's figures are computed: no spread
                assert effect["lo"] == effect["hi"] == effect["mean"], (claim.id, effect)
        assert (quick_catalogue.folder / row["plot"]).stat().st_size > 5_000, claim.id
    text = (quick_catalogue.folder / "catalogue.md").read_text()
    assert "quick forms" in text and all(f"### {c.id}" in text for c in CLAIMS)
    assert "| lab: mean [90% interval] | draws | verdict |" in text

    # judged again from the folder, without a fabric: the same verdicts and intervals
    again = quick_catalogue.folder.parent / "again"
    assert main(["reproduce", "--from", str(quick_catalogue.folder), "--out", str(again)]) == 0
    rejudged = json.loads((again / "catalogue.json").read_text())
    assert [(r["id"], r["status"], r["effects"]) for r in rejudged["claims"]] == \
        [(r["id"], r["status"], r["effects"]) for r in data["claims"]]
    out = capsys.readouterr().out
    assert "000-eecmp-gain" in out and "lab: mean [90% interval]" in out


def test_lossless_experiments_drop_nothing_in_the_lossless_class(quick_catalogue):
    """Lossless means lossless, on every draw: a mechanism, whatever the CPU did."""
    for name in ("routing-schemes", "pfc-incast", "ar-fabric"):
        for k, doc in quick_catalogue.docs(name):
            for run in doc["runs"]:
                totals = run["queues"]["report"]["totals"]
                assert totals.get("lossless_drops", 0) == 0 and totals.get("wd_drops", 0) == 0, (name, k, run["label"])
                assert not [r for r in run["invalid"] if "lossless drop" in r], (name, k, run["label"])
