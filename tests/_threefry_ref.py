"""An independent NumPy reference of JAX's Threefry-2x32 layout, for the portable tests.

Written from the Threefry paper's schedule (Salmon et al., 2011: 20 rounds, rotations
13 15 26 6 17 29 16 24, key parity 0x1BD11BDA) and JAX's partitionable layout: the
tests compare devrng's tensor ops and CPU kernel with it in every environment, and
with real JAX where JAX is installed. ``rounded_once`` is the rounding reference for
bounded uniforms.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

M32 = 0xFFFFFFFF
_ROT = ((13, 15, 26, 6), (17, 29, 16, 24))


def threefry2x32(key: tuple[int, int], x0: np.ndarray, x1: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    k0, k1 = np.uint32(key[0]), np.uint32(key[1])
    ks = (k0, k1, np.uint32(k0 ^ k1 ^ np.uint32(0x1BD11BDA)))
    x0 = np.asarray(x0, np.uint32) + ks[0]
    x1 = np.asarray(x1, np.uint32) + ks[1]
    for group in range(5):
        for r in _ROT[group % 2]:
            x0 = x0 + x1
            x1 = ((x1 << np.uint32(r)) | (x1 >> np.uint32(32 - r))) ^ x0
        x0 = x0 + ks[(group + 1) % 3]
        x1 = x1 + ks[(group + 2) % 3] + np.uint32(group + 1)
    return x0, x1


def key(seed: int) -> tuple[int, int]:
    return (seed >> 32) & M32, seed & M32


def fold_in(k: tuple[int, int], n: int) -> tuple[int, int]:
    a, b = threefry2x32(k, np.array([n >> 32], np.uint32), np.array([n & M32], np.uint32))
    return int(a[0]), int(b[0])


def stream_key(seed: int, n: int) -> tuple[int, int]:
    """The key of the n-th random op of ``devrng.portable(seed)``."""
    return fold_in(key(seed), n)


def words(k: tuple[int, int], shape: tuple[int, ...], counters: np.ndarray | None = None
          ) -> tuple[np.ndarray, np.ndarray]:
    i = (np.arange(int(np.prod(shape)), dtype=np.uint64) if counters is None
         else np.asarray(counters, np.uint64).reshape(-1))
    a, b = threefry2x32(k, (i >> np.uint64(32)).astype(np.uint32),
                        (i & np.uint64(M32)).astype(np.uint32))
    return a.reshape(shape), b.reshape(shape)


def bits(k: tuple[int, int], shape: tuple[int, ...], counters: np.ndarray | None = None
         ) -> np.ndarray:
    a, b = words(k, shape, counters)
    return a ^ b


def uniform(k: tuple[int, int], shape: tuple[int, ...], counters: np.ndarray | None = None
            ) -> np.ndarray:
    b = bits(k, shape, counters)
    return ((b >> np.uint32(9)) | np.uint32(0x3F800000)).view(np.float32) - np.float32(1)


# Binary formats: (significand bits, exponent of the smallest normal number, of the largest).
FORMATS = {"float16": (11, -14, 15), "bfloat16": (8, -126, 127), "float32": (24, -126, 127),
           "float64": (53, -1022, 1023)}


def rounded_once(x: Fraction, fmt: str) -> float:
    """The exact rational ``x`` rounded to nearest (ties to even) in the binary format
    ``fmt`` once, with integer arithmetic only: what a fused multiply-add gives."""
    precision, min_exponent, max_exponent = FORMATS[fmt]
    if x == 0:
        return 0.0
    magnitude = abs(x)
    exponent = magnitude.numerator.bit_length() - magnitude.denominator.bit_length()
    if Fraction(2) ** exponent > magnitude:  # 2**exponent <= magnitude < 2**(exponent + 1)
        exponent -= 1
    quantum = Fraction(2) ** (max(exponent, min_exponent) - precision + 1)
    steps, rest = divmod(magnitude, quantum)  # magnitude = steps * quantum + rest
    if rest * 2 > quantum or (rest * 2 == quantum and steps % 2 == 1):
        steps += 1
    value = steps * quantum
    if value >= Fraction(2) ** (max_exponent + 1):
        return math.copysign(math.inf, x)
    return math.copysign(float(value), x)
