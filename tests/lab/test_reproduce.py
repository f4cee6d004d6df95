"""`fabriclab reproduce --quick` on real fabrics, as CI runs it: every claim judged, none flipped,
no lossless class dropping a packet, a plot per measured claim; then the same folder judged
again offline (`--from`) to the same verdicts. The experiment tests read this run's folders."""

import json

import pytest

from fabriclab.cli.main import main
from fabriclab.workflows.reproduce import CLAIMS
from fabriclab.workflows.reproduce.claim import FLIPPED

pytestmark = pytest.mark.lab


def test_reproduce_quick_judges_every_claim_and_none_flips(quick_catalogue, capsys):
    data = quick_catalogue.data()
    rows = {r["id"]: r for r in data["claims"]}
    assert list(rows) == [c.id for c in CLAIMS] and data["quick"] is True
    flipped = {i: (r["agreement"], r["lab"]) for i, r in rows.items() if r["status"] == FLIPPED}
    assert not flipped, flipped
    for name, experiment in data["experiments"].items():
        assert experiment["error"] is None, (name, experiment["error"])
        assert experiment["lossless_drops"] == [], (name, experiment["lossless_drops"])
    assert quick_catalogue.exit_code == 0
    for claim in CLAIMS:
        row = rows[claim.id]
        assert row["lab"] != "-" and row["direction"], claim.id
        assert (quick_catalogue.folder / row["plot"]).stat().st_size > 5_000, claim.id
    text = (quick_catalogue.folder / "catalogue.md").read_text()
    assert "quick forms" in text and all(f"### {c.id}" in text for c in CLAIMS)

    # judged again from the folder, without a fabric: the same verdicts
    again = quick_catalogue.folder.parent / "again"
    assert main(["reproduce", "--from", str(quick_catalogue.folder), "--out", str(again)]) == 0
    rejudged = json.loads((again / "catalogue.json").read_text())
    assert [(r["id"], r["status"], r["lab"]) for r in rejudged["claims"]] == \
        [(r["id"], r["status"], r["lab"]) for r in data["claims"]]
    assert "000-eecmp-gain" in capsys.readouterr().out


def test_lossless_experiments_drop_nothing_in_the_lossless_class(quick_catalogue):
    for name in ("routing-schemes", "pfc-incast", "ar-fabric"):
        doc = quick_catalogue.doc(name)
        for run in doc["runs"]:
            totals = run["queues"]["report"]["totals"]
            assert totals.get("lossless_drops", 0) == 0 and totals.get("wd_drops", 0) == 0, (name, run["label"])
            assert run["valid"], (name, run["label"], run["invalid"])
