"""`fabriclab reproduce`: choosing claims, stating agreement, the catalogue and its exit status,
with fake experiments (the lab test runs the real ones); the model-only claims in full."""

import json

import pytest

from fabriclab.errors import LabError
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import load_spec
from fabriclab.workflows import pipeline
from fabriclab.workflows.experiments import EXPERIMENTS, Options, build_plan, ecmp_balance, label, routing
from fabriclab.workflows.reproduce import CLAIMS, catalogue, experiments_for, select, seed001
from fabriclab.workflows.reproduce.claim import AGREES, FLIPPED, NOT_JUDGED, Claim, Finding, agreement


# -- the registry ---------------------------------------------------------------------------------------
def test_every_claim_is_unique_names_its_seed_and_reads_packaged_experiments():
    assert len({c.id for c in CLAIMS}) == len(CLAIMS)
    assert {c.seed for c in CLAIMS} == {"000", "001", "002", "003"}
    for c in CLAIMS:
        assert c.id.startswith(c.seed + "-") and c.statement and c.paper and c.conditions
        assert set(c.experiments) <= set(EXPERIMENTS), c.id


def test_only_picks_seeds_and_claims_and_refuses_unknown_names_in_one_line():
    assert select() == CLAIMS
    assert {c.seed for c in select("001")} == {"001"}
    assert [c.id for c in select("000-eecmp-gain, 003-loss")] == ["000-eecmp-gain", "003-loss"]
    with pytest.raises(LabError, match=r"unknown seed or claim 'nope'.*seeds 000, 001, 002, 003") as err:
        select("000,nope")
    assert "\n" not in str(err.value)
    with pytest.raises(LabError, match="--only takes seeds"):
        select(",")


def test_each_experiment_runs_once_in_the_listed_order():
    names = experiments_for(select("000"))
    assert len(names) == len(set(names))
    assert names == [n for n in EXPERIMENTS if n in names]
    assert experiments_for(select("001")) == []                # the analytical model's claims


# -- agreement ------------------------------------------------------------------------------------------
def claim(paper_value=None, experiments=("x",), measure=None, cid="000-t"):
    return Claim(cid, "000", "1", "a claim", "a figure", paper_value, experiments,
                 measure or (lambda docs: Finding("lab", 1.0, True, "up")), "conditions")


def test_agreement_is_a_ratio_where_the_paper_gives_a_number_else_the_direction():
    assert agreement(claim(1.25), Finding("x", 1.0, True, "up")) == \
        (AGREES, "ratio 0.80 (lab / paper); direction holds")
    assert agreement(claim(), Finding("x", 1.0, True, "a > b")) == (AGREES, "direction only: a > b")
    assert agreement(claim(2.0), Finding("x", 1.5, True, "up", against=1.5))[1].startswith("ratio 1.00 (lab / bound)")
    assert agreement(claim(1.2), Finding("x", 5.0, False, "a > b")) == (FLIPPED, "direction FLIPPED: expected a > b")
    status, text = agreement(claim(1.2), Finding("x", 5.0, False, "a > b", invalid=["r1: CPU saturated"]))
    assert status == NOT_JUDGED and "CPU saturated" in text


# -- the catalogue --------------------------------------------------------------------------------------
def doc(*runs):
    return {"runs": [{"label": name, "valid": not reasons, "invalid": reasons} for name, reasons in runs]}


def test_the_catalogue_runs_each_experiment_once_and_writes_every_claim(tmp_path):
    calls = []

    def runner(name, folder, quick):
        calls.append((name, quick))
        return doc(("a", []))

    claims = (claim(1.0, ("ecmp-balance",), cid="000-a"), claim(None, ("ecmp-balance", "switchml"), cid="000-b"),
              claim(None, (), cid="001-model"))
    outcome = catalogue.run(claims, quick=True, out=tmp_path, progress=lambda line: None, runner=runner)
    assert calls == [("ecmp-balance", True), ("switchml", True)]
    assert outcome.ok and [r["status"] for r in outcome.rows] == [AGREES] * 3
    data = json.loads((tmp_path / "catalogue.json").read_text())
    assert data["quick"] and data["machine"]["cpus"]
    assert [r["id"] for r in data["claims"]] == ["000-a", "000-b", "001-model"]
    text = (tmp_path / "catalogue.md").read_text()
    assert "| [000-a](#000-a) | a figure | lab | ratio 1.00 (lab / paper); direction holds |" in text
    assert "3 claims agree in direction, 0 flipped" in text


def test_a_flipped_direction_a_lossless_drop_or_a_failed_experiment_fails_the_run(tmp_path):
    flips = claim(None, ("ecmp-balance",), lambda docs: Finding("lab", None, False, "a > b"))
    outcome = catalogue.run((flips,), out=tmp_path / "a", progress=lambda line: None,
                            runner=lambda *a: doc(("r", [])))
    assert not outcome.ok and outcome.rows[0]["status"] == FLIPPED

    dropped = doc(("r", ["lossless drop: l1-eth3 (l1) dropped 3 over its headroom"]))
    outcome = catalogue.run((claim(None, ("ecmp-balance",)),), out=tmp_path / "b", progress=lambda line: None,
                            runner=lambda *a: dropped)
    assert not outcome.ok and outcome.experiments["ecmp-balance"]["lossless_drops"] == [
        "r: lossless drop: l1-eth3 (l1) dropped 3 over its headroom"]

    def broken(*a):
        raise LabError("a collective failed")

    outcome = catalogue.run((claim(None, ("ecmp-balance",)),), out=tmp_path / "c", progress=lambda line: None,
                            runner=broken)
    assert not outcome.ok
    assert outcome.rows[0]["agreement"] == "experiment failed: ecmp-balance: LabError: a collective failed"


def test_a_cpu_saturated_run_is_not_judged_and_does_not_fail_the_run(tmp_path):
    def measure(docs):
        return Finding("lab", 1.0, False, "up", invalid=[r for r in docs["ecmp-balance"]["runs"][0]["invalid"]])

    outcome = catalogue.run((claim(None, ("ecmp-balance",), measure),), out=tmp_path, progress=lambda line: None,
                            runner=lambda *a: doc(("r", ["CPU saturated: ..."])))
    assert outcome.ok and outcome.rows[0]["status"] == NOT_JUDGED


def test_a_document_without_the_runs_a_claim_reads_is_a_failure_not_a_crash(tmp_path):
    outcome = catalogue.run((claim(None, ("ecmp-balance",), lambda docs: docs["ecmp-balance"]["runs"][5]),),
                            out=tmp_path, progress=lambda line: None, runner=lambda *a: doc(("r", [])))
    assert not outcome.ok and outcome.rows[0]["agreement"].startswith("could not measure: IndexError")


# -- claims measured without a network --------------------------------------------------------------------
def test_the_ring_vs_fully_connected_claims_hold_in_seed_001s_model():
    ar = seed001.allreduce({})
    assert ar.holds and ar.lab_value == pytest.approx(1.0, abs=0.01)
    a2a = seed001.alltoall({})
    assert a2a.holds and a2a.lab_value == pytest.approx(16 / 7, abs=1e-3)      # gamma/(p-1) for p = 8
    for finding in (ar, a2a):
        curves = list(finding.lines["series"].values())
        assert curves[-1][0] > curves[0][0] > 1.0                              # more alpha, more FC gain


def test_the_flow_model_of_the_routing_ring_orders_the_schemes_as_the_paper():
    from fabriclab.workflows.reproduce import seed000

    model = seed000.ring_model()
    assert model["TE"] == pytest.approx(10.0)                       # one flow per uplink: line rate
    assert model["E-ECMP + 4 QPs shared sport"] > 1.2 * model["ECMP"]
    assert model["ECMP + 4 QPs"] > model["ECMP + 4 QPs shared sport"]
    assert model["ECMP + 4 QPs shared sport"] == pytest.approx(model["ECMP"], rel=0.1)   # one hash per pair


def test_random_hashing_of_1000_flows_on_16_links_gives_the_papers_1_2():
    assert ecmp_balance.expected_max_mean([(1000, 16)], trials=300, seed=3) == pytest.approx(1.22, abs=0.03)
    groups = ecmp_balance.uplink_groups(Fabric(load_spec("routing")), 5)
    assert groups == [(240, 4)] * 4
    few = ecmp_balance.expected_max_mean([(48, 4)] * 4, trials=300)
    assert few > ecmp_balance.expected_max_mean(groups, trials=300) > 1.1


@pytest.mark.parametrize("spec", ["rail_optimized", "multiplane_pfc", "default"])
def test_uplink_groups_count_every_nic_and_plane(spec):
    """Every host port sends to its peers (same NIC, same plane) on other leaves: on a rail spec
    each NIC's leaf carries its own rail, on a multiplane spec every plane's leaves carry traffic."""
    from fabriclab.traffic.allpairs import all_pairs_plan

    fabric = Fabric(load_spec(spec))
    groups = ecmp_balance.uplink_groups(fabric, 2)
    leaves = sorted(s for s, sw in fabric.switches.items() if sw.role == "leaf")
    assert len(groups) == len(leaves) and all(flows > 0 for flows, _ in groups)
    # the plan's flows whose ends sit under different leaves, counted at their source leaf
    leaf_of = {p.ip: p.leaf for h in fabric.hosts.values() for p in h.ports}
    crossing = [f for flows in all_pairs_plan(fabric, flows_per_pair=2).values() for f in flows
                if leaf_of[f["src"]] != leaf_of[f["dst"]]]
    assert sum(flows for flows, _ in groups) == len(crossing)


# -- lossless conditions -----------------------------------------------------------------------------------
def test_routing_schemes_runs_lossless_and_says_so_or_lossy_when_asked():
    plan = build_plan("routing-schemes", options=Options(quick=True))
    assert plan.spec.queues.pfc.enabled and plan.spec.queues.ecn.mode == "off"
    lossy = build_plan("routing-schemes", options=Options(quick=True, lossy=True))
    assert lossy.spec.queues is None
    assert routing.conditions({"mechanisms": {"queue_model": None}}) == "LOSSY (tail drop, no PFC)"
    described = {"mechanisms": {"queue_model": {"spec": plan.spec.queues.to_dict()}}}
    assert routing.conditions(described) == "lossless (PFC, ECN off)"
    with pytest.raises(LabError, match="routing-schemes runs on a lossless class: spec 'default' has no queues"):
        build_plan("routing-schemes", spec="default")
    with pytest.raises(LabError, match="experiment pfc-incast takes no --lossy"):
        build_plan("pfc-incast", options=Options(lossy=True))


def test_a_drop_in_a_lossless_class_makes_the_run_invalid_naming_the_port():
    report = {"report": {"ports": [
        {"port": "l1-eth1", "node": "l1", "class": "lossless", "lossless_drops": 3, "wd_drops": 0},
        {"port": "l1-eth2", "node": "l1", "class": "lossy", "drops": 7},
        {"port": "s1-eth1", "node": "s1", "class": "lossless", "lossless_drops": 0, "wd_drops": 2}]}}
    assert pipeline.lossless_drops(report) == [
        "lossless drop: l1-eth1 (l1) dropped 3 over its headroom",
        "lossless drop: s1-eth1 (s1) dropped 0 over its headroom and 2 by the PFC watchdog"]
    assert pipeline.lossless_drops(None) == []
    run = {"label": "ECMP", "valid": False, "invalid": pipeline.lossless_drops(report)}
    assert label(run) == "ECMP (LOSSLESS DROPS)"
    assert label({"label": "x", "valid": False, "invalid": ["ring: CPU saturated: ..."]}) == "x (CPU SATURATED)"


# -- the command line ----------------------------------------------------------------------------------
def test_bad_input_is_one_line_before_anything_runs(tmp_path, capsys):
    from fabriclab.cli.main import main

    assert main(["reproduce", "--only", "9-nope"]) == 2
    assert main(["reproduce", "--from", str(tmp_path)]) == 2
    (tmp_path / "catalogue.json").write_text('{"quick": "yes"}')
    assert main(["reproduce", "--from", str(tmp_path)]) == 2
    machine = '{"kernel": "6.1", "cpus": 2, "arch": "x86_64"}'
    for bad in ('{"quick": true, "created": "x", "machine": %s, "extra": 1}' % machine,
                '{"quick": true, "created": "x", "machine": {"kernel": "6.1", "cpus": 2, "arch": "a", "gpu": 1}}',
                '{"quick": true, "created": "x", "machine": {"kernel": "6.1", "cpus": NaN, "arch": "a"}}',
                '{"quick": true, "created": "x", "machine": {"kernel": "6.1", "cpus": "2", "arch": "a"}}'):
        (tmp_path / "catalogue.json").write_text(bad)
        assert main(["reproduce", "--from", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 7 and "unknown seed or claim '9-nope'" in err[0]
    assert "no catalogue.json here" in err[1] and all("catalogue" in line for line in err[2:])
    assert "unknown key 'extra'" in err[3] and "unknown key 'gpu'" in err[4]


def test_only_list_names_every_claim_offline(capsys):
    from fabriclab.cli.main import main

    assert main(["reproduce", "--only", "list"]) == 0
    out = capsys.readouterr().out
    assert all(c.id in out for c in CLAIMS) and "(model)" in out


def test_the_model_claims_run_offline_into_a_catalogue_and_a_markdown_document(tmp_path, capsys):
    from fabriclab.cli.main import main

    doc = tmp_path / "docs" / "reproductions.md"
    doc.parent.mkdir()
    assert main(["reproduce", "--only", "001", "--out", str(tmp_path / "out"), "--markdown", str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith("# Reproductions") and "![001-alltoall-topology](reproductions/001-alltoall-topology.png)" in text
    assert (tmp_path / "docs" / "reproductions" / "001-alltoall-topology.png").stat().st_size > 5_000


def test_e_ecmp_against_ecmp_is_judged_on_the_mean_of_several_hash_draws():
    from fabriclab.workflows.reproduce import seed000

    plan = build_plan("routing-schemes", options=Options(quick=True))
    for scheme in routing.DRAWN:
        drawn = [r for r in plan.runs if r.tags.get("scheme") == scheme and not r.faults]
        assert len(drawn) == routing.DRAWS
        assert len({r.jobs[0].workload.seed for r in drawn}) == routing.DRAWS     # new source ports each

    eecmp = "E-ECMP + 4 QPs shared sport"

    def run(scheme, busbw, draw=1):
        tags = {"scheme": scheme, **({"draw": draw} if draw > 1 else {})}
        return {"label": scheme + (f", draw {draw}" if draw > 1 else ""), "faults": [], "tags": tags,
                "valid": True, "invalid": [], "jobs": {"ring": {"sizes": [{"busbw_mbps": busbw}]}}}
    # the first draw alone would flip (4.9 < 5.0); the mean of three does not
    doc = {"runs": [run("ECMP", 5.0), run(eecmp, 4.9), run("ECMP", 5.0, 2), run(eecmp, 9.6, 2),
                    run("ECMP", 9.8, 3), run(eecmp, 9.7, 3)]}
    finding = seed000.eecmp_gain({"routing-schemes": doc})
    assert finding.holds and finding.lab_value == pytest.approx(8.0667 / 6.6, rel=1e-3)
    assert "mean of 3 hash draws" in finding.lab and "4.90/5.00" in finding.lab
