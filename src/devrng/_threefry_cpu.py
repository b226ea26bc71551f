"""Threefry-2x32 on the CPU as one fused loop: devrng's C extension, built at install time.

The same generator as tensor ops (``devrng._threefry``) is a chain of about
130 elementwise kernels, each reading and writing the whole array. One C loop
that keeps both words in registers does the same integer arithmetic at about
the speed of ``torch.rand`` (``benchmarks/`` has the figures).

The loop is ``devrng._threefry_kernel``, an optional extension that
``pip install`` compiles (``setup.py``): it lives in site-packages beside the
rest of the package. Nothing is compiled, cached or loaded from elsewhere at run
time. Before its first use it proves itself twice: the file must match the
SHA-256 its build recorded beside it (checked before the library is mapped: a
truncated library would crash the process), and its output must equal known
answers (Random123's test vectors for Threefry-2x32-20, in all three output
modes). A kernel that fails either is not used, with a warning. Without it (no
C compiler at install time), with ``DEVRNG_CPU_KERNEL=0``, or after a failed
check, CPU draws use the tensor ops: the same numbers, more slowly.
``devrng doctor`` says which is in use (``status``).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import logging
import os
from collections.abc import Callable
from typing import Any

import torch

from devrng._locks import ForkSafeLock

__all__ = ["BITS", "UNIFORM", "WORDS", "CpuKernel", "kernel", "status"]

_logger = logging.getLogger("devrng")

BITS, WORDS, UNIFORM = 0, 1, 2  # out0 = x0 ^ x1; out0, out1 = x0, x1; out0 = uniform float32

# Random123's known answers for Threefry-2x32 with 20 rounds: key, counter -> (x0, x1).
_KNOWN = (((0x00000000, 0x00000000), (0x00000000, 0x00000000), (0x6B200159, 0x99BA4EFE)),
          ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
          ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)))


class CpuKernel:
    """The extension's loop: ``run`` fills preallocated CPU tensors."""

    __slots__ = ("_fill",)

    def __init__(self, fill: Callable[..., None]) -> None:
        self._fill = fill

    def run(self, key: tuple[int, int], mode: int, out0: torch.Tensor,
            out1: torch.Tensor | None = None, *, start: int = 0,
            counters: torch.Tensor | None = None) -> None:
        """Fill ``out0`` (and ``out1`` in WORDS mode), contiguous 32-bit CPU tensors.

        Element i comes from counter ``start + i``, or ``counters[i]`` (a
        contiguous int64 CPU tensor of the same length) when given.
        """
        self._fill(key[0], key[1], start, 0 if counters is None else counters.data_ptr(),
                   out0.numel(), mode, out0.data_ptr(), 0 if out1 is None else out1.data_ptr())


def _proves_itself(cpu: CpuKernel) -> bool:
    """Whether the kernel gives Random123's known answers in every mode and counter form."""
    for key, (c_hi, c_lo), (x0, x1) in _KNOWN:
        counter = (c_hi << 32) | c_lo
        words = torch.empty(2, 1, dtype=torch.int32)
        cpu.run(key, WORDS, words[0], words[1], start=counter)
        bits = torch.empty(1, dtype=torch.int32)
        as_signed = torch.tensor([counter - (1 << 64) if counter >> 63 else counter])
        cpu.run(key, BITS, bits, counters=as_signed)
        uniform = torch.empty(1, dtype=torch.float32)
        cpu.run(key, UNIFORM, uniform, start=counter)
        want_uniform = torch.tensor([((x0 ^ x1) >> 9) | 0x3F800000], dtype=torch.int64)
        want_uniform = want_uniform.to(torch.int32).view(torch.float32) - 1.0
        if ([w & 0xFFFFFFFF for w in words.flatten().tolist()] != [x0, x1]
                or int(bits.item()) & 0xFFFFFFFF != x0 ^ x1 or not torch.equal(uniform, want_uniform)):
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


_SLOWER = ("devrng.portable's CPU draws use tensor ops: the same numbers, one to two orders "
           "of magnitude more slowly (docs/benchmarks.md)")


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
            fill = getattr(module, "fill", None)
            if not callable(fill):
                problem = "has no fill()"
            elif not _proves_itself(CpuKernel(fill)):
                problem = "gave wrong answers for Random123's known test vectors"
            else:
                return CpuKernel(fill), (f"compiled at install time ({where}), its SHA-256 and "
                                         "known answers checked.")
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
