"""Fabric specs: validation messages, rate and size parsing, derived figures, the shipped specs.

Every rejected spec must give one line that names the spec (or file) and the field, so a person can
fix it without reading code. Nothing here builds a network.
"""

import math
import re

import pytest

from fabriclab.errors import LabError, SpecError
from fabriclab.loading import excerpt
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import (
    MAX_PORTS_PER_LEAF,
    SPEC_DIR,
    Buffers,
    FabricSpec,
    LinkDelay,
    load_spec,
    parse_rate_mbps,
    parse_size_bytes,
    shipped_specs,
    spec_from_dict,
)

SHIPPED = ["ar_fabric", "default", "ecmp_tiers", "incast", "incident_planes", "meta_ai_zone", "meta_dc", "multiplane_pfc", "oversubscribed", "parallel_links", "rail_optimized", "routing", "spectrumx_fig16", "switchml", "tiny"]

# The whole fabric shares ~650 Mbit/s of userspace OVS; specs that run traffic stay well below.
MAX_OFFERED_MBPS = 200


def rejected(data, source="spec"):
    """The one-line message spec_from_dict gives for `data`."""
    with pytest.raises(SpecError) as info:
        spec_from_dict(data, source=source)
    message = str(info.value)
    assert "\n" not in message
    return message


def rejected_spec(**fields):
    """The one-line message FabricSpec gives for these fields."""
    with pytest.raises(SpecError) as info:
        FabricSpec(**{"name": "bad", **fields})
    message = str(info.value)
    assert "\n" not in message
    return message


def write(tmp_path, text, name="spec.yaml", mode="w"):
    path = tmp_path / name
    if mode == "wb":
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


# -- one rule, one clear line ------------------------------------------------------------------------

def test_spec_error_is_a_lab_error():
    assert issubclass(SpecError, LabError)


def test_unknown_key_names_the_key_the_source_and_the_known_keys():
    message = rejected({"name": "x", "spine": 2}, source="my.yaml")
    assert message.startswith("my.yaml: unknown key 'spine'")
    assert "spines" in message and "hosts_per_leaf" in message


def test_missing_name():
    assert rejected({"leaves": 2}, source="f.yaml") == "f.yaml: missing required key 'name'"


@pytest.mark.parametrize("name", ["", "has space", "-leading-dash", "x" * 65, 42])
def test_bad_name(name):
    message = rejected({"name": name})
    assert "name must be 1-64 letters" in message
    assert excerpt(name) in message and len(message) < 200


def test_unknown_kind_lists_the_kinds():
    message = rejected_spec(kind="fattree")
    assert message == "spec 'bad': kind must be one of leafspine, multiplane, threetier, got 'fattree'"


@pytest.mark.parametrize("fname", ["leaves", "spines", "nics_per_host", "parallel_links"])
def test_zero_count(fname):
    assert rejected_spec(**{fname: 0}) == f"spec 'bad': {fname} must be >= 1, got 0"


def test_zero_spines_from_yaml_names_spec_and_field():
    assert rejected({"name": "lab1", "spines": 0}) == "spec 'lab1': spines must be >= 1, got 0"


def test_hosts_per_leaf_zero_is_rejected():
    # Leaves without hosts would give planes with nothing to carry.
    assert rejected_spec(hosts_per_leaf=0) == "spec 'bad': hosts_per_leaf must be >= 1, got 0"


@pytest.mark.parametrize("fname, too_many, limit", [
    ("leaves", 255, 254), ("spines", 65, 64), ("nics_per_host", 17, 16), ("parallel_links", 17, 16),
])
def test_count_above_its_limit(fname, too_many, limit):
    assert rejected_spec(**{fname: too_many}) == f"spec 'bad': {fname} must be <= {limit}, got {too_many}"


@pytest.mark.parametrize("value", [True, False])
def test_bool_given_for_a_count(value):
    message = rejected({"name": "x", "leaves": value})
    assert message == f"spec 'x': leaves must be a whole number, got {value!r}"


@pytest.mark.parametrize("value", [2.0, "2", None])
def test_non_integer_count(value):
    assert rejected_spec(spines=value) == f"spec 'bad': spines must be a whole number, got {value!r}"


def test_planes_other_than_one_for_leafspine():
    message = rejected_spec(kind="leafspine", planes=2)
    assert message == "spec 'bad': planes must be 1 for kind leafspine (use kind multiplane), got 2"


def test_multiplane_needs_two_planes():
    message = rejected_spec(kind="multiplane", planes=1)
    assert message == "spec 'bad': planes must be >= 2 for kind multiplane, got 1"


def test_multiplane_with_two_planes_is_valid():
    assert FabricSpec(name="mp", kind="multiplane", planes=2).planes == 2


def test_unknown_cabling_lists_the_cablings():
    message = rejected({"name": "x", "cabling": "tor"})
    assert message == "spec 'x': cabling must be one of rack, rail, got 'tor'"


@pytest.mark.parametrize("fields, expected", [
    (dict(nics_per_host=1, leaves=2), "cabling rail needs nics_per_host >= 2"),
    (dict(nics_per_host=2, leaves=3), "leaves must be a multiple of it, got 3"),
    (dict(nics_per_host=4, leaves=6), "groups leaves by nics_per_host (4)"),
])
def test_rail_cabling_needs_whole_rail_groups(fields, expected):
    assert expected in rejected({"name": "x", "cabling": "rail", **fields})


def test_rail_cabling_counts_one_port_per_host_on_a_leaf():
    spec = FabricSpec(name="x", cabling="rail", leaves=4, spines=2, hosts_per_leaf=5,
                      nics_per_host=2, host_rate_mbps=10, fabric_rate_mbps=10)
    assert (spec.hosts, spec.host_ports_per_leaf, spec.oversubscription) == (10, 5, 2.5)
    # a rack leaf of the same counts takes both NICs of its 5 hosts
    rack = FabricSpec(name="x", leaves=4, spines=2, hosts_per_leaf=5, nics_per_host=2,
                      host_rate_mbps=10, fabric_rate_mbps=10)
    assert (rack.hosts, rack.host_ports_per_leaf, rack.oversubscription) == (20, 10, 5.0)


def test_rail_cabling_fits_253_hosts_per_group_on_a_leaf():
    FabricSpec(name="x", cabling="rail", leaves=2, hosts_per_leaf=253, nics_per_host=2)
    assert "hosts_per_leaf is 254, at most 253" in rejected(
        {"name": "x", "cabling": "rail", "leaves": 2, "hosts_per_leaf": 254, "nics_per_host": 2})


def test_rail_cabling_is_refused_with_other_problems_reported_too():
    message = rejected({"name": "x", "cabling": "rail", "nics_per_host": 2, "leaves": 3, "spines": 0})
    assert message.startswith("2 problems") and "spines" in message and "multiple" in message


def test_too_many_host_ports_per_leaf():
    # 127 hosts x 2 NICs = 254 ports, one more than a leaf's /24 holds (.1 to .253).
    message = rejected_spec(hosts_per_leaf=127, nics_per_host=2)
    assert message == (f"spec 'bad': hosts_per_leaf x nics_per_host is 254, at most "
                       f"{MAX_PORTS_PER_LEAF} host ports fit a leaf's /24")


def test_host_ports_per_leaf_at_the_limit_is_valid():
    assert FabricSpec(name="full", hosts_per_leaf=MAX_PORTS_PER_LEAF).hosts_per_leaf == 253


@pytest.mark.parametrize("key", ["host_rate", "fabric_rate", "real_host_rate"])
@pytest.mark.parametrize("value", [0, -5, "0Mbit", 0.0])
def test_rate_not_above_zero(key, value):
    message = rejected({"name": "x", key: value}, source="r.yaml")
    assert message == f"r.yaml: {key}: rate must be > 0, got {value!r}"


@pytest.mark.parametrize("value", ["fast", "", "20 Tbit", "20Mbit/h", "-5Mbit", "1e3", "20,5Mbit",
                                   "Mbit", None, [20], True])
def test_malformed_rate(value):
    message = rejected({"name": "x", "host_rate": value})
    assert message == (f"spec: host_rate: rate must be a number of Mbit/s or a string like '20Mbit', "
                       f"got {value!r}")


@pytest.mark.parametrize("fname", ["host_rate_mbps", "fabric_rate_mbps"])
@pytest.mark.parametrize("value", [0, -1.5, True, "20Mbit"])
def test_rate_given_directly_must_be_a_positive_number(fname, value):
    assert rejected_spec(**{fname: value}) == f"spec 'bad': {fname} must be > 0, got {value!r}"


@pytest.mark.parametrize("value", [0, -400.0, "400G"])
def test_real_host_rate_given_directly_must_be_positive(value):
    assert rejected_spec(real_host_rate_mbps=value) == f"spec 'bad': real_host_rate must be > 0, got {value!r}"


def test_real_host_rate_given_as_bool_is_rejected():
    rejected_spec(real_host_rate_mbps=True)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_rate_must_be_finite(value):
    rejected({"name": "x", "host_rate": value})


@pytest.mark.parametrize("buffers, expected", [
    ({"host": 0}, "spec: buffers.host: size must be > 0, got 0"),
    ({"leaf": -1}, "spec: buffers.leaf: size must be > 0, got -1"),
    ({"spine": "big"}, "spec: buffers.spine: size must be bytes or a string like '64KiB', got 'big'"),
    ({"spine": 1.5}, "spec: buffers.spine: size must be bytes or a string like '64KiB', got 1.5"),
    ({"host": True}, "spec: buffers.host: size must be bytes or a string like '64KiB', got True"),
    ({"cpu": "1MiB"}, "spec: buffers: unknown role 'cpu' (known: host, leaf, spine, super_spine)"),
    (512, "spec: buffers: must map host/leaf/spine/super_spine to sizes, got 512"),
    (None, "spec: buffers: must map host/leaf/spine/super_spine to sizes, got None"),
])
def test_bad_buffers(buffers, expected):
    assert rejected({"name": "x", "buffers": buffers}) == expected


def test_buffers_given_directly_are_checked():
    assert rejected_spec(buffers=Buffers(leaf=0)) == "spec 'bad': buffers.leaf must be > 0 bytes, got 0"
    assert rejected_spec(buffers={"leaf": 1}) == "spec 'bad': buffers must be a Buffers, got {'leaf': 1}"


def test_partial_buffers_keep_the_defaults_for_other_roles():
    spec = spec_from_dict({"name": "x", "buffers": {"spine": "1MiB"}})
    assert spec.buffers == Buffers(host=64 * 1024, leaf=64 * 1024, spine=2**20)


# -- several problems, one message -------------------------------------------------------------------

def test_every_value_problem_is_reported_in_one_line():
    message = rejected_spec(leaves=0, spines=65, host_rate_mbps=-1, kind="ring")
    assert message.startswith("4 problems: ")
    for part in ("kind must be one of", "leaves must be >= 1", "spines must be <= 64", "host_rate_mbps must be > 0"):
        assert part in message


def test_every_key_problem_is_reported_in_one_line():
    message = rejected({"name": "x", "colour": "red", "host_rate": "fast", "buffers": 3}, source="f.yaml")
    assert message.startswith("3 problems: ")
    assert "f.yaml: unknown key 'colour'" in message
    assert "f.yaml: host_rate: rate must be a number" in message
    assert "f.yaml: buffers: must map" in message


def test_missing_name_is_reported_with_other_key_problems():
    message = rejected({"spines": "two", "fabric_rate": 0})
    assert message.startswith("3 problems: ")
    assert "missing required key 'name'" in message and "fabric_rate: rate must be > 0" in message
    assert "spines must be a whole number" in message


def test_key_problems_and_value_problems_are_reported_together():
    message = rejected({"name": "x", "colour": "red", "spines": 0})
    assert "unknown key 'colour'" in message and "spines must be >= 1" in message


def test_every_bad_buffer_is_reported():
    message = rejected({"name": "x", "buffers": {"host": 0, "leaf": "lots"}})
    assert "buffers.host" in message and "buffers.leaf" in message


def test_host_port_limit_is_checked_only_on_sane_counts():
    # A count that is itself wrong must not also produce a confusing product message.
    message = rejected_spec(hosts_per_leaf=True, nics_per_host=300)
    assert "host ports fit" not in message


# -- rates and sizes -------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, mbps", [
    ("20Mbit", 20.0), ("20mbit", 20.0), ("20 Mbit/s", 20.0), ("20", 20.0),
    ("1.5Gbit", 1500.0), (".5Gbit", 500.0), ("400G", 400_000.0), ("400Gbit", 400_000.0),
    ("500kbit", 0.5), ("2.5m", 2.5), (" 7 ", 7.0), (20, 20.0), (7.5, 7.5), (0.25, 0.25),
])
def test_rate_units_and_decimals(value, mbps):
    assert parse_rate_mbps(value, "r") == pytest.approx(mbps)
    assert isinstance(parse_rate_mbps(value, "r"), float)


@pytest.mark.parametrize("value, size", [
    ("64KiB", 65536), ("64kib", 65536), ("1MB", 10**6), ("1MiB", 2**20), ("1.5MiB", 1572864),
    ("2kb", 2000), ("1GiB", 2**30), ("1gb", 10**9), ("100b", 100), ("4096", 4096), (" 16 KiB ", 16384),
    (4096, 4096), (4096.0, 4096),
])
def test_size_units_and_decimals(value, size):
    assert parse_size_bytes(value, "s") == size
    assert isinstance(parse_size_bytes(value, "s"), int)


@pytest.mark.parametrize("value", ["64K", "64 KB/s", "lots", "", "-1KiB", None, 1.5, [64]])
def test_malformed_size(value):
    with pytest.raises(SpecError, match=r"^where: size must be bytes or a string like '64KiB', got "):
        parse_size_bytes(value, "where")


def test_size_that_rounds_to_zero_bytes_is_rejected():
    with pytest.raises(SpecError, match=r"^where: size must be > 0, got '0.5b'$"):
        parse_size_bytes("0.5b", "where")


def test_rates_in_a_yaml_spec_are_stored_in_mbps():
    spec = spec_from_dict({"name": "x", "host_rate": "1Gbit", "fabric_rate": 40, "real_host_rate": "800G"})
    assert (spec.host_rate_mbps, spec.fabric_rate_mbps, spec.real_host_rate_mbps) == (1000.0, 40.0, 800_000.0)


# -- derived figures ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("fields, ratio", [
    (dict(hosts_per_leaf=2, spines=2), 1.0),
    (dict(hosts_per_leaf=4, spines=2), 2.0),
    (dict(hosts_per_leaf=2, spines=4), 0.5),
    (dict(hosts_per_leaf=2, nics_per_host=2, spines=2), 2.0),
    (dict(hosts_per_leaf=4, spines=2, parallel_links=2), 1.0),
    (dict(hosts_per_leaf=2, spines=2, host_rate_mbps=20, fabric_rate_mbps=10), 2.0),
    # per plane: planes do not add uplinks, each plane is its own fabric
    (dict(kind="multiplane", planes=4, hosts_per_leaf=4, spines=2), 2.0),
])
def test_oversubscription_is_derived_from_counts_and_rates(fields, ratio):
    assert FabricSpec(name="o", **fields).oversubscription == pytest.approx(ratio)


def test_time_scale():
    assert FabricSpec(name="t", host_rate_mbps=20).time_scale is None
    assert FabricSpec(name="t", host_rate_mbps=20, real_host_rate_mbps=400_000).time_scale == 20_000
    spec = spec_from_dict({"name": "t", "host_rate": "4Mbit", "real_host_rate": "200Gbit"})
    assert spec.time_scale == pytest.approx(50_000)


def test_to_dict_carries_the_derived_figures():
    data = FabricSpec(name="d", hosts_per_leaf=3, spines=2, real_host_rate_mbps=100).to_dict()
    assert data["oversubscription"] == 1.5
    assert data["time_scale"] == 10.0
    assert data["buffers"] == {"host": 65536, "leaf": 65536, "spine": 262144}


def test_hosts_counts_every_leaf():
    assert FabricSpec(name="h", leaves=3, hosts_per_leaf=5).hosts == 15


# -- files -----------------------------------------------------------------------------------------------

def test_invalid_yaml_reports_the_file_and_line(tmp_path):
    path = write(tmp_path, "name: x\nleaves: 2\n  spines: 3\n")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    message = str(info.value)
    assert message.startswith(f"{path}: line 3 is not valid YAML: ")
    assert "\n" not in message


def test_unclosed_flow_list_reports_a_line(tmp_path):
    path = write(tmp_path, "name: x\nspines: [1, 2\nleaves: 2\n")
    with pytest.raises(SpecError, match=r": line \d+ is not valid YAML: "):
        load_spec(path)


@pytest.mark.parametrize("text, kind", [("- a\n- b\n", "list"), ("42\n", "int"), ("just words\n", "str")])
def test_yaml_that_is_not_a_mapping(tmp_path, text, kind):
    path = write(tmp_path, text)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert str(info.value) == f"{path}: must be a mapping of keys to values, got {kind}"


def test_empty_file_is_rejected(tmp_path):
    path = write(tmp_path, "# nothing but a comment\n")
    with pytest.raises(SpecError, match=r"must be a mapping of keys to values"):
        load_spec(path)


def test_key_problems_in_a_file_name_the_file(tmp_path):
    path = write(tmp_path, "name: x\nleafs: 3\n")
    with pytest.raises(SpecError, match=rf"^{re.escape(str(path))}: unknown key 'leafs'"):
        load_spec(path)


def test_a_directory_is_not_a_spec(tmp_path):
    with pytest.raises(SpecError, match=r"is not a regular file"):
        load_spec(tmp_path)


def test_a_file_that_is_not_utf8_gives_a_spec_error(tmp_path):
    path = write(tmp_path, b"\xff\xfe\x00name: x\n", mode="wb")
    with pytest.raises(SpecError):
        load_spec(path)


def test_unknown_shipped_name_lists_the_shipped_specs():
    with pytest.raises(SpecError) as info:
        load_spec("no_such_fabric")
    message = str(info.value)
    assert message.startswith("no spec file 'no_such_fabric' and no shipped spec of that name (shipped: ")
    assert ", ".join(SHIPPED) in message


def test_a_path_wins_over_a_shipped_name(tmp_path):
    path = write(tmp_path, "name: mine\nleaves: 3\n", name="tiny.yaml")
    assert load_spec(path).name == "mine"


def test_loading_by_name_and_by_path_agree():
    assert load_spec("tiny") == load_spec(SPEC_DIR / "tiny.yaml")


# -- the shipped specs -------------------------------------------------------------------------------------

def test_the_shipped_specs_are_the_documented_ones():
    assert shipped_specs() == SHIPPED


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_spec_loads_and_is_named_for_its_file(name):
    spec = load_spec(name)
    assert spec.name == name
    assert spec.description
    assert spec.real_host_rate_mbps, "every shipped spec states the hardware rate it stands for"


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_spec_stays_within_the_lab_budget(name):
    spec = load_spec(name)
    offered = spec.hosts * spec.nics_per_host * spec.planes * spec.host_rate_mbps
    assert offered <= MAX_OFFERED_MBPS


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_spec_header_states_its_true_time_scale(name):
    text = (SPEC_DIR / f"{name}.yaml").read_text()
    header = text.split("\nname:", 1)[0]
    assert all(line.startswith("#") for line in header.splitlines()), "the file opens with a comment block"
    stated = re.search(r"time_scale = ([0-9]+(?:\.[0-9]+)?)", header)
    assert stated, "the header says at what scale the lab runs"
    assert math.isclose(float(stated.group(1)), load_spec(name).time_scale, rel_tol=1e-4)


@pytest.mark.parametrize("name, kind, ratio", [
    ("default", "leafspine", 0.5),
    ("meta_ai_zone", "leafspine", 1.0),
    ("oversubscribed", "leafspine", 2.0),
    ("parallel_links", "leafspine", 1.0),
    ("spectrumx_fig16", "multiplane", 1.0),
    ("tiny", "leafspine", 0.5),
])
def test_shipped_spec_shape(name, kind, ratio):
    spec = load_spec(name)
    assert spec.kind == kind
    assert spec.oversubscription == pytest.approx(ratio)


def test_spectrumx_spec_matches_figure_16():
    spec = load_spec("spectrumx_fig16")
    assert (spec.planes, spec.spines, spec.leaves) == (4, 2, 3)
    assert spec.parallel_links >= 2, "so one leaf can be cut to 25% of its uplinks"
    assert spec.host_rate_mbps == spec.fabric_rate_mbps, "uniform link speeds"


def test_meta_spec_has_deeper_spine_than_leaf_buffers():
    spec = load_spec("meta_ai_zone")
    assert spec.nics_per_host == 2
    assert spec.buffers.spine >= 8 * spec.buffers.leaf


@pytest.mark.parametrize("text", ["100Mbps", "20MB", "1GB/s", "20Mb"])
def test_rate_in_bytes_or_ambiguous_units_is_refused(text):
    # tc reads 'mbps' as megabytes per second: the lab refuses rather than guess a factor of 8.
    with pytest.raises(SpecError, match="rate must be"):
        parse_rate_mbps(text, "r")


# -- link delay: real time in the spec, scaled into lab time ----------------------------------------
@pytest.mark.parametrize("value, usec", [
    ("500ns", 0.5), ("2us", 2.0), ("2 us", 2.0), ("1.5µs", 1.5), ("0.05ms", 50.0), ("0.0001s", 100.0),
    (3, 3.0), (0.1, 0.1), (0, 0.0), ("0us", 0.0),
])
def test_delay_units(value, usec):
    spec = spec_from_dict({"name": "d", "real_host_rate": "400G", "delay": {"fabric": value}})
    assert spec.delay == LinkDelay(fabric_us=usec)
    assert spec.delay.host_us == 0.0


def test_delay_is_scaled_into_lab_time_by_the_time_scale():
    # 10 Mbit/s for 400 Gbit/s: x40000, so 0.5 us of cable is 20 ms in the lab.
    spec = spec_from_dict({"name": "d", "host_rate": "10Mbit", "real_host_rate": "400G",
                           "delay": {"host": "250ns", "fabric": "500ns"}})
    assert spec.time_scale == 40_000
    assert spec.lab_delay_ms("host") == pytest.approx(10.0)
    assert spec.lab_delay_ms("fabric") == pytest.approx(20.0)
    assert spec.has_delay
    assert spec.to_dict()["lab_delay_ms"] == {"host": pytest.approx(10.0), "fabric": pytest.approx(20.0)}
    assert spec.to_dict()["delay"] == {"host_us": 0.25, "fabric_us": 0.5}


def test_no_delay_by_default():
    spec = spec_from_dict({"name": "d"})
    assert not spec.has_delay and spec.lab_delay_ms("fabric") == 0.0
    assert spec.to_dict()["lab_delay_ms"] == {"host": 0.0, "fabric": 0.0}


@pytest.mark.parametrize("delay, expected", [
    ({"fabric": "-1us"}, "spec: delay.fabric: delay must be >= 0, got '-1us'"),
    ({"fabric": -2}, "spec: delay.fabric: delay must be >= 0, got -2"),
    ({"host": "fast"}, "spec: delay.host: delay must be a number of microseconds or a string like '500ns' or '2us', got 'fast'"),
    ({"host": "5 furlongs"}, "delay.host: delay must be a number of microseconds"),
    ({"host": True}, "delay.host: delay must be a number of microseconds"),
    ({"host": [1]}, "delay.host: delay must be a number of microseconds"),
    ({"host": float("nan")}, "delay.host: delay must be finite"),
    ({"spine": "1us"}, "spec: delay: unknown link kind 'spine' (known: host, fabric)"),
    ("1us", "spec: delay: must map host/fabric to real one-way delays"),
])
def test_bad_delays_are_one_line_errors(delay, expected):
    message = rejected({"name": "d", "real_host_rate": "400G", "delay": delay})
    assert expected in message


def test_delay_needs_a_time_scale():
    message = rejected({"name": "d", "delay": {"fabric": "1us"}})
    assert "spec 'd': delay is real time and needs real_host_rate" in message


def test_a_lab_delay_that_would_stall_the_lab_is_refused():
    # 1 ms of real cable at x40000 is 40 s in the lab.
    message = rejected({"name": "d", "host_rate": 10, "real_host_rate": "400G", "delay": {"fabric": "1ms"}})
    assert "delay.fabric 1000 us at time scale x40000 is 40000 ms in the lab; at most 10000 ms" in message


def test_delay_given_directly_is_checked():
    assert "delay.host must be >= 0 microseconds, got -1" in rejected_spec(
        real_host_rate_mbps=400_000, delay=LinkDelay(host_us=-1))
    assert "delay must be a LinkDelay" in rejected_spec(delay={"host_us": 1})


def test_delay_problems_are_reported_with_the_others():
    message = rejected({"name": "d", "spines": 0, "real_host_rate": "400G", "delay": {"host": "x"}})
    assert message.startswith("2 problems") and "spines" in message and "delay.host" in message


def test_fabric_json_keeps_the_delay():
    spec = spec_from_dict({"name": "d", "real_host_rate": "400G", "delay": {"fabric": "500ns"}})
    assert Fabric.from_json(Fabric(spec).to_json()).spec.delay == spec.delay
