"""The packaged experiments' plans: hosts, cases and settings, checked without a fabric."""

import dataclasses

import pytest

from fabriclab.errors import LabError
from fabriclab.workflows.experiments import EXPERIMENTS, Options, ecn_dcqcn, incast, module, victim
from fabriclab.workflows.experiments.runner import case_slug
from fabriclab.queues.config import queues_from_dict
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import load_spec
from fabriclab.traffic.collective import place_ranks


def fabric(name):
    return Fabric(load_spec(name))


def test_unknown_experiment_names_the_known_ones():
    with pytest.raises(LabError, match="unknown experiment 'nope': choose one of pfc-incast"):
        module("nope")


@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_every_case_plans_on_the_default_spec(name):
    mod = module(name)
    for quick in (True, False):
        spec = mod.prepare(load_spec(mod.DEFAULT_SPEC), Options(quick=quick))
        fab = Fabric(spec)
        cases = mod.cases(fab, Options(quick=quick))
        assert len({c.name for c in cases}) == len(cases) >= 3
        assert len({case_slug(c.name) for c in cases}) == len(cases)
        for case in cases:
            assert [j for j in case.jobs if not j.noise], case.name
            for job in case.jobs:
                job.spec.check()
                place_ranks(fab, job.spec)


def test_incast_is_sixteen_to_one_across_leaves():
    fab = fabric("incast")
    receiver, senders = incast.pick_hosts(fab)
    assert receiver == "h1" and len(senders) == 16
    assert all(fab.hosts[h].ports[0].leaf != "l1" for h in senders)
    streaming, admitted, slow = incast.cases(fab, Options())
    assert not streaming.jobs[0].spec.cts and admitted.jobs[0].spec.cts
    # Receiver-driven: 16 senders x one 8 KiB buffer in flight, below a leaf ingress port's XOFF
    # even if it all came in by one spine.
    assert admitted.jobs[0].spec.cts_buffers * admitted.jobs[0].spec.chunk_bytes * 16 <= 128 * 1024
    assert slow.degrade == ("l1", "h1", fab.spec.host_rate_mbps / 4)


def test_incast_needs_sixteen_senders_and_pfc():
    with pytest.raises(LabError, match="needs 16 senders outside the receiver's leaf; fabric 'tiny' has 1"):
        incast.pick_hosts(fabric("tiny"))
    with pytest.raises(LabError, match="needs a spec with a queues: section; 'tiny' has none"):
        incast.prepare(load_spec("tiny"), Options())
    spec = load_spec("incast")
    no_pfc = dataclasses.replace(spec, queues=dataclasses.replace(
        spec.queues, pfc=dataclasses.replace(spec.queues.pfc, enabled=False)))
    with pytest.raises(LabError, match="turns PFC off"):
        incast.prepare(no_pfc, Options())


def test_ecn_profiles_follow_each_roles_buffer():
    spec = ecn_dcqcn.prepare(load_spec("oversubscribed"), Options())
    assert spec.queues is not None and spec.queues.pfc.enabled
    assert spec.queues.pfc.watchdog_ms == 0          # added by the experiment: see prepare
    fab = Fabric(spec)
    tight, relaxed = ecn_dcqcn.thresholds(fab, "tight"), ecn_dcqcn.thresholds(fab, "relaxed")
    assert tight["leaf"] == {"mode": "red", "kmin": 4096, "kmax": 16384, "pmax": 0.2}
    assert relaxed["spine"]["kmin"] == 128 * 1024 and relaxed["spine"]["kmax"] == 256 * 1024
    cases = ecn_dcqcn.cases(fab, Options())
    assert [c.jobs[0].spec.dcqcn is not None for c in cases] == [False, False, True, True]
    assert [c.ecn == tight for c in cases] == [False, True, False, True]


def test_victim_shares_no_host_with_the_noise():
    fab = fabric("incast")
    victims, receiver, senders = victim.pick_hosts(fab)
    assert victims == ["h2", "h6", "h10", "h14", "h18"] and receiver == "h1"
    assert len(senders) == 12 and not set(senders) & {*victims, receiver}
    assert all(fab.hosts[h].ports[0].leaf != "l1" for h in senders)
    alone, spreading, cts, lossy = victim.cases(fab, Options())
    assert [j.name for j in alone.jobs] == ["victim"]
    assert [j.noise for j in spreading.jobs] == [False, True]
    assert cts.jobs[1].spec.cts and lossy.jobs[1].spec.dscp == 0


def test_yaml_off_is_the_off_mode():
    # YAML 1.1 reads a bare `off` as false.
    assert queues_from_dict({"ecn": {"mode": False}}).ecn.mode == "off"


def test_cli_lists_and_refuses_bad_input_in_one_line(capsys, tmp_path):
    from fabriclab.cli.main import main

    assert main(["experiment", "list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in EXPERIMENTS) and "seed 000 Table 3" in out
    # Refused before anything is built: no results folder appears.
    assert main(["experiment", "pfc-incast", "--spec", "tiny", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fabriclab: error: pfc-incast needs a spec with a queues: section")
    assert len(err.splitlines()) == 1 and not (tmp_path / "r").exists()
    assert main(["experiment", "victim-noise", "--sample-ms", "0.1"]) == 2
    assert "--sample-ms must be >= 1 ms" in capsys.readouterr().err
    assert main(["experiment", "ecn-dcqcn", "--routing", "nope"]) == 2
    assert "nope" in capsys.readouterr().err
