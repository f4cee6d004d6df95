"""`fabriclab reproduce`: choosing claims, stating agreement, the catalogue and its exit status,
with fake experiments (the lab test runs the real ones); the model-only claims in full."""

import collections
import json
import pathlib
import random

import pytest

from fabriclab.errors import LabError
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import load_spec
from fabriclab.workflows import pipeline
from fabriclab.workflows.experiments import EXPERIMENTS, Options, build_plan, ecmp_balance, label, routing
from fabriclab.workflows.reproduce import CLAIMS, catalogue, experiments_for, judge, select, seed001
from fabriclab.workflows.reproduce.claim import (AGREES, FLIPPED, INCONCLUSIVE, KNOWN, NOT_JUDGED, Claim, Effect,
                                                 Finding, agreement)


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


# -- judging over draws ---------------------------------------------------------------------------------
def claim(paper_value=None, experiments=("x",), measure=None, cid="000-t", reproduced=True, draws=3):
    return Claim(cid, "000", "1", "a claim", "a figure", paper_value, experiments,
                 measure or (lambda docs: found(1.0)), "conditions", reproduced=reproduced,
                 draws=draws, quick_draws=draws)


def found(*values, op=">", bound=0.0, lab_value=1.0, invalid=()):
    """A draw's finding whose effects are `values` against `op bound`."""
    return Finding("lab", lab_value, tuple(Effect(f"e{i}", v, op, bound) for i, v in enumerate(values)), "up",
                   invalid=list(invalid))


def test_the_interval_is_students_t_and_needs_two_draws():
    iv = judge.interval([1.0, 2.0, 3.0])
    half = 2.919986 * 1.0 / 3 ** 0.5                                    # t(0.95, 2) * s / sqrt(n)
    assert iv.mean == 2.0 and iv.lo == pytest.approx(2.0 - half) and iv.hi == pytest.approx(2.0 + half)
    one = judge.interval([4.0])
    assert one.lo is None and judge.side(one, ">", 0.0) == judge.STRADDLE      # one draw: no interval
    assert judge.interval([]) is None
    same = judge.interval([0, 0, 0])                                     # a mechanism: no spread
    assert (same.lo, same.hi) == (0, 0) and judge.side(same, "<", 0.5) == judge.AGREE
    with pytest.raises(ValueError):
        judge.interval([1.0, float("nan")])


@pytest.mark.parametrize("values, op, expected", [
    ([1.2, 1.3, 1.25, 1.28], ">", judge.AGREE),          # all of it above 1
    ([0.8, 1.3, 1.0, 1.1], ">", judge.STRADDLE),
    ([0.7, 0.8, 0.75], ">", judge.WRONG),
    ([1.0, 1.0, 1.0], ">", judge.WRONG),                 # the bound itself is not the paper's side
    ([0.7, 0.8, 0.75], "<", judge.AGREE),
    ([1.2, 1.3, 1.25], "<", judge.WRONG),
])
def test_an_effects_side_is_where_its_whole_interval_lies(values, op, expected):
    assert judge.side(judge.interval(values), op, 1.0) == expected


def test_the_judge_fed_distributions_agrees_straddles_and_flips_as_their_means_lie():
    """Draws from a known distribution, many times over: far on the paper's side the claim agrees
    nearly always (90% interval: a wrong verdict needs the interval to miss by more than its width,
    under 5% of the time); a mean on the bound is inconclusive or either way by chance, never
    often flipped (at most 5% + noise); far on the wrong side it flips."""
    rng = random.Random(7)

    def verdicts(mean, sd, n=5, trials=400):
        out = collections.Counter()
        for _ in range(trials):
            findings = [found(rng.gauss(mean, sd), bound=1.0) for _ in range(n)]
            out[agreement(claim(), findings).status] += 1
        return out

    far = verdicts(1.5, 0.1)
    assert far[AGREES] == 400
    on = verdicts(1.0, 0.1)
    assert on[INCONCLUSIVE] > 0.8 * 400 and on[FLIPPED] < 0.08 * 400 and on[AGREES] < 0.08 * 400
    wrong = verdicts(0.5, 0.1)
    assert wrong[FLIPPED] == 400
    # near the bound with a wide spread: mostly inconclusive, never flipped when the mean is right
    noisy = verdicts(1.1, 0.3)
    assert noisy[INCONCLUSIVE] > 0.5 * 400 and noisy[FLIPPED] < 0.02 * 400


def test_a_claim_agrees_only_when_every_effect_does_and_flips_when_any_is_wrong():
    both = [found(1.2, 1.3), found(1.25, 1.4), found(1.3, 1.35)]
    judged = agreement(claim(), [found(*[v - 1 for v in f_values]) for f_values in ((1.2, 1.3), (1.25, 1.4), (1.3, 1.35))])
    assert judged.status == AGREES and judged.draws == 3 and len(judged.effects) == 2
    assert agreement(claim(), both).text.startswith("agrees over 3 draws: e0 ")
    straddle = [found(0.2, 1.0), found(0.3, -1.0), found(0.25, 0.5)]
    assert agreement(claim(), straddle).status == INCONCLUSIVE
    flipped = [found(0.2, -1.0), found(0.3, -1.1), found(-5.0, -0.9)]    # e1 wholly wrong, e0 straddles
    judged = agreement(claim(), flipped)
    assert judged.status == FLIPPED and "e1" in judged.text and "e0" not in judged.text
    assert agreement(claim(reproduced=False), flipped).status == KNOWN


def test_agreement_states_the_ratio_to_the_paper_or_a_bound_and_the_intervals():
    judged = agreement(claim(1.25), [found(1.0, lab_value=v) for v in (0.9, 1.0, 1.1)])
    assert judged.status == AGREES and judged.text.startswith("ratio 0.80 (lab / paper); agrees over 3 draws")
    assert judged.lab.mean == pytest.approx(1.0) and judged.lab.lo < 1.0 < judged.lab.hi
    bound = Finding("x", 1.5, (Effect("e", 2.0, ">", 1.0),), "up", against=1.5)
    assert agreement(claim(2.0, draws=1), [bound]).text.startswith("inconclusive over 1 draw")
    assert agreement(claim(2.0, draws=2), [bound, bound]).text.startswith("ratio 1.00 (lab / bound)")


def test_invalid_draws_are_left_out_and_too_few_valid_ones_leave_the_claim_not_judged():
    ok = [found(1.0), found(1.1), found(1.2)]
    saturated = found(-5.0, invalid=["r1: CPU saturated"])
    judged = agreement(claim(), ok[:2] + [saturated])
    assert judged.status == AGREES and judged.draws == 2 and judged.invalid == ["draw 3: r1: CPU saturated"]
    judged = agreement(claim(), [ok[0], saturated, saturated])
    assert judged.status == NOT_JUDGED and "CPU saturated" in judged.text
    nan = found(float("nan"))
    assert agreement(claim(), [ok[0], nan, nan]).status == NOT_JUDGED
    with pytest.raises(ValueError, match="same effects"):
        agreement(claim(), [found(1.0), found(1.0, 2.0)])


# -- the catalogue --------------------------------------------------------------------------------------
def doc(*runs):
    return {"runs": [{"label": name, "valid": not reasons, "invalid": reasons} for name, reasons in runs]}


def test_the_catalogue_runs_each_experiments_draws_once_and_writes_every_claim(tmp_path):
    calls = []

    def runner(name, folder, quick, k):
        calls.append((name, quick, k, folder.relative_to(tmp_path).as_posix()))
        return doc(("a", []))

    claims = (claim(1.0, ("ecmp-balance",), cid="000-a", draws=2), claim(None, ("ecmp-balance", "switchml"),
              cid="000-b", draws=3), claim(None, (), cid="001-model"))
    outcome = catalogue.run(claims, quick=True, out=tmp_path, progress=lambda line: None, runner=runner)
    assert calls == [("ecmp-balance", True, k, f"experiments/ecmp-balance/draw-{k}") for k in (1, 2, 3)] + \
        [("switchml", True, k, f"experiments/switchml/draw-{k}") for k in (1, 2, 3)]
    # every effect is 1.0 > 0 on every draw: no spread, all of it on the paper's side
    assert outcome.ok and [r["status"] for r in outcome.rows] == [AGREES] * 3
    assert [r["draws"] for r in outcome.rows] == [3, 3, 1]                       # a model's claim: one
    data = json.loads((tmp_path / "catalogue.json").read_text())
    assert data["quick"] and data["machine"]["cpus"] and data["experiments"]["switchml"]["draws"] == 3
    assert [r["id"] for r in data["claims"]] == ["000-a", "000-b", "001-model"]
    assert data["claims"][0]["lab_interval"] == {"mean": 1.0, "lo": 1.0, "hi": 1.0, "n": 3}
    text = (tmp_path / "catalogue.md").read_text()
    assert "| [000-a](#000-a) | a figure | 1 (all 3 draws) | 3 of 3 | agrees |" in text
    assert "3 claims agree, 0 inconclusive, 0 flipped" in text
    assert catalogue.run(claims[:1], out=tmp_path / "d", progress=lambda line: None, runner=runner,
                         draws=1).rows[0]["status"] == INCONCLUSIVE        # one draw: no interval
    with pytest.raises(LabError, match="--draws must be 1-50"):
        catalogue.run(claims, out=tmp_path / "e", progress=lambda line: None, runner=runner, draws=0)


def test_an_inconclusive_claim_does_not_fail_the_run_a_flipped_one_does(tmp_path):
    values = iter([0.5, -0.2, 0.1])
    straddles = claim(None, ("ecmp-balance",), lambda docs: found(next(values)))
    outcome = catalogue.run((straddles,), out=tmp_path / "a", progress=lambda line: None,
                            runner=lambda *a: doc(("r", [])))
    assert outcome.ok and outcome.rows[0]["status"] == INCONCLUSIVE
    assert outcome.rows[0]["effects"][0]["side"] == judge.STRADDLE
    flips = claim(None, ("ecmp-balance",), lambda docs: found(-1.0))
    outcome = catalogue.run((flips,), out=tmp_path / "b", progress=lambda line: None,
                            runner=lambda *a: doc(("r", [])))
    assert not outcome.ok and outcome.rows[0]["status"] == FLIPPED


def test_a_lossless_drop_or_a_failed_draw_fails_the_run_and_the_draw_is_left_out(tmp_path):
    dropped = doc(("r", ["lossless drop: l1-eth3 (l1) dropped 3 over its headroom"]))
    outcome = catalogue.run((claim(None, ("ecmp-balance",), draws=1),), out=tmp_path / "b",
                            progress=lambda line: None, runner=lambda *a: dropped)
    assert not outcome.ok and outcome.experiments["ecmp-balance"]["lossless_drops"] == [
        "r: lossless drop: l1-eth3 (l1) dropped 3 over its headroom"]

    def broken(name, folder, quick, k):
        if k == 2:
            raise LabError("a collective failed")
        return doc(("r", []))

    # The failed draw is left out of the claim, which is judged over the other two; the run
    # still fails, and the catalogue names the draw and why.
    outcome = catalogue.run((claim(None, ("ecmp-balance",)),), out=tmp_path / "c", progress=lambda line: None,
                            runner=broken)
    assert not outcome.ok
    row = outcome.rows[0]
    assert row["status"] == AGREES and row["judged_draws"] == 2 and row["draws"] == 3
    assert row["invalid"] == ["draw 2: ecmp-balance failed: LabError: a collective failed"]
    assert outcome.experiments["ecmp-balance"]["failed_draws"] == {"2": "LabError: a collective failed"}
    text = (tmp_path / "c" / "catalogue.md").read_text()
    assert "failed: draw 2: LabError: a collective failed" in text
    assert "Left out: draw 2: ecmp-balance failed: LabError: a collective failed." in text

    # When too few draws are left, the claim is not judged (no longer called flipped).
    outcome = catalogue.run((claim(None, ("ecmp-balance",)),), out=tmp_path / "d", progress=lambda line: None,
                            runner=lambda name, folder, quick, k: broken(name, folder, quick, 2))
    assert not outcome.ok and outcome.rows[0]["status"] == NOT_JUDGED
    assert outcome.rows[0]["agreement"].startswith("not judged: draw 1: ecmp-balance failed: LabError")


def test_a_cpu_saturated_draw_is_left_out_and_all_of_them_leave_the_claim_not_judged(tmp_path):
    def measure(docs):
        return found(1.0, invalid=docs["ecmp-balance"]["runs"][0]["invalid"])

    outcome = catalogue.run((claim(None, ("ecmp-balance",), measure),), out=tmp_path, progress=lambda line: None,
                            runner=lambda *a: doc(("r", ["CPU saturated: ..."])))
    assert outcome.ok and outcome.rows[0]["status"] == NOT_JUDGED


def test_a_document_without_the_runs_a_claim_reads_is_a_failure_not_a_crash(tmp_path):
    outcome = catalogue.run((claim(None, ("ecmp-balance",), lambda docs: docs["ecmp-balance"]["runs"][5]),),
                            out=tmp_path, progress=lambda line: None, runner=lambda *a: doc(("r", [])))
    assert not outcome.ok and outcome.rows[0]["agreement"].startswith("could not measure: IndexError")


def test_a_catalogue_read_back_is_judged_again_over_the_draws_it_holds(tmp_path):
    from fabriclab.results import document

    seen = []

    def runner(name, folder, quick, k):
        seen.append(k)
        return doc(("r", []))

    outcome = catalogue.run((claim(None, ("ecmp-balance",), draws=2),), quick=True, out=tmp_path,
                            progress=lambda line: None, runner=runner)
    read, quick, origin, draws = catalogue.reader(tmp_path)
    assert quick and draws == {"ecmp-balance": 2} and origin["machine"] == outcome_machine(tmp_path)
    loaded = []
    original = document.load
    try:
        document.load = lambda folder: loaded.append(pathlib.Path(folder).relative_to(tmp_path).as_posix()) or {}
        read("ecmp-balance", None, True, 2)
    finally:
        document.load = original
    assert loaded == ["experiments/ecmp-balance/draw-2"] and seen == [1, 2]


def outcome_machine(folder):
    return json.loads((folder / "catalogue.json").read_text())["machine"]


def flaps_doc(per_plane_removal_s, software_removal_s, p99_per_plane, p99_software):
    """A plane-flaps document: one host link down at t=1 s in each flapping case, and each NIC's
    removal of that plane `*_removal_s` later."""
    def run(label, removal_s, p99):
        flapping = removal_s is not None
        events = [{"t_s": 1.0, "event": "h1-p2l1 down", "undo": False}] if flapping else []
        removed = [{"event": "removed", "plane": 2, "t": 1001.0 + removal_s}] if flapping else []
        return {"label": label, "origin_unix": 1000.0, "invalid": [], "faults": [{"events": events}],
                "jobs": {"ring": {"sizes": [{"cct_ms": {"p99": p99}}],
                                  "plb": {"ranks": {"0": {"events": removed}}}}}}
    return {"runs": [run("no flaps", None, 300.0), run("per-plane", per_plane_removal_s, p99_per_plane),
                     run("software, 0.4 s", software_removal_s, p99_software)]}


def test_the_flap_claim_reads_reactions_and_tails_and_flips_when_software_is_sooner():
    from fabriclab.workflows.reproduce.seed002 import flap_tail

    claim = next(c for c in CLAIMS if c.id == "002-flap-tail")
    found = flap_tail({"plane-flaps": flaps_doc(0.004, 0.4, 400.0, 700.0)})
    assert [e.value for e in found.effects] == [pytest.approx(100), pytest.approx(1.75)]
    assert "0.004 s (per-plane) against 0.400 s" in found.lab
    assert agreement(claim, [found, flap_tail({"plane-flaps": flaps_doc(0.005, 0.41, 410.0, 720.0)})]).status == AGREES
    wrong = [flap_tail({"plane-flaps": flaps_doc(0.4, 0.004, 700.0 + i, 400.0)}) for i in range(2)]
    assert agreement(claim, wrong).status == FLIPPED
    # a NIC that removed nothing: the draw cannot be judged, not a crash
    nothing = flaps_doc(0.004, 0.4, 400.0, 700.0)
    nothing["runs"][1]["jobs"]["ring"]["plb"]["ranks"]["0"]["events"] = []
    assert "not a finite number" in agreement(claim, [flap_tail({"plane-flaps": nothing})] * 2).invalid[0]


def dcqcn_doc(quick, pfc_pauses, dcqcn_pauses, cct=(1200.0, 1250.0, 1300.0, 1320.0)):
    labels = ("PFC only, relaxed ECN", "PFC only, tight ECN", "DCQCN, relaxed ECN", "DCQCN, tight ECN")
    pauses = dict(zip(labels, (0, pfc_pauses, 0, dcqcn_pauses)))
    return {"plan": {"source": {"experiment": "ecn-dcqcn", "quick": quick}}, "runs": [
        {"label": lab, "invalid": [], "jobs": {"allreduce": {"sizes": [{"cct_ms": {"p50": ms}}]}},
         "queues": {"hops": {"leaf->spine": {"pauses": pauses[lab]}}}} for lab, ms in zip(labels, cct)]}


def test_the_dcqcn_claim_judges_pauses_in_the_full_form_only():
    """CI, 2026-11-28: the quick form's pauses came before DCQCN acted, alike in both cases, and a
    difference of +1 in both draws read as a flip."""
    from fabriclab.workflows.reproduce.seed000 import dcqcn_cost

    claim = next(c for c in CLAIMS if c.id == "000-dcqcn")
    quick = [dcqcn_cost({"ecn-dcqcn": dcqcn_doc(True, 30, 31)}) for _ in range(2)]
    assert [e.name for e in quick[0].effects] == ["CCT DCQCN tight / DCQCN relaxed"]
    assert "not judged in the quick form" in quick[0].lab and agreement(claim, quick).status != FLIPPED
    full = [dcqcn_cost({"ecn-dcqcn": dcqcn_doc(False, 275 + i, 0)}) for i in range(2)]
    assert [e.value for e in full[0].effects] == [pytest.approx(1320 / 1300), -275]     # Figure 12: tight / relaxed, both DCQCN
    assert agreement(claim, full).status == AGREES
    assert agreement(claim, [dcqcn_cost({"ecn-dcqcn": dcqcn_doc(False, 0, 9 + i)}) for i in range(2)]).status == FLIPPED


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




def test_a_draw_starts_at_the_rates_the_previous_draw_settled_on(tmp_path, monkeypatch):
    from fabriclab.results import document
    from tests.unit import resultdocs as rd

    seen = []
    monkeypatch.setattr(pipeline, "run_plan", rd.saturating_run_plan(seen))
    outcome = catalogue.run((claim(None, ("pfc-incast",), draws=3),), quick=True, out=tmp_path,
                            progress=lambda line: None)
    # draw 1 tried full and half rate before a quarter; draws 2 and 3 start at a quarter
    assert seen == [10, 5, 2.5, 2.5, 2.5]
    assert outcome.experiments["pfc-incast"]["derated"] == {
        "1": {"rate_divisor": 4, "attempts": 3, "started": 1},
        "2": {"rate_divisor": 4, "attempts": 1, "started": 4}, "3": {"rate_divisor": 4, "attempts": 1, "started": 4}}
    assert document.load(tmp_path / catalogue.draw_folder("pfc-incast", 2))["attempts"][0]["derate"] == 2
    text = (tmp_path / "catalogue.md").read_text()
    assert "draw 1: 1/4 (CPU saturated at full); draw 2: 1/4 (started at 1/4, where the previous draw settled)" in text
    seen.clear()
    catalogue.run((claim(None, ("pfc-incast",), draws=2),), quick=True, out=tmp_path / "kept",
                  progress=lambda line: None, derate=False)
    assert seen == [10, 10]                        # --no-derate: every draw at the spec's rates


def test_a_stopped_run_resumed_reads_the_draws_it_finished_and_runs_the_rest(tmp_path, monkeypatch):
    """Draw 1 ran at full, half and a quarter rate, draw 2 at a quarter, then the run stopped in
    draw 3: resumed, only draw 3 runs, and at the quarter rate draw 2 settled on."""
    from fabriclab.errors import Terminated
    from tests.unit import resultdocs as rd

    seen = []
    stand_in = rd.saturating_run_plan(seen)

    def stopped_in_draw_3(plan, out, **kw):
        if len(seen) == 4:
            raise Terminated("stopped")
        return stand_in(plan, out, **kw)

    claims = (claim(None, ("pfc-incast",), draws=3),)
    monkeypatch.setattr(pipeline, "run_plan", stopped_in_draw_3)
    with pytest.raises(Terminated):
        catalogue.run(claims, quick=True, out=tmp_path, progress=lambda line: None)
    assert seen == [10, 5, 2.5, 2.5]
    seen.clear()
    monkeypatch.setattr(pipeline, "run_plan", stand_in)
    outcome = catalogue.run(claims, quick=True, out=tmp_path, progress=lambda line: None, resume=True)
    assert seen == [2.5] and outcome.ok
    ran = outcome.experiments["pfc-incast"]
    assert ran["resumed"] == [1, 2] and ran["derated"]["1"] == {"rate_divisor": 4, "attempts": 3, "started": 1}
    assert "| pfc-incast | 3 (2 from an earlier run) |" in (tmp_path / "catalogue.md").read_text()


def test_only_a_finished_draw_of_the_same_experiment_form_and_seed_is_read_back(tmp_path, monkeypatch):
    from fabriclab.results import document
    from tests.unit import resultdocs as rd

    seen = []
    monkeypatch.setattr(pipeline, "run_plan", rd.saturating_run_plan(seen, below_mbps=20))
    catalogue.run((claim(None, ("pfc-incast",), draws=2),), quick=True, out=tmp_path, progress=lambda line: None)
    first = tmp_path / catalogue.draw_folder("pfc-incast", 1)
    assert catalogue.finished_draw("pfc-incast", first, True, 1)["plan"]["source"]["seed"] == 1
    assert catalogue.finished_draw("pfc-incast", first, True, 2) is None           # another seed's
    assert catalogue.finished_draw("pfc-incast", first, False, 1) is None          # the quick form's
    assert catalogue.finished_draw("ecmp-balance", first, True, 1) is None         # another experiment's
    got = document.load(first)
    got["runs"][0]["label"] = "a case the experiment no longer has"
    document.write(got, first)
    assert catalogue.finished_draw("pfc-incast", first, True, 1) is None
    got = document.load(tmp_path / catalogue.draw_folder("pfc-incast", 2))
    got["runs"][0]["valid"], got["runs"][0]["invalid"] = False, ["ring: CPU saturated: ..."]
    document.write(got, first.with_name("draw-3"))
    got["plan"]["source"]["seed"] = 3
    document.write(got, first.with_name("draw-3"))
    # saturated at full rate and never run again slower: the stop came before its next attempt
    assert catalogue.finished_draw("pfc-incast", first.with_name("draw-3"), True, 3) is None
    assert catalogue.finished_draw("pfc-incast", first.with_name("draw-3"), True, 3, derate=False) is not None
    (first.with_name("draw-2") / "results.json").write_text('{"schema_version": ')          # cut off mid-write
    assert catalogue.finished_draw("pfc-incast", first.with_name("draw-2"), True, 2) is None
    assert catalogue.finished_draw("pfc-incast", tmp_path / "nothing", True, 1) is None
    with pytest.raises(LabError, match="resume reads the draws"):
        catalogue.run((claim(None, ("pfc-incast",)),), out=tmp_path, progress=lambda line: None,
                      runner=lambda *a: doc(("r", [])), resume=True)


def test_a_draw_run_again_slower_records_the_scale_its_verdict_came_from(tmp_path):
    def runner(name, folder, quick, k):
        got = doc(("r", []))
        if k == 2:
            got["attempts"] = [{"derate": 0, "host_rate_mbps": 10, "time_scale": 40000, "saturated": ["r"]},
                               {"derate": 1, "host_rate_mbps": 5, "time_scale": 80000, "saturated": []}]
        return got

    outcome = catalogue.run((claim(None, ("ecmp-balance",)),), quick=True, out=tmp_path,
                            progress=lambda line: None, runner=runner)
    assert outcome.ok and outcome.experiments["ecmp-balance"]["derated"] == {"2": {"rate_divisor": 2, "attempts": 2,
                                                                                   "started": 1}}
    text = (tmp_path / "catalogue.md").read_text()
    assert "| ecmp-balance | 3 |" in text and "draw 2: 1/2 (CPU saturated at full)" in text


def test_a_machine_that_cannot_bring_up_any_fabric_stops_the_run_at_once(tmp_path):
    """A leftover fabric's names (or a missing binary) fail every draw alike: the first such error
    ends the run, rather than ten draws failing in turn and every claim left out."""
    from fabriclab.errors import EnvironmentProblem

    calls = []

    def taken(name, folder, quick, k):
        calls.append(k)
        raise EnvironmentProblem("38 names this fabric needs already exist, e.g. l1; run `fabriclab clean`")

    with pytest.raises(EnvironmentProblem, match="already exist"):
        catalogue.run((claim(None, ("ecmp-balance",)),), out=tmp_path, progress=lambda line: None, runner=taken)
    assert calls == [1]


def test_names_a_fabric_needs_that_exist_are_an_environment_problem(monkeypatch):
    import subprocess
    import types

    from fabriclab.errors import EnvironmentProblem
    from fabriclab.lab import network
    from fabriclab.topologies.fabric import Fabric
    from fabriclab.topologies.spec import load_spec

    out = {"ovs-vsctl": "l1\nother\n", "ip": "7: l1-eth1@if8: <BROADCAST> mtu 1500\n"}
    monkeypatch.setattr(subprocess, "run", lambda argv, **kw: types.SimpleNamespace(stdout=out[argv[0]], returncode=0))
    run = types.SimpleNamespace(id="20261129-120000-abcdef", data={"bridges": ["l1"], "interfaces": []})
    with pytest.raises(EnvironmentProblem, match=r"2 names this fabric needs already exist, e\.g\. l1 \(owned by "
                                                 r"run 20261129-120000-abcdef\); stop that fabric or run"):
        network.check_free(Fabric(load_spec("tiny")), [run])
    out.update({"ovs-vsctl": "other\n", "ip": ""})
    network.check_free(Fabric(load_spec("tiny")), [run])                 # nothing taken: no error


def test_an_experiments_minutes_count_every_attempt_of_a_draw(tmp_path):
    """A draw run again slower paid for the doomed attempt too: the catalogue's time is their sum."""
    def slowed(name, folder, quick, k):
        out = doc(("r", []))
        out["elapsed_s"] = 40.0
        if k == 1:
            out["attempts"] = [{"derate": 0, "host_rate_mbps": 10.0, "time_scale": 4e4, "saturated": ["r"],
                                "elapsed_s": 25.0}, {"derate": 1, "host_rate_mbps": 5.0, "time_scale": 8e4,
                                                     "saturated": [], "elapsed_s": 40.0}]
        return out

    outcome = catalogue.run((claim(None, ("ecmp-balance",), draws=2),), out=tmp_path, progress=lambda line: None,
                            runner=slowed)
    assert outcome.experiments["ecmp-balance"]["seconds"] == 25.0 + 40.0 + 40.0


def tuning_doc(cct, paused):
    """dcqcn-tuning's four cases: CCT p50 (ms) and the sender NICs' paused share of each."""
    from fabriclab.workflows.experiments.dcqcn_tuning import SETTINGS

    return {"runs": [{"label": label, "invalid": [], "jobs": {"alltoall": {"sizes": [{"cct_ms": {"p50": ms}}]}},
                      "queues": {"hops": {"leaf->NIC": {"paused_share": share}}}}
                     for label, ms, share in zip(SETTINGS, cct, paused)]}


def test_the_dcqcn_tuning_claim_reads_the_best_relaxed_case_and_the_paused_share():
    from fabriclab.workflows.reproduce.seed000 import dcqcn_tuning

    # 2026-12-02's full run: defaults 4159 ms, relaxed 1794 / 4578 / 1904; NICs paused 9.1% / 16.1, 7.5, 14.2%
    found = dcqcn_tuning({"dcqcn-tuning": tuning_doc((4159, 1794, 4578, 1904), (0.091, 0.161, 0.075, 0.142))})
    gain, growth = (e.value for e in found.effects)
    assert gain == pytest.approx(1794 / 4159) and "gentler cuts" in found.lab
    assert growth == pytest.approx((0.126 + 0.001) / (0.091 + 0.001))
    assert [e.holds for e in found.effects] == [False, True]
    claim = next(c for c in CLAIMS if c.id == "000-dcqcn-tuning")
    assert not claim.reproduced             # the lab's stretched DCQCN gains far more than 3%
    # defaults that never paused still give a finite growth
    quiet = dcqcn_tuning({"dcqcn-tuning": tuning_doc((100, 99, 98, 97), (0.0, 0.0, 0.0, 0.0))})
    assert quiet.effects[1].value == pytest.approx(1.0)
