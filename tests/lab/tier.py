"""Which kernel tier a lab test runs on, and the check every full-kernel test makes.

Tests marked `fullkernel` exercise mechanisms only a complete kernel has (the kernel OVS datapath,
RED, netem, rdma_rxe). They run on both tiers: inside the full-kernel guest (`fabriclab fullkernel
test`, which sets FABRICLAB_TIER=full) they must run the full-kernel mechanism, so a silent fallback
fails; on any other kernel they must run what `doctor` chose there, and say which fallback that was.
"""

import os

from fabriclab.system import doctor

TIER_ENV = "FABRICLAB_TIER"


def full_tier():
    """True inside the full-kernel guest, where the full mechanisms are required."""
    return os.environ.get(TIER_ENV) == "full"


def tier_name():
    return "full" if full_tier() else "minimal"


def check_mechanism(record_property, feature, ran, full):
    """Assert that `ran` (what the lab reports it used for doctor feature `feature`) is `full` in the
    full-kernel tier, and doctor's choice elsewhere. Records "feature=ran" for the run's summary."""
    chosen = doctor.mechanisms(doctor.probe())[feature]
    if full_tier():
        assert ran == full, (f"{feature}: the full-kernel tier must run {full!r}, the lab ran {ran!r} "
                             f"(doctor: {chosen.mechanism!r}, {chosen.note})")
    else:
        assert ran == chosen.mechanism, f"{feature}: the lab ran {ran!r}, doctor chose {chosen.mechanism!r}"
    kind = "full kernel" if ran == full else f"fallback, {chosen.note}"
    record_property("mechanism", f"{feature}={ran} ({kind})")
