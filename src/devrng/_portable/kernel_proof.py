"""What devrng's compiled CPU kernel must prove before it is used, checked without torch.

The kernel is the C extension ``devrng._portable._threefry_kernel`` that ``pip install``
compiles (``setup.py``); ``threefry_cpu`` wraps it for torch tensors. Before its first use
it proves itself twice: its file matches the SHA-256 its build recorded beside it (checked
before the library is mapped: a truncated library would crash the process), and its
output equals known answers in every mode and counter form (Random123's test vectors for
Threefry-2x32-20, the uniforms and integers JAX makes from them, and the digests of
recorded normal and exponential draws, which a build with fused multiply-adds misses).

Both proofs need only the standard library (the outputs go to ``ctypes`` buffers), so
``python -m devrng._portable.kernel_proof`` runs them wherever the kernel is installed,
torch or not: each wheel's test step (``[tool.cibuildwheel]``) and the check of every
supported Python (tests/test_pythons.py). It exits 0 only when the kernel may be used.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib
import importlib.util
import struct
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

__all__ = ["BITS", "EXPONENTIAL", "KNOWN_COUNT", "KNOWN_DIGESTS", "KNOWN_START", "NORMAL",
           "NORMAL_AT", "UNIFORM", "UNIFORM64", "UNIFORM_AT", "WORDS", "Found", "find",
           "proves_itself"]

# The modes of fill(): out0 = x0 ^ x1 (int32); out0, out1 = x0, x1 (int32); out0 = the
# float32 uniform; the float64 uniform (from both words); the float32 normal; the float32
# exponential (devrng._portable.threefry.unit, normal and exponential); the float32 uniform on
# [shift, shift + scale) and the float32 normal times scale plus shift (devrng._portable.threefry's
# uniform with bounds and normal with mean and std: affine's rounding).
BITS, WORDS, UNIFORM, UNIFORM64, NORMAL, EXPONENTIAL, UNIFORM_AT, NORMAL_AT = range(8)
_CTYPES: dict[int, Any] = {BITS: ctypes.c_int32, WORDS: ctypes.c_int32, UNIFORM: ctypes.c_float,
                           UNIFORM64: ctypes.c_double, NORMAL: ctypes.c_float,
                           EXPONENTIAL: ctypes.c_float, UNIFORM_AT: ctypes.c_float,
                           NORMAL_AT: ctypes.c_float}

# Random123's known answers for Threefry-2x32 with 20 rounds: key, counter -> (x0, x1).
_KNOWN = (((0x00000000, 0x00000000), (0x00000000, 0x00000000), (0x6B200159, 0x99BA4EFE)),
          ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
          ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)))
# SHA-256 of 4096 float32 draws (their bytes) of the key (0, 0) at counters 2**32 - 2048 to
# 2**32 + 2047, made by devrng._portable.threefry's tensor ops (tests/test_kernel.py makes them
# again), per (mode, scale, shift): each branch of the normal and exponential formulas,
# the scaling of normal_(0.5, 0.02), and a carry into the high counter word. A kernel
# built with fused multiply-adds, say, gives other bytes.
KNOWN_START, KNOWN_COUNT = (1 << 32) - 2048, 4096
KNOWN_DIGESTS = {
    (NORMAL, 1.0, 0.0): "4cb295d24d9a443b12b2c6cbc458434665642cdc75b6b332841e976f32b6cea5",
    (EXPONENTIAL, 1.0, 0.0): "7de614bdafb073e0c4b2365907f17eb6b2365502f827ca0e40bb5d7b963023a8",
    (NORMAL_AT, 0.02, 0.5): "0897234dd515a47dcc43458fab2a230d8c662a28795ac1ce6a6902a91105453a",
}

Fill = Callable[..., None]


def _fill(fill: Fill, key: tuple[int, int], mode: int, n: int, *, start: int = 0,
          counters: Any = None, scale: float = 1.0, shift: float = 0.0) -> list[Any]:
    """``fill``'s outputs in ``mode`` for ``n`` counters (from ``start``, or the uint64
    ``counters`` array), as ctypes arrays: out0, and out1 in WORDS mode."""
    outs = [(_CTYPES[mode] * n)() for _ in range(2 if mode == WORDS else 1)]
    fill(key[0], key[1], start, 0 if counters is None else ctypes.addressof(counters), n, mode,
         ctypes.addressof(outs[0]), ctypes.addressof(outs[1]) if mode == WORDS else 0,
         float(scale), float(shift))
    return outs


def _at(fill: Fill, key: tuple[int, int], counter: int, mode: int, scale: float = 1.0,
        shift: float = 0.0) -> list[Any]:
    """Mode ``mode``'s output at one counter, from a start and from a counters array."""
    from_start = _fill(fill, key, mode, 1, start=counter, scale=scale, shift=shift)[0][0]
    listed = _fill(fill, key, mode, 1, counters=(ctypes.c_uint64 * 1)(counter), scale=scale,
                   shift=shift)[0][0]
    return [from_start, listed]


def _round32(value: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", value))[0])


def proves_itself(fill: Fill, randint: Fill) -> bool:
    """Whether the kernel's ``fill`` and ``randint`` give the known answers in every mode and
    counter form: Random123's words, the uniforms and integers JAX makes from them, the
    digests of normal and exponential draws."""
    for key, (c_hi, c_lo), (x0, x1) in _KNOWN:
        counter = (c_hi << 32) | c_lo
        words = _fill(fill, key, WORDS, 1, start=counter)
        if [w[0] & 0xFFFFFFFF for w in words] != [x0, x1]:
            return False
        bits = x0 ^ x1
        want = {BITS: bits - (1 << 32) if bits >> 31 else bits,
                UNIFORM: (bits >> 9) * 2.0 ** -23,
                UNIFORM64: (((x0 << 32) | x1) >> 12) * 2.0 ** -52}
        if any(_at(fill, key, counter, mode) != [value] * 2 for mode, value in want.items()):
            return False
        # uniform_(-0.75, 0.5): u * 1.25 - 0.75 is exact in float64, then rounded to float32.
        scaled = _at(fill, key, counter, UNIFORM_AT, 1.25, -0.75)
        if scaled != [max(-0.75, _round32(want[UNIFORM] * 1.25 - 0.75))] * 2:
            return False
        # randint with both split keys set to this key: its two draws are both ``bits``.
        for span, low, wide in ((10, -3, True), (2**31 - 1, 0, False), (65537, 1 << 20, True)):
            multiplier = ((((1 << 16) % span) ** 2) & 0xFFFFFFFF) % span
            out = (ctypes.c_int64 if wide else ctypes.c_int32)()
            randint(*key, *key, counter, 0, 1, span, multiplier, low, wide, ctypes.addressof(out))
            if out.value != low + ((bits % span) * multiplier + bits % span) % (1 << 32) % span:
                return False
    counters = (ctypes.c_uint64 * KNOWN_COUNT)(*range(KNOWN_START, KNOWN_START + KNOWN_COUNT))
    for (mode, scale, shift), digest in KNOWN_DIGESTS.items():
        for kwargs in ({"start": KNOWN_START}, {"counters": counters}):
            (out,) = _fill(fill, (0, 0), mode, KNOWN_COUNT, scale=scale, shift=shift, **kwargs)
            if hashlib.sha256(bytes(out)).hexdigest() != digest:
                return False
    return True


class Found(NamedTuple):
    """The installed kernel: its ``fill`` and ``randint`` when it may be used, the library's
    path (None: not installed), and why it may not be used (None: it may)."""

    functions: tuple[Fill, Fill] | None
    where: str | None
    problem: str | None


def find() -> Found:
    """Find the installed kernel and run both proofs (the SHA-256 first, then the answers)."""
    spec = importlib.util.find_spec(f"{__package__}._threefry_kernel")
    if spec is None or spec.origin is None:  # no C compiler when devrng was installed
        return Found(None, None, "is not installed")
    where = spec.origin
    problem = _digest_problem(where)
    if problem is not None:
        return Found(None, where, problem)
    try:
        module = importlib.import_module(spec.name)
    except ImportError as err:
        return Found(None, where, f"could not be imported ({type(err).__name__}: {str(err)[:200]})")
    fill, randint = getattr(module, "fill", None), getattr(module, "randint", None)
    if not callable(fill) or not callable(randint):
        return Found(None, where, "has no fill() or randint()")
    if not proves_itself(fill, randint):
        return Found(None, where, "gave wrong answers for the known test vectors")
    return Found((fill, randint), where, None)


def _digest_problem(path: str) -> str | None:
    """Why the library at ``path`` must not be loaded (it differs from the SHA-256 its build
    wrote beside it: truncated, altered), or None. Checked before the library is mapped,
    since loading a truncated library can crash the process."""
    try:
        with open(path + ".sha256") as fh:
            recorded = fh.read(200).strip()
        with open(path, "rb") as fh:
            actual = hashlib.sha256(fh.read()).hexdigest()
    except OSError as err:
        return f"cannot be checked ({type(err).__name__}: {err})"
    if actual != recorded:
        return (f"does not match the SHA-256 recorded when it was built ({recorded[:16]}..., "
                f"now {actual[:16]}...): it was truncated or altered")
    return None


def main() -> int:
    """``python -m devrng._portable.kernel_proof``: both proofs, one line; 0 when they pass."""
    found = find()
    if found.problem is not None:
        print(f"devrng's CPU kernel {found.where or ''} {found.problem}".replace("  ", " "))
        return 1
    print(f"devrng's CPU kernel {found.where}: its SHA-256 and the known answers of every mode "
          "check out")
    return 0


if __name__ == "__main__":
    sys.exit(main())
