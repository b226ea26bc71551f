"""What devrng's compiled CPU kernel must prove before it is used, checked without torch.

The kernel is the C extension ``devrng._portable._threefry_kernel`` that ``pip install``
compiles (``setup.py``); ``threefry_cpu`` wraps it for torch tensors. Before its first use
it proves itself twice: its file matches the SHA-256 its build recorded beside it (checked
before the library is mapped: a truncated library would crash the process), and its
output equals known answers: Random123's test vectors for Threefry-2x32-20, and the digest
of draws that run every mode, output type, counter form, block and tail length of the
kernel (``PROOF_DIGEST``; a build with fused multiply-adds, or one flipped bit in a path it
serves, gives other bytes).

Both proofs need only the standard library (the outputs go to ``ctypes`` buffers), so
``python -m devrng._portable.kernel_proof`` runs them wherever the kernel is installed,
torch or not: each wheel's test step (``[tool.cibuildwheel]``) and the check of every
supported Python (tests/test_pythons.py). It exits 0 only when the kernel may be used.
"""

from __future__ import annotations

import array
import ctypes
import functools
import hashlib
import importlib.util
import sys
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from typing import Any, NamedTuple

__all__ = ["BITS", "EXPONENTIAL", "NORMAL", "NORMAL_AT", "NORMAL_BF16", "NORMAL_BF16_AT",
           "NORMAL_F16", "NORMAL_F16_AT", "PROOF_DIGEST", "PROOF_FILLS", "PROOF_KEY",
           "PROOF_LENGTH", "PROOF_LENGTHS", "PROOF_RANDINTS", "PROOF_SPLIT", "PROOF_START",
           "PROOF_STEP", "UNIFORM", "UNIFORM64", "UNIFORM64_AT", "UNIFORM_AT", "UNIFORM_BF16_AT",
           "UNIFORM_F16_AT", "UNIT_BF16", "UNIT_F16", "WORDS", "Found",
           "find", "jax_multiplier", "proof_counters", "proof_digest", "proof_draw_counters",
           "proves_itself", "sorts_stably"]

# The modes of fill(): out0 = x0 ^ x1 (int32); out0, out1 = x0, x1 (int32); out0 = the
# float32 uniform; the float64 uniform (from both words); the float32 normal; the float32
# exponential (devrng._portable.distributions.unit, normal and exponential); the float32 uniform
# on [shift, shift + scale) and the float32 normal times scale plus shift (distributions'
# uniform with bounds and normal with mean and std: affine's rounding); the float64 uniform
# on [shift, shift + scale); and for float16 and bfloat16 (each its own mode, in that order)
# the unit uniform, the uniform on [shift, shift + scale), the normal (the float32 one
# rounded) and the normal times scale plus shift.
BITS, WORDS, UNIFORM, UNIFORM64, NORMAL, EXPONENTIAL, UNIFORM_AT, NORMAL_AT = range(8)
UNIFORM64_AT, UNIT_F16, UNIT_BF16, UNIFORM_F16_AT, UNIFORM_BF16_AT = range(8, 13)
NORMAL_F16, NORMAL_BF16, NORMAL_F16_AT, NORMAL_BF16_AT = range(13, 17)
_HALF_MODES = (UNIT_F16, UNIT_BF16, UNIFORM_F16_AT, UNIFORM_BF16_AT, NORMAL_F16, NORMAL_BF16,
               NORMAL_F16_AT, NORMAL_BF16_AT)
_CTYPES: dict[int, Any] = {BITS: ctypes.c_int32, WORDS: ctypes.c_int32, UNIFORM: ctypes.c_float,
                           UNIFORM64: ctypes.c_double, NORMAL: ctypes.c_float,
                           EXPONENTIAL: ctypes.c_float, UNIFORM_AT: ctypes.c_float,
                           NORMAL_AT: ctypes.c_float, UNIFORM64_AT: ctypes.c_double,
                           **dict.fromkeys(_HALF_MODES, ctypes.c_uint16)}

# Random123's known answers for Threefry-2x32 with 20 rounds: key, counter -> (x0, x1).
_KNOWN = (((0x00000000, 0x00000000), (0x00000000, 0x00000000), (0x6B200159, 0x99BA4EFE)),
          ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
          ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)))

# The draws a kernel must reproduce before its first use: every entry point, mode and output
# type, from a start and from a counters array. The kernel works in blocks of 256 elements
# and computes a last partial block whole: PROOF_LENGTH elements from PROOF_START are whole
# blocks, one across a carry into the counters' high word, and a partial one of 255; each draw
# is also made at 1 element and at 17 blocks less one (what a kernel does may depend on the
# length and on the block); the counters array holds scattered 64-bit counters. Each draw
# starts 7 counters after the one before, so that no draw equals what an earlier one left in
# memory. The normal draws include erfinv's tails, the randint spans each range reduction
# (JAX's multiplier, 0 for spans above 2**16 and for powers of 2; span 1) in int64 ("wide")
# and int32. PROOF_DIGEST is the SHA-256 of their bytes as the tensor ops of
# devrng._portable.threefry and distributions make them (tests/test_kernel.py makes them again).
PROOF_KEY = (0x243F6A88, 0xB7E15162)
PROOF_SPLIT = ((0x1E573EDD, 0xAAE7BF55), (0xAA694F87, 0x9F895C85))  # fold_in(PROOF_KEY, 0), (.., 1)
PROOF_START, PROOF_LENGTH, PROOF_STEP = (0x9E3779BA << 32) - 300, 4 * 256 - 1, 7
PROOF_LENGTHS = (PROOF_LENGTH, 1, 17 * 256 - 1)
PROOF_FILLS = ((BITS, 1.0, 0.0), (WORDS, 1.0, 0.0), (UNIFORM, 1.0, 0.0), (UNIFORM64, 1.0, 0.0),
               (NORMAL, 1.0, 0.0), (EXPONENTIAL, 1.0, 0.0), (UNIFORM_AT, 1.25, -0.75),
               (NORMAL_AT, 0.02, 0.5), (NORMAL_F16, 1.0, 0.0), (NORMAL_BF16, 1.0, 0.0),
               (NORMAL_F16_AT, 0.02, 0.5), (NORMAL_BF16_AT, 3.0, -0.1), (UNIFORM64_AT, 0.2, -0.1),
               (UNIFORM64_AT, 0.5, -0.25), (UNIT_F16, 1.0, 0.0), (UNIT_BF16, 1.0, 0.0),
               (UNIFORM_F16_AT, 0.375, -0.25), (UNIFORM_BF16_AT, 1.25, -0.75))
PROOF_RANDINTS = ((1000, -3, True), (7, 0, False), (1 << 16, 5, True), ((1 << 16) + 1, 0, False),
                  (1, 5, True), ((1 << 32) - 1, -(1 << 31), False))  # (span, low, wide)
PROOF_DIGEST = "79b525deb283d197bb3437784d0b1722737fb27afcb6dc1964bd7963032388a5"
_MASK64 = (1 << 64) - 1

Fill = Callable[..., None]
#: ``fill(mode, scale, shift, counters, from_start)``: the mode's outputs as bytes (two for
#: WORDS); ``randint(span, low, wide, counters, from_start)``: the integers' bytes.
ProofFill = Callable[[int, float, float, Sequence[int], bool], list[bytes]]
ProofRandint = Callable[[int, int, bool, Sequence[int], bool], bytes]


def jax_multiplier(span: int) -> int:
    """``(2**16 % span)**2 % span`` as ``jax.random.randint`` computes it, squaring in uint32
    (for spans above 2**16 the square wraps to 0)."""
    return ((((1 << 16) % span) ** 2) & 0xFFFFFFFF) % span


@functools.lru_cache(maxsize=len(PROOF_LENGTHS))
def _scattered(length: int) -> tuple[int, ...]:
    return tuple((((i * 2654435761 + 0x9E37) & 0xFFFFFFFF) << 32)
                 | ((i * 40503 + 0x7F4A7C15) & 0xFFFFFFFF) for i in range(length))


def proof_counters(length: int = PROOF_LENGTH) -> list[int]:
    """The proof's counters: 64-bit counters (as uint64) with scattered high and low words."""
    return list(_scattered(length))


def proof_draw_counters(i: int, length: int, from_start: bool) -> Sequence[int]:
    """The counters (uint64) of the proof's draw number ``i`` (PROOF_FILLS, then
    PROOF_RANDINTS) of ``length`` elements: a run from a start (a range: the kernel reads only
    its first; none of them wraps past 2**64), or from proof_counters()."""
    if from_start:
        first = PROOF_START + PROOF_STEP * i
        return range(first, first + length)
    step = PROOF_STEP * i
    return [(c + step) & _MASK64 for c in _scattered(length)]


def proof_digest(fill: ProofFill, randint: ProofRandint) -> str:
    """The SHA-256 of the proof's draws under PROOF_KEY, made by ``fill`` and ``randint``
    (``ProofFill``, ``ProofRandint``): element k of a draw comes from ``counters[k]``;
    ``from_start`` says that they run on from ``counters[0]`` (the kernel's start form).
    Each draw is made at every length of PROOF_LENGTHS."""
    digest = hashlib.sha256()
    for from_start in (True, False):
        for length in PROOF_LENGTHS:
            for i, (mode, scale, shift) in enumerate(PROOF_FILLS):
                for data in fill(mode, scale, shift, proof_draw_counters(i, length, from_start),
                                 from_start):
                    digest.update(data)
            for i, (span, low, wide) in enumerate(PROOF_RANDINTS, len(PROOF_FILLS)):
                digest.update(randint(span, low, wide, proof_draw_counters(i, length, from_start),
                                      from_start))
    return digest.hexdigest()


def sorts_stably(sort: Fill) -> bool:
    """Whether the kernel's ``sort`` orders the scattered counters' low words, cut to 8 bits
    and a top bit (512 keys: many equal ones), as unsigned numbers, stably: the values
    follow Python's ``sorted``.
    At PROOF_LENGTH and at 17 * 256 - 1 numbers, its passes of 8 bits and of 11 (from 4,096
    numbers: randperm's rounds); the first with the values given, the second with them
    counted from 0 by the kernel (randperm's first round)."""
    for n, counted in ((PROOF_LENGTH, False), (PROOF_LENGTHS[-1], True)):
        keys = array.array("I", [c & 0xFF | (c >> 20 & 0x1) << 31 for c in _scattered(n)])
        values = array.array("q", [-1] * n if counted else range(n))
        want = sorted(range(n), key=keys.__getitem__)
        scratch_keys, scratch_values = array.array("I", keys), array.array("q", values)
        sort(keys.buffer_info()[0], values.buffer_info()[0], n, scratch_keys.buffer_info()[0],
             scratch_values.buffer_info()[0], counted)
        if values.tolist() != want or keys.tolist() != sorted(keys):
            return False
    return True


def proves_itself(fill: Fill, randint: Fill, block: Callable[..., tuple[int, int]],
                  sort: Fill) -> bool:
    """Whether the kernel's ``fill``, ``randint`` and ``block`` give Random123's words (from a
    start and from counters), ``block`` the keys of PROOF_SPLIT, the proof's draws
    (``PROOF_DIGEST``), and ``sort`` sorts stably (``sorts_stably``)."""
    if array.array("I").itemsize != 4 or array.array("q").itemsize != 8:
        return False
    if any(block(*PROOF_KEY, 0, i) != split for i, split in enumerate(PROOF_SPLIT)):
        return False
    if not sorts_stably(sort):
        return False
    for key, (c_hi, c_lo), want in _KNOWN:
        if block(key[0], key[1], c_hi, c_lo) != want:
            return False
        counter = (c_hi << 32) | c_lo
        for listed in (False, True):
            words = [ctypes.c_int32(), ctypes.c_int32()]
            counters = (ctypes.c_uint64 * 1)(counter)
            fill(key[0], key[1], counter, ctypes.addressof(counters) if listed else 0, 1, WORDS,
                 ctypes.addressof(words[0]), ctypes.addressof(words[1]), 1.0, 0.0)
            if tuple(w.value & 0xFFFFFFFF for w in words) != want:
                return False

    def kernel_fill(mode: int, scale: float, shift: float, counters: Sequence[int],
                    from_start: bool) -> list[bytes]:
        n = len(counters)
        outs = [(_CTYPES[mode] * n)() for _ in range(2 if mode == WORDS else 1)]
        listed = None if from_start else array.array("Q", counters)  # 6x ctypes' speed
        fill(*PROOF_KEY, counters[0] if from_start else 0,
             0 if listed is None else listed.buffer_info()[0], n, mode,
             ctypes.addressof(outs[0]), ctypes.addressof(outs[1]) if mode == WORDS else 0,
             float(scale), float(shift))
        return [bytes(out) for out in outs]

    def kernel_randint(span: int, low: int, wide: bool, counters: Sequence[int],
                       from_start: bool) -> bytes:
        n = len(counters)
        out = ((ctypes.c_int64 if wide else ctypes.c_int32) * n)()
        listed = None if from_start else array.array("Q", counters)  # 6x ctypes' speed
        (a0, a1), (b0, b1) = PROOF_SPLIT
        randint(a0, a1, b0, b1, counters[0] if from_start else 0,
                0 if listed is None else listed.buffer_info()[0], n, span, jax_multiplier(span),
                low, wide, ctypes.addressof(out))
        return bytes(out)

    return proof_digest(kernel_fill, kernel_randint) == PROOF_DIGEST


class Found(NamedTuple):
    """The installed kernel: its ``fill``, ``randint`` and ``block`` when it may be used, the
    library's path (None: not installed), and why it may not be used (None: it may)."""

    functions: tuple[Fill, Fill, Callable[..., tuple[int, int]], Fill] | None
    where: str | None
    problem: str | None


def find(spec: ModuleSpec | None = None) -> Found:
    """The kernel at ``spec`` (by default the installed one), after both proofs (the
    SHA-256 first, then the answers)."""
    if spec is None:
        spec = importlib.util.find_spec(f"{__package__}._threefry_kernel")
    if spec is None or spec.origin is None or spec.loader is None:  # built without a compiler
        return Found(None, None, "is not installed")
    where = spec.origin
    problem = _digest_problem(where)
    if problem is not None:
        return Found(None, where, problem)
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except ImportError as err:
        return Found(None, where, f"could not be imported ({type(err).__name__}: {str(err)[:200]})")
    fill, randint = getattr(module, "fill", None), getattr(module, "randint", None)
    block, sort = getattr(module, "block", None), getattr(module, "sort", None)
    if not callable(fill) or not callable(randint) or not callable(block) or not callable(sort):
        return Found(None, where, "has no fill(), randint(), block() or sort()")
    try:
        proved = proves_itself(fill, randint, block, sort)
    except Exception as err:  # a damaged kernel may refuse its own arguments
        return Found(None, where, f"failed its known-answer check ({type(err).__name__}: "
                                  f"{str(err)[:200]})")
    if not proved:
        return Found(None, where, "gave wrong answers for the known test vectors")
    return Found((fill, randint, block, sort), where, None)


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
