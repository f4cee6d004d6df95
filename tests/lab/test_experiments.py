"""The packaged queue experiments, quick versions, on real fabrics: each must show its effect.

pfc-incast and ecn-dcqcn are the folders `reproduce --quick` wrote (the quick_catalogue fixture),
victim-noise runs here.

pfc-incast: streaming 16:1 incast pauses the spines, receiver-driven admission pauses nothing.
victim-noise: spreading pauses cut the victim's bus bandwidth; CTS on the noise restores it.
ecn-dcqcn: CNPs only with DCQCN; tight thresholds with DCQCN trade pauses for completion time.
"""

import pytest

from fabriclab.results import document
from fabriclab.workflows.experiments import Options, ecn_dcqcn, incast, run_experiment, victim

pytestmark = pytest.mark.lab


def hops(run):
    return run["queues"]["hops"]


def pauses(run):
    return sum(h["pauses"] for h in hops(run).values())


def totals(run):
    return run["queues"]["report"]["totals"]


def size(run, job):
    return run["jobs"][job]["sizes"][0]


def by_name(doc):
    return {r["label"]: r for r in doc["runs"]}


def check_folder(doc, folder, summary_png):
    on_disk = document.load(folder)                     # of the one schema
    assert on_disk["kind"] == "experiment" and on_disk["experiment"] == doc["experiment"]
    scale = on_disk["scale"]
    assert scale["host_rate_mbps"] > 0 and scale["time_scale"] and scale["buffers_bytes"]
    assert on_disk["mechanisms"]["queue_model"]["mechanism"] == "ebpf-clsact+tbf-gates"
    assert (folder / summary_png).stat().st_size > 10_000
    assert "## Experiment" in (folder / "report.md").read_text()
    for run in doc["runs"]:
        assert (folder / run["files"]["queues_plot"]).stat().st_size > 10_000
        header = (folder / run["files"]["queues_csv"]).read_text().splitlines()[0]
        assert header.startswith("t_s,port,node,peer,role,class,occ")
        timing = run["queues"]["sampling"]
        assert timing["samples"] > 20 and timing["reached_median_s"] < 2 * timing["interval_s"]
        # Nothing OVS dropped on receive (it would leave bytes held in a switch).
        assert totals(run)["ovs_receive_drops"] == 0


def test_pfc_incast(quick_catalogue):
    doc = quick_catalogue.doc("pfc-incast")            # run once, by reproduce --quick
    check_folder(doc, quick_catalogue.folder_of("pfc-incast"), "incast.png")
    cases = by_name(doc)
    streaming, admitted, slow = (cases["streaming"], cases["receiver-driven"],
                                 cases["receiver-driven, slow receiver"])
    # Streaming: the receiver's leaf pauses the spines, and PFC keeps every packet.
    assert hops(streaming)["leaf->spine"]["pauses"] > 0
    assert totals(streaming).get("lossless_drops", 0) == 0
    # Receiver-driven admission: the same bytes, no pause anywhere, also with a slow receiver,
    # whose queue sits at its own leaf (the degraded port is a condition of that run, undone after).
    assert pauses(admitted) == 0 and pauses(slow) == 0
    assert hops(slow)["leaf->NIC"]["occ_max"] > 0
    assert [c["kind"] for c in slow["conditions"]] == ["degrade"] and not streaming["conditions"]
    assert size(slow, "incast")["cct_ms"]["p50"] > 2 * size(admitted, "incast")["cct_ms"]["p50"]
    text = incast.table(doc)
    assert "receiver-driven, slow receiver" in text and "seed 000 Table 3" in text


def test_victim_noise(tmp_path):
    doc = run_experiment("victim-noise", out=tmp_path, options=Options(quick=True))
    check_folder(doc, tmp_path, "victim_noise.png")
    cases = by_name(doc)
    alone = size(cases["victim alone"], "victim")["busbw_mbps"]
    spreading = cases["noise, PFC (spreading)"]
    cts = size(cases["noise with CTS"], "victim")["busbw_mbps"]
    lossy = cases["noise in lossy class"]
    assert pauses(spreading) > 0
    assert size(spreading, "victim")["busbw_mbps"] < 0.6 * alone
    # CTS gives most of it back. Held to fractions of alone, not to 2x the spreading case: the
    # quick version's spreading is shallower than the full one's (CI: 44 % of alone, CTS 85 %,
    # a 1.93x ratio; the full run: 20 % and 86 %).
    assert cts > 0.75 * alone and cts > 1.5 * size(spreading, "victim")["busbw_mbps"], (alone, cts)
    assert spreading["jobs"]["noise"]["role"] == "noise"
    # lossless means lossless: whatever spreads, the PFC class drops nothing
    assert all(totals(run).get("lossless_drops", 0) == 0 for run in cases.values())
    assert not [r for run in cases.values() for r in run["invalid"] if "lossless drop" in r]
    # In the lossy class the noise is dropped at the receiver's leaf, not paused, and retransmits.
    assert totals(lossy)["drops"] > 0 and size(lossy, "noise")["counters"]["retransmitted_packets"] > 0
    assert "% of alone" in victim.table(doc)


def test_ecn_dcqcn(quick_catalogue):
    doc = quick_catalogue.doc("ecn-dcqcn")
    check_folder(doc, quick_catalogue.folder_of("ecn-dcqcn"), "ecn_dcqcn.png")
    cases = by_name(doc)
    for name, run in cases.items():
        cnps = size(run, "allreduce")["counters"]["cnp_sent"]
        assert (cnps > 0) == name.startswith("DCQCN"), name
        assert totals(run)["marks"] > 0, name
        assert run["ecn"]["leaf"]["mode"] == "red"
    pfc_tight, dcqcn_tight = cases["PFC only, tight ECN"], cases["DCQCN, tight ECN"]
    assert pauses(dcqcn_tight) < pauses(pfc_tight)
    # DCQCN's rate cuts cost completion time (quick: about 10%). Without DCQCN the thresholds
    # change only the marks, so both PFC-only runs measure one thing: the faster of the two is
    # the reference, because one of them now and then waits out a local ACK timeout (a packet
    # held behind pauses longer than the lab's timeout), which costs it seconds.
    cct = {name: size(run, "allreduce")["cct_ms"]["mean"] for name, run in cases.items()}
    assert cct["DCQCN, tight ECN"] > min(cct["PFC only, relaxed ECN"], cct["PFC only, tight ECN"]), cct
    # The thresholds changed on the running switches are back to the spec's afterwards.
    assert "DCQCN, tight ECN" in ecn_dcqcn.table(doc)
