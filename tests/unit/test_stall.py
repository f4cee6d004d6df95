"""The stall report follows a stuck collective's chain of waits to the rank that holds it up."""

from fabriclab.traffic.stall import MAX_HOPS, explain_stall


def name(rank):
    return f"rank {rank}"


def waits(peer, nbytes=65536):
    return {"waiting_for": [{"tag": 3, "from": peer, "bytes": nbytes}], "sending": []}


def test_the_chain_ends_at_the_sender_that_still_holds_the_bytes():
    statuses = {0: waits(15), 15: waits(14), 14: {"waiting_for": [], "held_ports": [1], "sending": [
        {"peer": 15, "queued_bytes": 0, "unacked_packets": 16, "retries": 2,
         "retransmitted_packets": 32, "cc": "dcqcn", "cc_rate_mbps": 0.0125, "held_lanes": 0}]}}
    text = explain_stall(0, statuses, name)
    assert text == ("rank 0 waits for 65536 bytes from rank 15; rank 15 waits for 65536 bytes from rank 14; "
                    "rank 14 still has 0 bytes queued, 16 packets unacknowledged, 2 timeouts in a row, "
                    "32 packets resent, DCQCN rate 0.0125 Mbit/s (port 1 holding ACKs: its queue is full, paused)")


def test_a_sender_with_nothing_left_to_send_means_the_bytes_were_lost():
    statuses = {0: waits(1), 1: {"waiting_for": [], "sending": []}}
    assert explain_stall(0, statuses, name).endswith("rank 1 waits for nobody: the bytes were lost or never sent")


def test_a_sender_busy_with_another_peer_is_named_with_what_it_sends():
    statuses = {0: waits(1), 1: {"waiting_for": [], "sending": [
        {"peer": 2, "queued_bytes": 4096, "unacked_packets": 1}]}, 2: {"waiting_for": [], "sending": []}}
    assert explain_stall(0, statuses, name).endswith(
        "rank 1 waits for nobody and still sends: to rank 2 4096 bytes queued, 1 packets unacknowledged")


def test_a_cycle_of_waits_is_called_one():
    statuses = {0: waits(1), 1: waits(2), 2: waits(0)}
    assert explain_stall(0, statuses, name).endswith("a cycle: each of them waits for the next")


def test_a_long_chain_is_cut_short():
    n = MAX_HOPS + 5
    statuses = {r: waits((r + 1) % n) for r in range(n)}
    text = explain_stall(0, statuses, name)
    assert text.endswith("; ...") and text.count("waits for") == MAX_HOPS


def test_ranks_that_did_not_answer():
    assert explain_stall(0, {}, name) == "rank 0 did not answer"
    assert explain_stall(0, {0: waits(7)}, name).endswith("rank 7 did not answer")


def test_a_rank_waiting_for_nobody_reports_its_unacknowledged_sends():
    assert explain_stall(0, {0: {"waiting_for": [], "unacked_sends": 3}}, name) == "3 sends not acknowledged"


def test_a_sender_whose_acks_stopped_names_the_peer_that_did_not_answer():
    # CI, 2026-12-02: rank 1 frozen while rank 0 still had packets out to it, none acknowledged
    sending = {"waiting_for": [], "sending": [{"peer": 1, "queued_bytes": 0, "unacked_packets": 16,
                                               "retries": 5, "retransmitted_packets": 80}]}
    assert explain_stall(0, {0: sending}, name) == (
        "still sends: to rank 1 0 bytes queued, 16 packets unacknowledged, 5 timeouts in a row, "
        "80 packets resent; rank 1 did not answer")
    assert explain_stall(0, {0: waits(2), 2: sending}, name).endswith(
        "rank 2 waits for nobody and still sends: to rank 1 0 bytes queued, 16 packets unacknowledged, "
        "5 timeouts in a row, 80 packets resent; rank 1 did not answer")
    # a peer that answered is not named as silent
    assert explain_stall(0, {0: sending, 1: waits(0)}, name).endswith("80 packets resent")
