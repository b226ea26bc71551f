"""Threefry-2x32 on the CPU as one fused loop: devrng's C extension, built at install time.

The same generator as tensor ops (``devrng._portable.threefry``) is a chain of about
130 elementwise kernels, each reading and writing the whole array. One C loop
that keeps both words in registers does the same integer arithmetic at about
the speed of ``torch.rand`` (``benchmarks/`` has the figures). It also turns the
words into what the common draws need in the same pass (float32 and float64
uniforms, float32 normal and exponential draws, ``jax.random.randint``'s
integers), each the same bits as ``devrng._portable.threefry``'s tensor ops.

The loop is ``devrng._portable._threefry_kernel``, an optional extension that
``pip install`` compiles (``setup.py``): it lives in site-packages beside the
rest of the package. Nothing is compiled, cached or loaded from elsewhere at run
time. Before its first use it proves itself twice: the file must match the
SHA-256 its build recorded beside it (checked before the library is mapped: a
truncated library would crash the process), and its output must equal known
answers (Random123's test vectors for Threefry-2x32-20 in every output mode,
and the digests of recorded normal and exponential draws). A kernel that fails either is not used, with a warning. Without it (no
C compiler at install time), with ``DEVRNG_CPU_KERNEL=0``, or after a failed
check, CPU draws use the tensor ops: the same numbers, more slowly.
``devrng doctor`` says which is in use (``status``).
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib
import importlib.util
import logging
import os
import struct
from collections.abc import Callable
from typing import Any

import torch

from devrng._base.locks import ForkSafeLock

__all__ = ["BITS", "DTYPES", "EXPONENTIAL", "KNOWN_COUNT", "KNOWN_DIGESTS", "KNOWN_START",
           "NORMAL", "NORMAL_AT", "UNIFORM", "UNIFORM64", "UNIFORM_AT", "WORDS", "CpuKernel",
           "kernel", "status"]

_logger = logging.getLogger("devrng")

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


def _at(cpu: CpuKernel, key: tuple[int, int], counter: int, mode: int, scale: float = 1.0,
        shift: float = 0.0) -> list[float]:
    """Mode ``mode``'s output at one counter, from a start and from a counters tensor."""
    out = [torch.empty(1, dtype=DTYPES[mode]) for _ in range(2)]
    cpu.run(key, mode, out[0], start=counter, scale=scale, shift=shift)
    as_signed = counter - (1 << 64) if counter >> 63 else counter
    cpu.run(key, mode, out[1], counters=torch.tensor([as_signed]), scale=scale, shift=shift)
    return [o.item() for o in out]


def _round32(value: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", value))[0])


def _proves_itself(cpu: CpuKernel) -> bool:
    """Whether the kernel gives the known answers in every mode and counter form: Random123's
    words, the uniforms and integers JAX makes from them, the digests of normal and
    exponential draws."""
    for key, (c_hi, c_lo), (x0, x1) in _KNOWN:
        counter = (c_hi << 32) | c_lo
        words = torch.empty(2, 1, dtype=torch.int32)
        cpu.run(key, WORDS, words[0], words[1], start=counter)
        if [w & 0xFFFFFFFF for w in words.flatten().tolist()] != [x0, x1]:
            return False
        bits = x0 ^ x1
        want = {BITS: bits - (1 << 32) if bits >> 31 else bits,
                UNIFORM: (bits >> 9) * 2.0 ** -23,
                UNIFORM64: (((x0 << 32) | x1) >> 12) * 2.0 ** -52}
        if any(_at(cpu, key, counter, mode) != [value] * 2 for mode, value in want.items()):
            return False
        # uniform_(-0.75, 0.5): u * 1.25 - 0.75 is exact in float64, then rounded to float32.
        scaled = _at(cpu, key, counter, UNIFORM_AT, 1.25, -0.75)
        if scaled != [max(-0.75, _round32(want[UNIFORM] * 1.25 - 0.75))] * 2:
            return False
        # randint with both split keys set to this key: its two draws are both ``bits``.
        for span, low, wide in ((10, -3, True), (2**31 - 1, 0, False), (65537, 1 << 20, True)):
            multiplier = ((((1 << 16) % span) ** 2) & 0xFFFFFFFF) % span
            out = torch.empty(1, dtype=torch.int64 if wide else torch.int32)
            cpu.randint((key, key), span, multiplier, low, out, start=counter)
            if out.item() != low + ((bits % span) * multiplier + bits % span) % (1 << 32) % span:
                return False
    counters = torch.arange(KNOWN_START, KNOWN_START + KNOWN_COUNT)
    for (mode, scale, shift), digest in KNOWN_DIGESTS.items():
        for kwargs in ({"start": KNOWN_START}, {"counters": counters}):
            out = torch.empty(KNOWN_COUNT, dtype=DTYPES[mode])
            cpu.run((0, 0), mode, out, scale=scale, shift=shift,
                    **kwargs)  # type: ignore[arg-type]
            data = ctypes.string_at(out.data_ptr(), KNOWN_COUNT * 4)  # no NumPy needed
            if hashlib.sha256(data).hexdigest() != digest:
                return False
    return True


_lock = ForkSafeLock()  # DataLoader workers fork: never inherit it held
_loaded: dict[str, Any] = {}  # "kernel": CpuKernel | None, "status": str, once tried


def kernel() -> CpuKernel | None:
    """The checked kernel, loaded on first use; None when devrng draws with tensor ops."""
    try:
        return _loaded["kernel"]  # type: ignore[no-any-return]
    except KeyError:
        pass
    with _lock:
        if "kernel" not in _loaded:
            _loaded["kernel"], _loaded["status"] = _load()
    return _loaded["kernel"]  # type: ignore[no-any-return]


def status() -> tuple[bool, str]:
    """Whether the kernel is in use, and a sentence that says why (for ``devrng doctor``)."""
    kernel()
    return _loaded["kernel"] is not None, _loaded["status"]


_SLOWER = ("devrng.portable's CPU draws use tensor ops: the same numbers, up to about 60 times "
           "more slowly than torch's generator (docs/portable.md, What it costs)")


def _load() -> tuple[CpuKernel | None, str]:
    if os.environ.get("DEVRNG_CPU_KERNEL", "1").strip() == "0":
        return None, f"switched off by DEVRNG_CPU_KERNEL=0; {_SLOWER}."
    spec = importlib.util.find_spec(f"{__package__}._threefry_kernel")
    if spec is None or spec.origin is None:  # no C compiler when devrng was installed
        return None, (f"not available (devrng was installed without it); {_SLOWER}. Reinstall "
                      "devrng where a C compiler is available (pip install . builds it) to "
                      "draw at torch.rand's speed.")
    where = spec.origin
    problem = _digest_problem(where)
    if problem is None:
        try:
            module = importlib.import_module(spec.name)
        except ImportError as err:
            problem = f"could not be imported ({type(err).__name__}: {str(err)[:200]})"
        else:
            fill, randint = getattr(module, "fill", None), getattr(module, "randint", None)
            if not callable(fill) or not callable(randint):
                problem = "has no fill() or randint()"
            elif not _proves_itself(CpuKernel(fill, randint)):
                problem = "gave wrong answers for the known test vectors"
            else:
                return CpuKernel(fill, randint), (f"compiled at install time ({where}), its "
                                                  "SHA-256 and known answers checked.")
    message = f"the compiled kernel {where} {problem} and is not used; {_SLOWER}. Reinstall devrng."
    _logger.warning("devrng: %s", message)
    return None, message


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
