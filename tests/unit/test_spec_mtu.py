"""The spec's `mtu`: its default, its range, its type, the buffers it implies, and its YAML key."""

import pytest

from fabriclab.errors import SpecError
from fabriclab.topologies.fabric import Fabric
from fabriclab.topologies.spec import (
    MAX_MTU,
    MIN_MTU,
    Buffers,
    FabricSpec,
    load_spec,
    shipped_specs,
    spec_from_dict,
)


def refused(**fields):
    with pytest.raises(SpecError) as info:
        FabricSpec(name="t", **fields)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_default_is_jumbo_9000():
    spec = FabricSpec(name="t")
    assert spec.mtu == 9000
    assert spec.to_dict()["mtu"] == 9000
    assert Fabric(spec).summary()["mtu"] == 9000


def test_range_constants():
    assert (MIN_MTU, MAX_MTU) == (1500, 9216)


@pytest.mark.parametrize("mtu", [1500, 4200, 9000, 9216])
def test_accepted_mtus(mtu):
    assert FabricSpec(name="t", mtu=mtu).mtu == mtu


@pytest.mark.parametrize("mtu, message", [
    (1499, "mtu must be >= 1500, got 1499"),
    (0, "mtu must be >= 1500, got 0"),
    (-9000, "mtu must be >= 1500, got -9000"),
    (9217, "mtu must be <= 9216, got 9217"),
])
def test_out_of_range_mtus_are_refused(mtu, message):
    assert refused(mtu=mtu) == f"spec 't': {message}"


@pytest.mark.parametrize("mtu", [65535, 40000])
def test_a_too_large_mtu_is_the_only_problem_reported(mtu):
    assert refused(mtu=mtu) == f"spec 't': mtu must be <= 9216, got {mtu}"


@pytest.mark.parametrize("mtu", [True, False, 9000.0, 1500.5, "9000", None])
def test_mtu_must_be_a_whole_number(mtu):
    assert refused(mtu=mtu) == f"spec 't': mtu must be a whole number, got {mtu!r}"


@pytest.mark.parametrize("role", ["host", "leaf", "spine"])
def test_a_buffer_smaller_than_two_frames_is_refused_naming_its_role(role):
    message = refused(buffers=Buffers(**{role: 2 * 9014 - 1}))
    assert message == (f"spec 't': buffers.{role} must hold two 9000-byte-MTU frames "
                       f"(18028 bytes), got 18027")


def test_two_frames_exactly_is_enough():
    spec = FabricSpec(name="t", buffers=Buffers(host=18028, leaf=18028, spine=18028))
    assert spec.buffers.host == 18028


def test_the_two_frame_minimum_follows_the_mtu():
    assert FabricSpec(name="t", mtu=1500, buffers=Buffers(host=3028)).buffers.host == 3028
    assert "(3028 bytes), got 3027" in refused(mtu=1500, buffers=Buffers(host=3027))
    # the shipped default buffers (64 KiB) hold two frames of the largest MTU
    assert FabricSpec(name="t", mtu=MAX_MTU).buffers == Buffers()
    assert "(18460 bytes)" in refused(mtu=MAX_MTU, buffers=Buffers(leaf=18459))


def test_every_small_buffer_is_reported():
    message = refused(buffers=Buffers(host=10_000, spine=12_000))
    assert message.startswith("2 problems: ")
    assert "buffers.host" in message and "buffers.spine" in message and "buffers.leaf" not in message


def test_a_bad_mtu_does_not_also_blame_the_buffers():
    message = refused(mtu="jumbo")
    assert "buffers" not in message


# -- YAML -----------------------------------------------------------------------------------------

def test_yaml_key_mtu():
    assert spec_from_dict({"name": "j", "mtu": 4200}).mtu == 4200
    assert spec_from_dict({"name": "j"}).mtu == 9000


@pytest.mark.parametrize("value, message", [
    (1400, "mtu must be >= 1500, got 1400"),
    ("9000", "mtu must be a whole number, got '9000'"),
    (9000.0, "mtu must be a whole number, got 9000.0"),
])
def test_yaml_mtu_errors_name_the_field(value, message):
    with pytest.raises(SpecError) as info:
        spec_from_dict({"name": "j", "mtu": value}, source="j.yaml")
    assert message in str(info.value)


def test_yaml_buffers_are_checked_against_the_yaml_mtu():
    spec = spec_from_dict({"name": "j", "mtu": 1500, "buffers": {"host": "4KiB"}})
    assert (spec.mtu, spec.buffers.host) == (1500, 4096)
    with pytest.raises(SpecError, match=r"buffers\.host must hold two 9000-byte-MTU frames"):
        spec_from_dict({"name": "j", "buffers": {"host": "4KiB"}})


def test_yaml_mtu_problem_is_reported_with_other_problems():
    with pytest.raises(SpecError) as info:
        spec_from_dict({"name": "j", "mtu": 100, "colour": "red"}, source="j.yaml")
    message = str(info.value)
    assert message.startswith("2 problems: ")
    assert "unknown key 'colour'" in message and "mtu must be >= 1500, got 100" in message


def test_load_spec_reads_mtu_from_a_file(tmp_path):
    path = tmp_path / "std.yaml"
    path.write_text("name: std\nleaves: 2\nmtu: 1500\n")
    assert load_spec(str(path)).mtu == 1500


def test_mtu_survives_the_json_the_controller_reads():
    fabric = Fabric(FabricSpec(name="t", mtu=1500))
    assert Fabric.from_json(fabric.to_json()).spec.mtu == 1500


@pytest.mark.parametrize("name", shipped_specs())
def test_shipped_specs_have_a_valid_mtu(name):
    spec = load_spec(name)
    assert MIN_MTU <= spec.mtu <= MAX_MTU
