"""Threefry-2x32 on the CPU as one fused loop: a small C kernel, compiled once and cached.

The same generator as tensor ops (``devrng._threefry``) is a chain of about
130 elementwise kernels, each reading and writing the whole array: ~13x the
time of ``torch.rand`` for 2**20 numbers. One C loop that keeps both words in
registers does the same integer arithmetic (add, xor, rotate, all wrapping
mod 2**32, so the result is the same bits whatever the compiler vectorises)
at about the speed of ``torch.rand``.

The kernel is compiled with the system C compiler (``$CC``, else ``cc``,
``gcc`` or ``clang``) into devrng's cache directory the first time a CPU draw
needs it (a fraction of a second) and loaded with ``ctypes`` (which releases
the GIL during the call). Without a compiler, or with ``DEVRNG_CPU_KERNEL=0``,
CPU draws use the tensor ops instead: the same numbers, slower.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from devrng._locks import ForkSafeLock

__all__ = ["CpuKernel", "cache_dir", "kernel"]

_logger = logging.getLogger("devrng")

# x0 and x1 start as the counter words plus the key; 20 rounds in five groups of four,
# a key injection after each group (the Threefry-2x32 schedule JAX uses).
_SOURCE = r"""
#include <stdint.h>
#if defined(__x86_64__) && defined(__GNUC__) && defined(DEVRNG_CLONES)
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CLONES
#endif
#define ROTL(x, r) (((x) << (r)) | ((x) >> (32 - (r))))
#define ROUND(r) x0 += x1; x1 = ROTL(x1, r); x1 ^= x0;
#define BLOCK(c0, c1) \
    uint32_t x0 = (c0) + k0, x1 = (c1) + k1; \
    ROUND(13) ROUND(15) ROUND(26) ROUND(6) x0 += k1; x1 += k2 + 1u; \
    ROUND(17) ROUND(29) ROUND(16) ROUND(24) x0 += k2; x1 += k0 + 2u; \
    ROUND(13) ROUND(15) ROUND(26) ROUND(6) x0 += k0; x1 += k1 + 3u; \
    ROUND(17) ROUND(29) ROUND(16) ROUND(24) x0 += k1; x1 += k2 + 4u; \
    ROUND(13) ROUND(15) ROUND(26) ROUND(6) x0 += k2; x1 += k0 + 5u;
/* Counter i is start + i, or counters[i] when given. mode 0: out0 = x0 ^ x1 (32 random bits);
   mode 1: out0 = x0, out1 = x1 (64); mode 2: out0 = the float32 in [0, 1) that
   jax.random.uniform makes from x0 ^ x1. One loop per case, so each vectorises. */
#define LOOP(COUNTER, STORE) \
    for (int64_t i = 0; i < n; i++) { \
        uint64_t c = COUNTER; \
        BLOCK((uint32_t)(c >> 32), (uint32_t)c) \
        STORE \
    }
#define STORE_BITS out0[i] = x0 ^ x1;
#define STORE_WORDS out0[i] = x0; out1[i] = x1;
#define STORE_UNIFORM { union { uint32_t u; float f; } v; \
    v.u = ((x0 ^ x1) >> 9) | 0x3F800000u; ((float *)out0)[i] = v.f - 1.0f; }

CLONES void devrng_threefry(uint32_t k0, uint32_t k1, uint64_t start, const uint64_t *counters,
                            int64_t n, int mode, uint32_t *out0, uint32_t *out1) {
    const uint32_t k2 = k0 ^ k1 ^ 0x1BD11BDAu;
    if (counters) {
        if (mode == 0) LOOP(counters[i], STORE_BITS)
        else if (mode == 1) LOOP(counters[i], STORE_WORDS)
        else LOOP(counters[i], STORE_UNIFORM)
    } else {
        if (mode == 0) LOOP(start + (uint64_t)i, STORE_BITS)
        else if (mode == 1) LOOP(start + (uint64_t)i, STORE_WORDS)
        else LOOP(start + (uint64_t)i, STORE_UNIFORM)
    }
}
"""
_FLAGS = ("-O3", "-shared", "-fPIC", "-fno-strict-aliasing")
BITS, WORDS, UNIFORM = 0, 1, 2


def cache_dir() -> Path:
    """Where compiled kernels are kept: ``$DEVRNG_CACHE_DIR``, else ``~/.cache/devrng/kernels``."""
    explicit = os.environ.get("DEVRNG_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base, "devrng", "kernels")


class CpuKernel:
    """The loaded kernel: ``run`` fills preallocated CPU tensors."""

    def __init__(self, path: Path) -> None:
        self.path = path
        lib = ctypes.CDLL(str(path))
        fn = lib.devrng_threefry
        fn.restype = None
        fn.argtypes = [ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_void_p,
                       ctypes.c_int64, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        self._fn = fn
        self._lib = lib  # keeps the library loaded as long as the kernel lives

    def run(self, key: tuple[int, int], mode: int, out0: torch.Tensor,
            out1: torch.Tensor | None = None, *, start: int = 0,
            counters: torch.Tensor | None = None) -> None:
        """Fill ``out0`` (and ``out1`` in WORDS mode), contiguous 32-bit CPU tensors.

        Element i comes from counter ``start + i``, or ``counters[i]`` (a
        contiguous int64 CPU tensor of the same length) when given.
        """
        ptr = None if counters is None else counters.data_ptr()
        self._fn(key[0], key[1], start, ptr, out0.numel(), mode, out0.data_ptr(),
                 None if out1 is None else out1.data_ptr())


_lock = ForkSafeLock()  # DataLoader workers fork: never inherit it held
_state: dict[str, Any] = {}  # "kernel": CpuKernel | None once tried


def kernel() -> CpuKernel | None:
    """The compiled kernel, built on first use; None when it cannot be (or is disabled)."""
    try:
        return _state["kernel"]  # type: ignore[no-any-return]
    except KeyError:
        pass
    with _lock:
        if "kernel" not in _state:
            _state["kernel"] = _build()
    return _state["kernel"]  # type: ignore[no-any-return]


def _compiler() -> str | None:
    cc = os.environ.get("CC")
    if cc:
        return shutil.which(cc) or cc
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _build() -> CpuKernel | None:
    if os.environ.get("DEVRNG_CPU_KERNEL", "1").strip() == "0":
        return None
    cc = _compiler()
    if cc is None:
        _logger.info("devrng.portable: no C compiler found; CPU draws use tensor ops")
        return None
    tag = hashlib.sha256("\0".join([_SOURCE, cc, *_FLAGS, sys.platform]).encode()).hexdigest()
    path = cache_dir() / f"threefry-{tag[:16]}.so"
    try:
        if not path.exists():
            _compile(cc, path)
        return CpuKernel(path)
    except (OSError, subprocess.SubprocessError) as err:
        _logger.warning("devrng.portable: could not build its CPU kernel (%s); CPU draws use "
                        "tensor ops, which give the same numbers more slowly", err)
        return None


def _compile(cc: str, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        source = Path(tmp, "threefry.c")
        source.write_text(_SOURCE)
        built = Path(tmp, path.name)
        # Function multi-versioning first (AVX-512/AVX2 picked at load time); a compiler
        # or target without it builds the plain loop.
        for extra in (["-DDEVRNG_CLONES"], []):
            result = subprocess.run([cc, *_FLAGS, *extra, "-o", str(built), str(source)],
                                    capture_output=True, text=True, timeout=120)
            if result.returncode == 0:
                break
        else:
            raise OSError(f"{cc} failed: {result.stderr.strip()[-500:]}")
        # Ranks of one job may build at once: each renames its own complete file.
        os.replace(built, path)
