"""ecmp-tiers on a real three-tier fabric (every spine has two uplinks), on every draw `reproduce
--quick` ran: with a hash basis per switch every uplink of every tier carries traffic, spread as
the flow model hashing as the switches do says (a draw inside random hashing's band); with one
basis everywhere each spine sends its cross-zone traffic up one uplink only, as the model says."""

import pytest

from fabriclab.workflows.experiments import ecmp_tiers

pytestmark = pytest.mark.lab

PER_SWITCH = ("ECMP", "E-ECMP", "flowlet")


def test_every_uplink_of_every_tier_carries_traffic_unless_the_switches_share_a_basis(quick_catalogue, figure):
    for k, doc in quick_catalogue.docs("ecmp-tiers"):
        runs = {r["label"]: r for r in doc["runs"]}
        assert set(runs) == {name for name, _routing in ecmp_tiers.CASES}
        for name in PER_SWITCH:
            run = runs[name]
            loads = ecmp_tiers.tier_loads(run)
            assert set(loads) == {"leaf", "spine"} and len(loads["spine"]) == 8, (k, name, loads)
            assert ecmp_tiers.idle_uplinks(run) == {"leaf": 0, "spine": 0}, (k, name, loads)
            assert run["routing_state"]["hash"]["shared"] is False
            assert len(set(run["routing_state"]["hash"]["bases"].values())) == 12        # one a switch
            for tier, value in ecmp_tiers.measured(run).items():
                band = run["tags"]["random"]["tiers"][tier]
                if name == "flowlet":
                    # flowlet places by load, not by a hash draw: below random hashing's 99th
                    # percentile on every draw seen (4 draws of 2 CI catalogues, 2026-11-27: 0.12
                    # to 0.30 below it)
                    assert figure(f"flowlet {tier} uplink max/mean - random p99, draw {k}",
                                  value - band["p99"]) < 0, (k, tier, value, band)
                    continue
                # A hash's spread is one draw of random hashing's: this draw's (its seed fixes the
                # flows' ports and the switches' bases) is what the flow model, hashing as the
                # switches do, predicts, and that prediction sits inside the random band. The lab
                # then matches the model: 5 ECMP and 3 E-ECMP draws, 2026-11-27, gave lab / model
                # 0.965-1.027 per tier, so the bound, 0.15, is 4 times the widest seen. (One draw
                # measured E-ECMP's leaf tier at 1.230 against the p99 of 1.219, with the model at
                # 1.198: comparing the lab's figure with the band directly failed on a correct run.)
                predicted = run["tags"]["model"][tier]
                assert predicted <= band["p99"], (k, name, tier, predicted, band)
                assert figure(f"{name} {tier} max/mean lab / model, draw {k}", value / predicted) == \
                    pytest.approx(1, abs=0.15), (k, name, tier, value, predicted)
        shared = runs["ECMP, one basis everywhere"]
        assert shared["routing_state"]["hash"]["shared"] is True
        assert len(set(shared["routing_state"]["hash"]["bases"].values())) == 1
        # a flow that won bucket j at its leaf wins bucket j again at the spine: each of the four
        # spines sends all of its cross-zone traffic up one of its two uplinks, as the model says
        # (lab / model 0.981-1.014 over 4 draws)
        assert ecmp_tiers.idle_uplinks(shared) == {"leaf": 0, "spine": 4}, (k, ecmp_tiers.tier_loads(shared))
        for tier, value in ecmp_tiers.measured(shared).items():
            predicted = shared["tags"]["model"][tier]
            assert figure(f"ECMP, one basis everywhere {tier} max/mean lab / model, draw {k}",
                          value / predicted) == pytest.approx(1, abs=0.15), (k, tier, value, predicted)
        assert "random 5-95%" in ecmp_tiers.table(doc)
