"""The flow model's outputs may not drift: every scheme's CCT, per-flow rates and per-link loads
on the fabrics of flowmodel_cases.py must match what the per-flow implementation gave
(data/flowmodel_golden.json), to 1e-9 relative. This is what proves a faster rewrite of routes,
placement or rates equivalent."""

import json
import pathlib

import pytest

from tests.unit.flowmodel_cases import cases, outputs

GOLDEN = json.loads((pathlib.Path(__file__).parent / "data" / "flowmodel_golden.json").read_text())
CASES = {name: (g, c, down, hs) for name, g, c, down, hs in cases()}


def close(a, b):
    return a == b or (a is not None and b is not None and abs(a - b) <= 1e-9 * max(abs(a), abs(b)) + 1e-12)


def test_every_case_is_recorded():
    assert sorted(CASES) == sorted(GOLDEN)


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_outputs_match_the_recorded_ones(name):
    graph, collective, down, hash_seed = CASES[name]
    want = GOLDEN[name]
    assert sorted(down) == want["down"] and hash_seed == want["hash_seed"]
    got = outputs(graph, collective, down, hash_seed, tuple(want["schemes"]))
    for scheme, expect in want["schemes"].items():
        mine = got[scheme]
        where = f"{name} {scheme}"
        assert close(mine["cct_s"], expect["cct_s"]), (where, mine["cct_s"], expect["cct_s"])
        assert (mine["unroutable"], mine["unsatisfied"]) == (expect["unroutable"], expect["unsatisfied"]), where
        assert len(mine["rates"]) == len(expect["rates"]), where
        bad = [i for i, (a, b) in enumerate(zip(mine["rates"], expect["rates"])) if not close(a, b)]
        assert not bad, (where, "rates differ at flows", bad[:5])
        assert set(mine["loads"]) == set(expect["loads"]), where
        bad = [e for e, v in expect["loads"].items() if not close(mine["loads"][e], v)]
        assert not bad, (where, "loads differ on links", bad[:5])
