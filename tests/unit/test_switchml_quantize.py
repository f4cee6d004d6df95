"""Block floating point (seed 003 section 4.6, appendix E): the shared exponent, a scale that no
sum of n workers can overflow, and the error bound n / (2f)."""

import numpy as np
import pytest

from fabriclab.switchml import quantize as q
from fabriclab.switchml.packet import NO_EXPONENT

INT32_MAX = 2**31 - 1
WORKER_COUNTS = [1, 2, 3, 5, 7, 8, 9, 16, 100, 1000, 65_536]


@pytest.mark.parametrize("n, t", [(1, 30), (2, 29), (3, 29), (4, 28), (8, 27), (9, 27),
                                  (65_536, 14)])
def test_headroom_bits_examples(n, t):
    assert q.headroom_bits(n) == t


@pytest.mark.parametrize("n", list(range(1, 300)) + [1000, 4097, 65_536])
def test_headroom_is_the_largest_power_of_two_that_n_workers_can_sum(n):
    t = q.headroom_bits(n)
    assert n * 2**t <= INT32_MAX < n * 2**(t + 1)


def test_headroom_refuses_zero_workers():
    with pytest.raises(ValueError):
        q.headroom_bits(0)


@pytest.mark.parametrize("block, m", [
    ([1.0], 0), ([1.5], 1), ([2.0], 1), ([0.5], -1), ([0.75], 0), ([-4.0], 2), ([3.0, -0.1], 2),
    ([0.0, -0.0], NO_EXPONENT), ([], NO_EXPONENT),
    ([np.float32(2.0**-149)], -149),                       # the smallest float32 subnormal
    ([np.finfo(np.float32).max], 128),
    ([-np.finfo(np.float32).max, 1.0], 128),
])
def test_block_exponent_is_the_smallest_power_of_two_bounding_the_block(block, m):
    assert q.block_exponent(np.array(block, dtype=np.float32)) == m


def test_block_exponent_bounds_random_blocks_tightly():
    rng = np.random.default_rng(0)
    for _ in range(200):
        block = rng.standard_normal(64) * 10.0 ** rng.integers(-30, 30)
        m = q.block_exponent(block)
        assert 2.0**(m - 1) < np.abs(block).max() <= 2.0**m


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_block_exponent_refuses_values_that_are_not_finite(bad):
    with pytest.raises(ValueError, match="NaN or infinity"):
        q.block_exponent(np.array([1.0, bad]))


def test_block_exponents_cover_a_short_last_block():
    tensor = np.array([1.0, 0.5, 0.0, 0.0, 3.0], dtype=np.float32)
    assert q.block_exponents(tensor, 2) == [0, NO_EXPONENT, 2]


@pytest.mark.parametrize("n", WORKER_COUNTS)
@pytest.mark.parametrize("m", [-149, -20, 0, 7, 128])
def test_n_workers_at_the_largest_magnitude_do_not_overflow(n, m):
    """The worst case of theorem 2: every worker at +-2^m, and just below it (which rounds up)."""
    for value in (2.0**m, np.nextafter(2.0**m, 0.0)):
        for sign in (1, -1):
            ints = q.quantize(np.array([sign * value]), m, n)
            assert abs(int(ints[0])) == 2**q.headroom_bits(n)
            assert abs(n * int(ints[0])) <= INT32_MAX


def test_our_scale_is_within_a_factor_two_of_the_papers():
    for n in WORKER_COUNTS:
        for m in (-10, 0, 10):
            ours = 2.0**q.scale_exponent(m, n)
            papers = INT32_MAX / (n * 2.0**m)
            assert papers / 2 < ours <= papers


@pytest.mark.parametrize("n", [1, 2, 3, 8, 31])
def test_the_aggregate_of_n_quantized_blocks_is_within_the_bound(n):
    rng = np.random.default_rng(n)
    for trial in range(50):
        blocks = rng.standard_normal((n, 64)) * 10.0 ** rng.uniform(-8, 8, size=(n, 1))
        blocks = blocks.astype(np.float32)
        m = max(q.block_exponent(b) for b in blocks)
        ints = np.array([q.quantize(b, m, n) for b in blocks], dtype=np.int64)
        total = ints.sum(axis=0)
        assert np.abs(total).max() <= INT32_MAX
        approx = q.dequantize(total.astype(np.int32), m, n)
        exact = blocks.astype(np.float64).sum(axis=0)
        bound = q.error_bound(m, n)
        assert np.abs(approx - exact).max() <= bound
        assert bound == n / 2 * 2.0**(m - q.headroom_bits(n))
        # ... and the bound is small against the block: about n 2^-t of its largest value
        assert bound <= n * 2.0**-q.headroom_bits(n) * np.abs(blocks).max()


def test_dequantize_inverts_quantize_exactly_for_representable_values():
    block = np.array([0.25, -3.0, 1.5, 0.0])
    for n in (1, 4, 9):
        m = q.block_exponent(block)
        assert np.array_equal(q.dequantize(q.quantize(block, m, n), m, n), block)


def test_an_all_zero_block_passes_unscaled_and_exactly():
    ints = q.quantize(np.zeros(8), NO_EXPONENT, 4)
    assert ints.dtype == np.int32 and not ints.any()
    assert not q.dequantize(ints, NO_EXPONENT, 4).any()
    assert q.error_bound(NO_EXPONENT, 4) == 0.0


def test_quantize_refuses_an_agreed_exponent_below_the_blocks_own():
    with pytest.raises(ValueError, match="exceeds the agreed exponent"):
        q.quantize(np.array([5.0]), 2, 2)
    with pytest.raises(ValueError, match="exceeds the agreed exponent"):
        q.quantize(np.array([5.0]), NO_EXPONENT, 2)


def test_a_larger_agreed_exponent_only_costs_precision():
    block = np.array([0.3, -0.7])
    for m in (0, 5, 20):
        approx = q.dequantize(q.quantize(block, m, 2), m, 2)
        assert np.abs(approx - block).max() <= q.error_bound(m, 2) / 2
