"""The analytical collective model: formulas against hand-computed values, profiles, the CLI."""

import json
import math

import pytest

from fabriclab.cli.main import main
from fabriclab.errors import LabError
from fabriclab.model import collectives as c
from fabriclab.model.hardware import Hop, Profile, load_profile, parse_bandwidth, shipped_profiles
from fabriclab.cli.model import predict
from fabriclab.units import parse_sizes

US = 1e-6


def test_ring_allreduce_by_hand():
    cost = c.ring_allreduce(8e6, 8, 1 * US, 1e9)        # 8 MB, 8 ranks, 1 us, 1 GB/s
    assert cost.terms["latency"] == pytest.approx(14 * US)            # 2 (p-1) alpha
    assert cost.terms["bandwidth"] == pytest.approx(2 * 7 / 8 * 8e-3)  # 2 (p-1)/p M/B
    assert cost.time == pytest.approx(0.014 + 14 * US)
    assert cost.dominant == "bandwidth"


def test_ring_and_fully_connected_share_the_bandwidth_term_seed001():
    ring, fc = c.ring_allreduce(1e9, 8, 5 * US, 1e10), c.fc_allreduce(1e9, 8, 5 * US, 1e10)
    assert ring.terms["bandwidth"] == pytest.approx(fc.terms["bandwidth"])
    assert fc.terms["latency"] == pytest.approx(2 * 5 * US)
    # Small messages: latency dominates and FC wins by about (p-1).
    small_ratio = c.ring_allreduce(1e3, 8, 5 * US, 1e10).time / c.fc_allreduce(1e3, 8, 5 * US, 1e10).time
    assert small_ratio > 6


def test_gamma_and_the_alltoall_advantage_of_fc_seed001():
    assert c.ring_hops_gamma(8) == 16            # 2(1+2+3) + 1 x 8/2
    assert c.ring_hops_gamma(5) == 6             # 2(1+2), no remainder
    big = 1e12
    ratio = c.ring_topology_alltoall(big, 8, 0, 1e9).time / c.fc_alltoall(big, 8, 0, 1e9).time
    assert ratio == pytest.approx(16 / 7)        # the paper's "~2.3 in the 8-node example"


def test_reducescatter_and_allgather_are_each_half_a_ring_allreduce():
    args = (1e8, 16, 2 * US, 5e9)
    half = c.ring_reducescatter(*args).time + c.ring_allgather(*args).time
    assert half == pytest.approx(c.ring_allreduce(*args).time)


def test_tree_latency_grows_with_log2():
    assert c.tree_allreduce(0, 64, 1 * US, 1e9).terms["latency"] == pytest.approx(12 * US)
    assert c.tree_allreduce(0, 65, 1 * US, 1e9).terms["latency"] == pytest.approx(14 * US)
    assert c.ring_allreduce(0, 64, 1 * US, 1e9).terms["latency"] == pytest.approx(126 * US)


def test_in_network_aggregation_halves_ring_traffic_seed003():
    n, size = 32, 1e9
    assert c.bytes_per_worker("in-network", size, n) == 2 * size
    assert c.bytes_per_worker("ring", size, n) == pytest.approx(4 * size * 31 / 32)
    ina, ring = c.ina_allreduce(size, n, 0, 1e10), c.ring_allreduce(size, n, 0, 1e10)
    assert ring.time / ina.time == pytest.approx(2 * 31 / 32)


def test_nccl_tests_bus_bandwidth():
    cost = c.ring_allreduce(1e12, 8, 0, 1e10)     # huge message: busbw reaches link bandwidth
    assert cost.algbw == pytest.approx(1e10 * 8 / 14)
    assert cost.busbw == pytest.approx(1e10)
    assert c.bus_factor("allgather", 4) == 0.75 and c.bus_factor("broadcast", 4) == 1.0


def test_alltoallv_is_set_by_the_busiest_rank():
    sizes = [[0, 1, 1], [1, 0, 1], [9, 1, 0]]          # rank 2 sends 10, rank 0 receives 10
    cost = c.pairwise_alltoallv(sizes, 0, 1.0)
    assert cost.terms["bandwidth"] == 10
    with pytest.raises(ValueError):
        c.pairwise_alltoallv([[0, 1]], 0, 1.0)


def test_hierarchical_allreduce_terms_and_the_slowest_tier():
    up, out = c.Tier(1 * US, 100e9), c.Tier(5 * US, 10e9)
    cost = c.hierarchical_allreduce(8e9, 8, 4, up, out)
    assert set(cost.terms) == {"scale-up reduce-scatter", "scale-out all-reduce", "scale-up all-gather"}
    rs = 7 * US + 7 / 8 * 8e9 / 100e9
    ar = 6 * 5 * US + 2 * 3 / 4 * 1e9 / 10e9              # each GPU's shard is size/8
    assert cost.terms["scale-up reduce-scatter"] == pytest.approx(rs)
    assert cost.terms["scale-out all-reduce"] == pytest.approx(ar)
    assert cost.dominant == "scale-out all-reduce"
    single = c.hierarchical_allreduce(8e9, 8, 1, up, out)
    assert "scale-out all-reduce" not in single.terms
    with pytest.raises(ValueError):
        c.hierarchical_allreduce(1, 1, 1, up, out)


@pytest.mark.parametrize("args", [(1, 1, 0, 1), (1, 4, -1, 1), (1, 4, 0, 0), (-1, 4, 0, 1)])
def test_bad_parameters_are_refused(args):
    with pytest.raises(ValueError):
        c.ring_allreduce(*args)


def test_bandwidth_units():
    assert parse_bandwidth("400Gbit", "x") == 50e9
    assert parse_bandwidth("450GB/s", "x") == 450e9
    for bad in ("10Gbps", "5Gb/s", "0GB/s", "fast", 40):
        with pytest.raises(LabError):
            parse_bandwidth(bad, "x")


def test_datapath_chain_takes_the_slowest_hop_and_staging_copies():
    nic = Hop("nic", 50e9, 0.8)                          # 40 GB/s achievable, one per rank
    pcie = Hop("pcie", 32e9, 1.0)
    prof = Profile("p", "", 8, Hop("nvl", 300e9, 1.0), 1e-6, 8, nic, 5e-6, (pcie,))
    assert prof.scale_out_bandwidth() == pytest.approx(32e9) and prof.bottleneck() == "pcie"
    staged = Profile("p", "", 8, Hop("nvl", 300e9, 1.0), 1e-6, 8, nic, 5e-6, (pcie,), staging_copies=1)
    assert staged.scale_out_bandwidth() == pytest.approx(1 / (1 / 32e9 + 1 / 32e9))
    shared = Profile("p", "", 8, Hop("nvl", 300e9, 1.0), 1e-6, 2, nic, 5e-6, ())
    assert shared.scale_out_bandwidth() == pytest.approx(40e9 * 2 / 8)   # 2 NICs for 8 ranks


def test_whole_buffer_staging_is_a_fixed_term_per_phase_whatever_the_node_count(tmp_path, capsys):
    from fabriclab.cli.model import predict

    nic = Hop("nic", 50e9, 0.8)
    pcie = Hop("pcie", 32e9, 1.0)
    staged = Profile("p", "", 8, Hop("nvl", 300e9, 1.0), 1e-6, 8, nic, 5e-6, (pcie,), staging_copies=2,
                     staging_mode="whole-buffer")
    assert staged.scale_out_bandwidth() == pytest.approx(32e9)          # the copies do not lower it
    assert staged.scale_out_bandwidth("per-byte") == pytest.approx(1 / (1 / 32e9 + 2 / 32e9))
    size = 1 << 30
    # AllReduce: 2 phases x 2 copies x (to host and back) x the buffer over PCIe
    assert staged.staging_seconds(size, 2) == pytest.approx(2 * 2 * 2 * size / 32e9)
    assert staged.staging_seconds(size, 2, "per-byte") == 0.0
    terms = {n: predict(staged, "allreduce", "ring", n, size).terms for n in (2, 64)}
    assert terms[2]["host staging (whole buffer)"] == terms[64]["host staging (whole buffer)"]
    assert "host staging (whole buffer)" not in predict(staged, "allreduce", "ring", 1, size).terms
    assert predict(staged, "allgather", "ring", 4, size).terms["host staging (whole buffer)"] == \
        pytest.approx(2 * 2 * size / 32e9)                              # one phase
    per_byte = predict(staged, "allreduce", "ring", 2, size, "per-byte")
    assert "host staging (whole buffer)" not in per_byte.terms and per_byte.time > 0

    path = tmp_path / "staged.yaml"
    path.write_text("name: staged\nranks_per_node: 8\nscale_up: {name: nvl, bandwidth: 300GB/s, latency_us: 1}\n"
                    "scale_out: {name: nic, bandwidth: 400Gbit, efficiency: 0.8, nics_per_node: 8, latency_us: 5}\n"
                    "datapath: [{name: pcie, bandwidth: 32GB/s}]\nstaging_copies: 1\n")
    assert load_profile(str(path)).staging_mode == "per-byte"
    assert main(["model", "collective", "--profile", str(path), "--nodes", "4", "--sizes", "1G", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    row = doc["rows"][0]
    assert doc["staging_modes"] == ["per-byte", "whole-buffer"] and set(row["by_staging"]) == set(doc["staging_modes"])
    assert row["time_us"] == row["by_staging"]["per-byte"]["time_us"]          # flat fields: the profile's mode
    assert main(["model", "collective", "--profile", str(path), "--nodes", "4", "--sizes", "1G"]) == 0
    assert "time us (whole-buffer)" in capsys.readouterr().out
    path.write_text(path.read_text() + "staging_mode: sometimes\n")
    with pytest.raises(LabError, match="staging_mode must be per-byte or whole-buffer, got 'sometimes'"):
        load_profile(str(path))


def test_shipped_profiles_load():
    assert {"h100_8x400g", "a100_8x200g", "intel_max_6gpu"} <= set(shipped_profiles())
    h100 = load_profile("h100_8x400g")
    assert h100.scale_out_bandwidth() == pytest.approx(40e9)      # 400G x 80%
    intel = load_profile("intel_max_6gpu")
    assert intel.ranks_per_node == 12 and intel.scale_up.bandwidth == 15e9


def test_a_bad_profile_is_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nranks_per_node: 0\nscale_up: {}\nscale_out: {}\n")
    with pytest.raises(LabError, match=r"ranks_per_node must be in \[1, 1024\], got 0"):
        load_profile(str(bad))
    with pytest.raises(LabError, match="no hardware profile 'nope'"):
        load_profile("nope")


def test_predict_uses_the_scale_out_tier_across_nodes():
    h100 = load_profile("h100_8x400g")
    one = predict(h100, "allreduce", "ring", 1, 2**30)
    four = predict(h100, "allreduce", "ring", 4, 2**30)
    assert one.busbw > 8 * four.busbw / 2                 # NVLink is ~9x the NIC
    assert four.busbw == pytest.approx(40e9, rel=0.02)
    with pytest.raises(LabError, match="no model for alltoall/tree"):
        predict(h100, "alltoall", "tree", 2, 1024)


def test_sizes_and_the_command(capsys):
    assert parse_sizes("1K,64K,1M,1G") == [1024, 65536, 2**20, 2**30]
    with pytest.raises(LabError):
        parse_sizes("1K,lots")
    assert main(["model", "collective", "--nodes", "2", "--sizes", "1M,1G", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "model" and doc["ranks"] == 16 and len(doc["rows"]) == 2
    assert doc["rows"][1]["dominant"] == "bandwidth"
    assert math.isclose(doc["profile"]["scale_out_bandwidth_Bps"], 40e9)
    assert main(["model", "collective", "--algorithm", "hierarchical", "--sizes", "1G"]) == 0
    assert "scale-out all-reduce" in capsys.readouterr().out
    assert main(["model", "profiles"]) == 0
    assert main(["model", "collective", "--profile", "nope"]) == 2
