"""Threefry-2x32 on the CPU as one fused loop: devrng's C extension, built at install time.

The same generator as tensor ops (``devrng._portable.threefry``) is a chain of about
130 elementwise kernels, each reading and writing the whole array. One C loop
that keeps both words in registers does the same integer arithmetic faster than
``torch.rand`` (``benchmarks/`` has the figures). It also turns the words into
what the common draws need in the same pass (float32 and float64 uniforms,
float32 normal and exponential draws, ``jax.random.randint``'s integers), each
the same bits as ``devrng._portable.threefry``'s tensor ops.

The loop is ``devrng._portable._threefry_kernel``, an optional extension that
``pip install`` compiles (``setup.py``): it lives in site-packages beside the
rest of the package. Nothing is compiled, cached or loaded from elsewhere at run
time. Before its first use it proves itself twice: the file must match the
SHA-256 its build recorded beside it (checked before the library is mapped: a
truncated library would crash the process), and its output must equal known
answers: Random123's test vectors for Threefry-2x32-20, and the digest of draws
that run every mode, output dtype and code path of the kernel (``PROOF_DIGEST``).
A kernel that fails either is not used, with a ``DevRNGWarning`` once per
process (also logged on the ``"devrng"`` logger). Without it (no C compiler at
install time), with ``DEVRNG_CPU_KERNEL=0``, or after a failed check, CPU draws
use the tensor ops: the same numbers, more slowly. ``devrng doctor`` says which
is in use (``status``).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib
import importlib.util
import os
from collections.abc import Callable
from importlib.machinery import ModuleSpec
from typing import Any

import torch

from devrng._base.errors import warn_and_log
from devrng._base.locks import ForkSafeLock

__all__ = ["BITS", "DTYPES", "EXPONENTIAL", "NORMAL", "NORMAL_AT", "PROOF_DIGEST", "PROOF_FILLS",
           "PROOF_KEY", "PROOF_LENGTH", "PROOF_LENGTHS", "PROOF_RANDINTS", "PROOF_SPLIT",
           "PROOF_START", "PROOF_STEP", "UNIFORM", "UNIFORM64", "UNIFORM_AT", "WORDS",
           "CpuKernel", "jax_multiplier", "kernel", "load_checked", "proof_counters",
           "proof_digest", "proof_draw_counters", "status"]

# The modes of fill(): out0 = x0 ^ x1 (int32); out0, out1 = x0, x1 (int32); out0 = the
# float32 uniform; the float64 uniform (from both words); the float32 normal; the float32
# exponential (devrng._portable.threefry.unit, normal and exponential); the float32 uniform on
# [shift, shift + scale) and the float32 normal times scale plus shift (devrng._portable.threefry's
# uniform with bounds and normal with mean and std: affine's rounding).
BITS, WORDS, UNIFORM, UNIFORM64, NORMAL, EXPONENTIAL, UNIFORM_AT, NORMAL_AT = range(8)
DTYPES = {BITS: torch.int32, WORDS: torch.int32, UNIFORM: torch.float32,
          UNIFORM64: torch.float64, NORMAL: torch.float32, EXPONENTIAL: torch.float32,
          UNIFORM_AT: torch.float32, NORMAL_AT: torch.float32}

# Random123's known answers for Threefry-2x32 with 20 rounds: key, counter -> (x0, x1).
_KNOWN = (((0x00000000, 0x00000000), (0x00000000, 0x00000000), (0x6B200159, 0x99BA4EFE)),
          ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
          ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)))

# The draws a kernel must reproduce before its first use: every entry point, mode and output
# dtype, from a start and from a counters tensor. The kernel works in blocks of 256 elements
# and computes a last partial block whole: PROOF_LENGTH elements from PROOF_START are whole
# blocks, one across a carry into the counters' high word, and a partial one of 255; each draw
# is also made at 1 element and at 17 blocks less one (what a kernel does may depend on the
# length and on the block); the counters tensor holds scattered 64-bit counters. Each draw
# starts 7 counters after the one before, so that no draw equals what an earlier one left in
# memory. The normal draws include erfinv's tails, the randint spans each range reduction
# (JAX's multiplier, 0 for spans above 2**16 and for powers of 2; span 1) in int64 and int32.
# PROOF_DIGEST is the SHA-256 of their bytes as devrng._portable.threefry's tensor ops make
# them (tests/test_kernel.py makes them again).
PROOF_KEY = (0x243F6A88, 0xB7E15162)
PROOF_SPLIT = ((0x1E573EDD, 0xAAE7BF55), (0xAA694F87, 0x9F895C85))  # fold_in(PROOF_KEY, 0), (.., 1)
PROOF_START, PROOF_LENGTH, PROOF_STEP = (0x9E3779BA << 32) - 300, 4 * 256 - 1, 7
PROOF_LENGTHS = (PROOF_LENGTH, 1, 17 * 256 - 1)
PROOF_FILLS = ((BITS, 1.0, 0.0), (WORDS, 1.0, 0.0), (UNIFORM, 1.0, 0.0), (UNIFORM64, 1.0, 0.0),
               (NORMAL, 1.0, 0.0), (EXPONENTIAL, 1.0, 0.0), (UNIFORM_AT, 1.25, -0.75),
               (NORMAL_AT, 0.02, 0.5))
PROOF_RANDINTS = ((1000, -3, torch.int64), (7, 0, torch.int32), (1 << 16, 5, torch.int64),
                  ((1 << 16) + 1, 0, torch.int32), (1, 5, torch.int64),
                  ((1 << 32) - 1, -(1 << 31), torch.int32))
PROOF_DIGEST = "ebbc2f5725815baa24af28b35e4f12f0c45465638f0143b5a4cc1091075ef7cb"


@functools.lru_cache
def proof_counters(length: int = PROOF_LENGTH) -> torch.Tensor:
    """The proof's counters tensor: 64-bit counters with scattered high and low words (as
    int64, made without overflowing it)."""
    i = torch.arange(length)
    hi = (i * 2654435761 + 0x9E37) & 0xFFFFFFFF
    lo = (i * 40503 + 0x7F4A7C15) & 0xFFFFFFFF
    return (hi - ((hi >> 31) << 32)) * (1 << 32) + lo


def jax_multiplier(span: int) -> int:
    """``(2**16 % span)**2 % span`` as ``jax.random.randint`` computes it, squaring in uint32
    (for spans above 2**16 the square wraps to 0)."""
    return ((((1 << 16) % span) ** 2) & 0xFFFFFFFF) % span


Fill = Callable[[int, float, float, torch.Tensor, bool], list[torch.Tensor]]
Randint = Callable[[int, int, torch.dtype, torch.Tensor, bool], torch.Tensor]


def proof_draw_counters(i: int, length: int, from_start: bool) -> torch.Tensor:
    """The counters (int64) of the proof's draw number ``i`` (PROOF_FILLS, then
    PROOF_RANDINTS) of ``length`` elements: a run from a start, or from proof_counters()."""
    if from_start:
        return torch.arange(length) + (PROOF_START + PROOF_STEP * i - (1 << 64))
    return proof_counters(length) + PROOF_STEP * i


def proof_digest(fill: Fill, randint: Randint) -> str:
    """The SHA-256 of the proof's draws under PROOF_KEY, made by ``fill(mode, scale, shift,
    counters, from_start)`` (the mode's outputs: two for WORDS) and ``randint(span, low,
    dtype, counters, from_start)``. Element i of a draw comes from ``counters[i]`` (int64);
    ``from_start`` says that they run on from ``counters[0]`` (the kernel's start form).
    Each draw is made at every length of PROOF_LENGTHS."""
    digest = hashlib.sha256()
    for from_start in (True, False):
        for length in PROOF_LENGTHS:
            draws = [t for i, (mode, scale, shift) in enumerate(PROOF_FILLS)
                     for t in fill(mode, scale, shift, proof_draw_counters(i, length, from_start),
                                   from_start)]
            draws += [randint(span, low, dtype, proof_draw_counters(i, length, from_start),
                              from_start)
                      for i, (span, low, dtype) in enumerate(PROOF_RANDINTS, len(PROOF_FILLS))]
            for t in draws:  # their bytes without NumPy (not a dependency)
                digest.update(ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()))
    return digest.hexdigest()


class CpuKernel:
    """The extension's loops: ``run`` and ``randint`` fill preallocated CPU tensors."""

    __slots__ = ("_fill", "_randint")

    def __init__(self, fill: Callable[..., None], randint: Callable[..., None]) -> None:
        self._fill = fill
        self._randint = randint

    def run(self, key: tuple[int, int], mode: int, out0: torch.Tensor,
            out1: torch.Tensor | None = None, *, start: int = 0,
            counters: torch.Tensor | None = None, scale: float = 1.0,
            shift: float = 0.0) -> None:
        """Fill ``out0`` (and ``out1`` in WORDS mode), contiguous CPU tensors of the mode's
        dtype (``DTYPES``); ``scale`` and ``shift`` are UNIFORM_AT's and NORMAL_AT's.

        Element i comes from counter ``start + i``, or ``counters[i]`` (a
        contiguous int64 CPU tensor of the same length) when given.
        """
        self._fill(key[0], key[1], start, 0 if counters is None else counters.data_ptr(),
                   out0.numel(), mode, out0.data_ptr(), 0 if out1 is None else out1.data_ptr(),
                   float(scale), float(shift))

    def randint(self, keys: tuple[tuple[int, int], tuple[int, int]], span: int, multiplier: int,
                low: int, out: torch.Tensor, *, start: int = 0,
                counters: torch.Tensor | None = None) -> None:
        """Fill ``out`` (contiguous int64 or int32) with ``jax.random.randint``'s integers in
        ``[low, low + span)``: ``keys`` are ``split(key)[0]`` and ``[1]``, ``multiplier``
        is ``(2**16 % span)**2 % span`` as JAX computes it (``devrng._portable.threefry.randint``)."""
        (a0, a1), (b0, b1) = keys
        self._randint(a0, a1, b0, b1, start, 0 if counters is None else counters.data_ptr(),
                      out.numel(), span, multiplier, low, out.dtype == torch.int64,
                      out.data_ptr())


def _proves_itself(cpu: CpuKernel) -> bool:
    """Whether the kernel gives Random123's words from a start and from counters, and the
    proof's draws (``PROOF_DIGEST``)."""
    for key, (c_hi, c_lo), want in _KNOWN:
        counter = (c_hi << 32) | c_lo
        signed = torch.tensor([counter - (1 << 64) if counter >> 63 else counter])
        for kwargs in ({"start": counter}, {"counters": signed}):
            words = torch.empty(2, 1, dtype=torch.int32)
            cpu.run(key, WORDS, words[0], words[1], **kwargs)  # type: ignore[arg-type]
            if tuple(w & 0xFFFFFFFF for w in words.flatten().tolist()) != want:
                return False

    def where(counters: torch.Tensor, from_start: bool) -> dict[str, Any]:
        if from_start:
            return {"start": int(counters[0]) & 0xFFFFFFFFFFFFFFFF}
        return {"counters": counters}

    def fill(mode: int, scale: float, shift: float, counters: torch.Tensor, from_start: bool
             ) -> list[torch.Tensor]:
        out = [torch.empty(len(counters), dtype=DTYPES[mode]) for _ in range(1 + (mode == WORDS))]
        cpu.run(PROOF_KEY, mode, *out, scale=scale, shift=shift, **where(counters, from_start))
        return out

    def randint(span: int, low: int, dtype: torch.dtype, counters: torch.Tensor,
                from_start: bool) -> torch.Tensor:
        out = torch.empty(len(counters), dtype=dtype)
        cpu.randint(PROOF_SPLIT, span, jax_multiplier(span), low, out,
                    **where(counters, from_start))
        return out

    return proof_digest(fill, randint) == PROOF_DIGEST


_lock = ForkSafeLock()  # DataLoader workers fork: never inherit it held
_loaded: dict[str, Any] = {}  # "kernel": CpuKernel | None, "status": str, once tried


def kernel() -> CpuKernel | None:
    """The checked kernel, loaded on first use; None when devrng draws with tensor ops."""
    try:
        return _loaded["kernel"]  # type: ignore[no-any-return]
    except KeyError:
        pass
    refused = None
    with _lock:
        if "kernel" not in _loaded:
            spec = importlib.util.find_spec(f"{__package__}._threefry_kernel")
            _loaded["kernel"], _loaded["status"], refused = load_checked(spec)
    if refused is not None:  # once per process (after the lock: a filter may make it raise)
        warn_and_log(f"devrng.portable: {refused}")
    return _loaded["kernel"]  # type: ignore[no-any-return]


def status() -> tuple[bool, str]:
    """Whether the kernel is in use, and a sentence that says why (for ``devrng doctor``)."""
    kernel()
    return _loaded["kernel"] is not None, _loaded["status"]


_SLOWER = ("devrng.portable's CPU draws use tensor ops: the same numbers, up to about 60 times "
           "more slowly than torch's generator (docs/portable.md, What it costs)")


def load_checked(spec: ModuleSpec | None) -> tuple[CpuKernel | None, str, str | None]:
    """The kernel at ``spec`` (the extension's, or None where it was not built), the
    sentence ``status`` gives, and the same sentence where a kernel failed its checks and
    must be warned about."""
    if os.environ.get("DEVRNG_CPU_KERNEL", "1").strip() == "0":
        return None, f"switched off by DEVRNG_CPU_KERNEL=0; {_SLOWER}.", None
    if spec is None or spec.origin is None or spec.loader is None:  # installed without a compiler
        return None, (f"not available (devrng was installed without it); {_SLOWER}. Reinstall "
                      "devrng where a C compiler is available (pip install . builds it) to "
                      "draw at torch.rand's speed."), None
    where = spec.origin
    problem = _digest_problem(where)
    cpu = None
    if problem is None:
        cpu, problem = _import_and_prove(spec)
    if cpu is not None:
        return cpu, (f"compiled at install time ({where}), its SHA-256 and known answers "
                     "checked."), None
    message = f"the compiled kernel {where} {problem} and is not used; {_SLOWER}. Reinstall devrng."
    return None, message, message


def _import_and_prove(spec: ModuleSpec) -> tuple[CpuKernel | None, str | None]:
    """The kernel from the library at ``spec``, once it gave the known answers; else None and
    what went wrong."""
    assert spec.loader is not None
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except ImportError as err:
        return None, f"could not be imported ({type(err).__name__}: {str(err)[:200]})"
    fill, randint = getattr(module, "fill", None), getattr(module, "randint", None)
    if not callable(fill) or not callable(randint):
        return None, "has no fill() or randint()"
    cpu = CpuKernel(fill, randint)
    try:
        proved = _proves_itself(cpu)
    except Exception as err:  # a damaged kernel may refuse its own arguments
        return None, f"failed its known-answer check ({type(err).__name__}: {str(err)[:200]})"
    if not proved:
        return None, "gave wrong answers for the known test vectors"
    return cpu, None


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
