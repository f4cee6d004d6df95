"""Block floating point for aggregating floats with 32-bit integer adders (seed 003, section 4.6
and appendix E).

Every block of k elements (one packet) is scaled by a factor f shared by all workers, rounded to
integers, summed by the aggregator and scaled back. The block's exponent m is the smallest integer
with max|x| <= 2^m over the block on *every* worker; workers agree on it through the look-ahead:
each sends, with block j of a slot, its own exponent of that slot's next block, and the result of
block j carries the maximum (see worker.py).

The paper sets f = (2^31 - 1) / (n 2^m). Here f is the largest power of two not above that,
f = 2^t / 2^m with t the largest integer such that n 2^t <= 2^31 - 1, for two reasons:

- no overflow, rounding included: |x| <= 2^m gives |f x| <= 2^t, an integer, so rounding to
  nearest cannot pass it, and n workers sum to at most n 2^t <= 2^31 - 1. (The paper's f can round
  one past the limit; its appendix E corrects this to f <= (2^31 - n) / (n B).)
- scaling by a power of two is exact in binary floating point, so the only error is the rounding
  of each contribution: at most 1/2 per worker, hence |A/f - sum x| <= n / (2f) per element
  (appendix E's theorem 1 gives the looser n / f for any rounding).

It costs at most one bit of the 31 against the paper's f.
"""

from __future__ import annotations

import numpy as np

from fabriclab.switchml.packet import NO_EXPONENT

INT32_MAX = (1 << 31) - 1


def headroom_bits(workers: int) -> int:
    """t: the largest integer with workers * 2^t <= 2^31 - 1 (30 for one worker, 27 for eight)."""
    if workers < 1:
        raise ValueError(f"workers={workers} must be at least 1")
    return (INT32_MAX // workers).bit_length() - 1


def block_exponent(block: np.ndarray) -> int:
    """The smallest integer m with max|x| <= 2^m, or NO_EXPONENT for an all-zero (or empty)
    block. A non-finite value cannot be scaled to an integer and is a ValueError."""
    values = np.abs(np.asarray(block, dtype=np.float64))
    if values.size == 0:
        return NO_EXPONENT
    largest = float(values.max())
    if not np.isfinite(largest):
        raise ValueError("a block holds NaN or infinity; block floating point cannot carry it")
    if largest == 0.0:
        return NO_EXPONENT
    mantissa, exponent = np.frexp(largest)   # largest = mantissa * 2^exponent, 0.5 <= mantissa < 1
    return int(exponent) - 1 if mantissa == 0.5 else int(exponent)


def block_exponents(tensor: np.ndarray, elements: int) -> list[int]:
    """block_exponent of each k-element block of a flat tensor (the last block may be short)."""
    return [block_exponent(tensor[start:start + elements])
            for start in range(0, len(tensor), elements)]


def scale_exponent(exponent: int, workers: int) -> int:
    """log2 of the scaling factor f for a block with shared exponent m and n workers: t - m.
    A block that is zero everywhere (NO_EXPONENT) is sent unscaled: its integers are all 0."""
    return 0 if exponent == NO_EXPONENT else headroom_bits(workers) - exponent


def quantize(block: np.ndarray, exponent: int, workers: int) -> np.ndarray:
    """The block scaled by f and rounded to nearest, as int32. `exponent` must be the agreed one:
    at least this worker's own block_exponent, or the sum could overflow."""
    values = np.asarray(block, dtype=np.float64)
    own = block_exponent(values)
    if own != NO_EXPONENT and (exponent == NO_EXPONENT or own > exponent):
        raise ValueError(f"block exponent {own} exceeds the agreed exponent {exponent}")
    scaled = np.rint(np.ldexp(values, scale_exponent(exponent, workers)))
    return scaled.astype(np.int32)


def dequantize(aggregate: np.ndarray, exponent: int, workers: int) -> np.ndarray:
    """The aggregated integers scaled back by 1/f, as float64 (exact: f is a power of two)."""
    return np.ldexp(np.asarray(aggregate, dtype=np.float64), -scale_exponent(exponent, workers))


def error_bound(exponent: int, workers: int) -> float:
    """The largest |dequantized sum - exact sum| of an element of a block with this agreed
    exponent: n / (2f). Zero for an all-zero block, which passes exactly."""
    if exponent == NO_EXPONENT:
        return 0.0
    return float(np.ldexp(workers / 2.0, -scale_exponent(exponent, workers)))
