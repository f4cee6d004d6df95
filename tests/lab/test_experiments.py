"""The packaged queue experiments, quick versions, on real fabrics: each must show its effect.

pfc-incast: streaming 16:1 incast pauses the spines, receiver-driven admission pauses nothing.
victim-noise: spreading pauses cut the victim's bus bandwidth; CTS on the noise restores it.
ecn-dcqcn: CNPs only with DCQCN; tight thresholds with DCQCN trade pauses for completion time.
"""

import json

import pytest

from fabriclab.workflows.experiments import Options, ecn_dcqcn, incast, run_experiment, victim

pytestmark = pytest.mark.lab


def pauses(case):
    return sum(h["pauses"] for h in case["hops"].values())


def by_name(doc):
    return {c["case"]: c for c in doc["cases"]}


def check_folder(doc, folder, summary_png):
    on_disk = json.loads((folder / "results.json").read_text())
    assert on_disk["experiment"] == doc["experiment"]
    scale = on_disk["scale"]
    assert scale["host_rate_mbps"] > 0 and scale["time_scale"] and scale["buffers_bytes"]
    assert on_disk["mechanisms"]["queue_model"]["mechanism"] == "ebpf-clsact+tbf-gates"
    assert (folder / summary_png).stat().st_size > 10_000
    for case in doc["cases"]:
        assert (folder / case["files"]["plot"]).stat().st_size > 10_000
        header = (folder / case["files"]["csv"]).read_text().splitlines()[0]
        assert header.startswith("t_s,port,node,peer,role,class,occ")
        timing = case["sampling"]
        assert timing["samples"] > 20 and timing["reached_median_s"] < 2 * timing["interval_s"]
        # Nothing OVS dropped on receive (it would leave bytes held in a switch).
        assert case["queues"]["totals"]["ovs_receive_drops"] == 0


def test_pfc_incast(tmp_path):
    doc = run_experiment("pfc-incast", out=tmp_path, options=Options(quick=True))
    check_folder(doc, tmp_path, "incast.png")
    cases = by_name(doc)
    streaming, admitted, slow = (cases["streaming"], cases["receiver-driven"],
                                 cases["receiver-driven, slow receiver"])
    # Streaming: the receiver's leaf pauses the spines, and PFC keeps every packet.
    assert streaming["hops"]["leaf->spine"]["pauses"] > 0
    assert streaming["queues"]["totals"].get("lossless_drops", 0) == 0
    # Receiver-driven admission: the same bytes, no pause anywhere, also with a slow receiver,
    # whose queue sits at its own leaf.
    assert pauses(admitted) == 0 and pauses(slow) == 0
    assert slow["hops"]["leaf->NIC"]["occ_max"] > 0
    assert slow["jobs"]["incast"]["cct_ms"]["p50"] > 2 * admitted["jobs"]["incast"]["cct_ms"]["p50"]
    text = incast.table(doc)
    assert "receiver-driven, slow receiver" in text and "seed 000 Table 3" in text


def test_victim_noise(tmp_path):
    doc = run_experiment("victim-noise", out=tmp_path, options=Options(quick=True))
    check_folder(doc, tmp_path, "victim_noise.png")
    cases = by_name(doc)
    alone = cases["victim alone"]["jobs"]["victim"]["busbw_mbps"]
    spreading = cases["noise, PFC (spreading)"]
    cts = cases["noise with CTS"]["jobs"]["victim"]["busbw_mbps"]
    lossy = cases["noise in lossy class"]
    assert pauses(spreading) > 0
    assert spreading["jobs"]["victim"]["busbw_mbps"] < 0.6 * alone
    assert cts > 2 * spreading["jobs"]["victim"]["busbw_mbps"]
    # In the lossy class the noise is dropped at the receiver's leaf, not paused, and retransmits.
    assert lossy["queues"]["totals"]["drops"] > 0 and lossy["jobs"]["noise"]["counters"]["retransmitted_packets"] > 0
    assert "% of alone" in victim.table(doc)


def test_ecn_dcqcn(tmp_path):
    doc = run_experiment("ecn-dcqcn", out=tmp_path, options=Options(quick=True))
    check_folder(doc, tmp_path, "ecn_dcqcn.png")
    cases = by_name(doc)
    for name, case in cases.items():
        cnps = case["jobs"]["allreduce"]["counters"]["cnp_sent"]
        assert (cnps > 0) == name.startswith("DCQCN"), name
        assert case["queues"]["totals"]["marks"] > 0, name
    pfc_tight, dcqcn_tight = cases["PFC only, tight ECN"], cases["DCQCN, tight ECN"]
    assert pauses(dcqcn_tight) < pauses(pfc_tight)
    assert dcqcn_tight["jobs"]["allreduce"]["cct_ms"]["mean"] > pfc_tight["jobs"]["allreduce"]["cct_ms"]["mean"]
    # The thresholds changed on the running switches are back to the spec's afterwards.
    assert "DCQCN, tight ECN" in ecn_dcqcn.table(doc)
