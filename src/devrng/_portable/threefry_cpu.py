"""Threefry-2x32 on the CPU as one fused loop: devrng's C extension, built at install time.

The same generator as tensor ops (``devrng._portable.threefry``) is a chain of
elementwise kernels, one per integer op of its rounds, each reading and writing the
whole array (docs/benchmarks.md: the rows "without the C kernel"). One C loop
that keeps both words in registers does the same integer arithmetic faster than
``torch.rand`` (``benchmarks/`` has the figures). It also turns the words into
what the common draws need in the same pass (uniforms in float32, float64,
float16 and bfloat16, with or without bounds; normal draws in float32, float16 and
bfloat16, with or without a mean and std; float32 exponential draws;
``jax.random.randint``'s integers), each the same bits as
``devrng._portable.threefry``'s and ``distributions``' tensor ops.

The loop is ``devrng._portable._threefry_kernel``, an optional extension that
``pip install`` compiles (``setup.py``): it lives in site-packages beside the
rest of the package. Nothing is compiled, cached or loaded from elsewhere at run
time. Before its first use it proves itself twice: the file must match the
SHA-256 its build recorded beside it (checked before the library is mapped: a
truncated library would crash the process), and its output must equal known
answers (``kernel_proof``: Random123's test vectors for Threefry-2x32-20, and the
digest of draws that run every mode, output type and code path of the kernel).
A kernel that fails either is not used, with a ``DevRNGWarning`` once per
process (also logged on the ``"devrng"`` logger). Without it (no C compiler at
install time), with ``DEVRNG_CPU_KERNEL`` off (``switched_off``), or after a failed check, CPU draws
use the tensor ops: the same numbers, more slowly. ``devrng doctor`` says which
is in use (``status``).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from importlib.machinery import ModuleSpec
from typing import Any

import torch

from devrng._base.errors import DevRNGError, warn_and_log
from devrng._base.locks import ForkSafeLock
from devrng._portable.kernel_proof import (
    BITS,
    EXPONENTIAL,
    NORMAL,
    NORMAL_AT,
    NORMAL_BF16,
    NORMAL_BF16_AT,
    NORMAL_F16,
    NORMAL_F16_AT,
    UNIFORM,
    UNIFORM64,
    UNIFORM64_AT,
    UNIFORM_AT,
    UNIFORM_BF16_AT,
    UNIFORM_F16_AT,
    UNIT_BF16,
    UNIT_F16,
    WORDS,
    find,
)

__all__ = [
    "BITS",
    "DTYPES",
    "EXPONENTIAL",
    "HALF_MODES",
    "NORMAL",
    "NORMAL_AT",
    "PARALLEL_FROM",
    "UNIFORM",
    "UNIFORM64",
    "UNIFORM64_AT",
    "UNIFORM_AT",
    "WORDS",
    "CpuKernel",
    "in_parts",
    "kernel",
    "load_checked",
    "loaded",
    "status",
    "switched_off",
]

# The modes of fill() (``kernel_proof``) and the dtype of what each fills.
DTYPES = {BITS: torch.int32, WORDS: torch.int32, UNIFORM: torch.float32,
          UNIFORM64: torch.float64, NORMAL: torch.float32, EXPONENTIAL: torch.float32,
          UNIFORM_AT: torch.float32, NORMAL_AT: torch.float32, UNIFORM64_AT: torch.float64,
          UNIT_F16: torch.float16, UNIT_BF16: torch.bfloat16, UNIFORM_F16_AT: torch.float16,
          UNIFORM_BF16_AT: torch.bfloat16, NORMAL_F16: torch.float16,
          NORMAL_BF16: torch.bfloat16, NORMAL_F16_AT: torch.float16,
          NORMAL_BF16_AT: torch.bfloat16}

# The float16 and bfloat16 modes, by what they draw: dtype -> mode.
HALF_MODES = {"unit": {torch.float16: UNIT_F16, torch.bfloat16: UNIT_BF16},
              "uniform": {torch.float16: UNIFORM_F16_AT, torch.bfloat16: UNIFORM_BF16_AT},
              "normal": {torch.float16: NORMAL_F16, torch.bfloat16: NORMAL_BF16},
              "normal_at": {torch.float16: NORMAL_F16_AT, torch.bfloat16: NORMAL_BF16_AT}}


class CpuKernel:
    """The extension's loops: ``run`` and ``randint`` fill preallocated CPU tensors; ``block``
    is one Threefry-2x32 block (``block(k0, k1, c0, c1) -> (x0, x1)``, the keys of draws);
    ``permute`` makes a permutation's rounds of stable sorts, each by ``sort``'s loop."""

    __slots__ = ("_fill", "_randint", "_sort", "block")

    def __init__(self, fill: Callable[..., None], randint: Callable[..., None],
                 block: Callable[[int, int, int, int], tuple[int, int]],
                 sort: Callable[..., None]) -> None:
        self._fill = fill
        self._randint = randint
        self.block = block
        self._sort = sort

    def sort(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Sort ``values`` (contiguous int64) in place by ``keys`` (contiguous int32 bit
        patterns, compared as unsigned numbers; sorted in place too), stably."""
        scratch = torch.empty_like(keys), torch.empty_like(values)
        self._sort(keys.data_ptr(), values.data_ptr(), keys.numel(), scratch[0].data_ptr(),
                   scratch[1].data_ptr())

    def permute(self, keys: Sequence[tuple[int, int]], n: int) -> torch.Tensor | None:
        """``arange(n)`` sorted stably by the bits of each key in turn (``BITS`` mode, counters
        from 0): ``jax.random.permutation``'s rounds for the keys of its splits. None under
        a FakeTensor mode (no memory to sort). The rounds share one scratch tensor, as the
        system's fresh memory is paid for again at its first touch (at 2**20 numbers, as
        much as a sort): the keys, their sort's scratch and the values' (``sort``)."""
        out = torch.empty(n, dtype=torch.int64, device="cpu")
        scratch = torch.empty(2 * n, dtype=torch.int64, device="cpu")
        if type(out) is not torch.Tensor or type(scratch) is not torch.Tensor:
            return None
        words, values = scratch.data_ptr(), out.data_ptr()
        bits, bits_tmp = words + 8 * n, words + 12 * n
        for round_, (k0, k1) in enumerate(keys):
            def part(i: int, m: int, k0: int = k0, k1: int = k1) -> None:
                self._fill(k0, k1, i, 0, m, BITS, bits + 4 * i, 0, 1.0, 0.0)

            in_parts(n, part)
            self._sort(bits, values, n, bits_tmp, words, round_ == 0)  # (0 to n - 1 first)
        return out if keys else out.copy_(torch.arange(n))

    def run(self, key: tuple[int, int], mode: int, out0: torch.Tensor,
            out1: torch.Tensor | None = None, *, start: int = 0,
            counters: torch.Tensor | None = None, scale: float = 1.0,
            shift: float = 0.0) -> None:
        """Fill ``out0`` (and ``out1`` in WORDS mode), contiguous CPU tensors of the mode's
        dtype (``DTYPES``); ``scale`` and ``shift`` are UNIFORM_AT's and NORMAL_AT's.

        Element i comes from counter ``start + i``, or ``counters[i]`` (a
        contiguous int64 CPU tensor of the same length) when given. A long draw is shared
        among torch's intra-op threads (``in_parts``): the same bits.
        """
        k0, k1 = key
        width, first0 = out0.element_size(), out0.data_ptr()
        first1 = 0 if out1 is None else out1.data_ptr()
        listed = 0 if counters is None else counters.data_ptr()
        scale, shift = float(scale), float(shift)

        def part(i: int, n: int) -> None:
            self._fill(k0, k1, (start + i) & _MASK64, listed and listed + 8 * i, n, mode,
                       first0 + width * i, first1 and first1 + width * i, scale, shift)

        in_parts(out0.numel(), part)

    def randint(self, keys: tuple[tuple[int, int], tuple[int, int]], span: int, multiplier: int,
                low: int, out: torch.Tensor, *, start: int = 0,
                counters: torch.Tensor | None = None) -> None:
        """Fill ``out`` (contiguous int64 or int32) with ``jax.random.randint``'s integers in
        ``[low, low + span)``: ``keys`` are ``split(key)[0]`` and ``[1]``, ``multiplier``
        is ``(2**16 % span)**2 % span`` as JAX computes it (``devrng._portable.threefry.randint``)."""
        (a0, a1), (b0, b1) = keys
        width, first, wide = out.element_size(), out.data_ptr(), out.dtype == torch.int64
        listed = 0 if counters is None else counters.data_ptr()

        def part(i: int, n: int) -> None:
            self._randint(a0, a1, b0, b1, (start + i) & _MASK64, listed and listed + 8 * i, n,
                          span, multiplier, low, wide, first + width * i)

        in_parts(out.numel(), part)


_MASK64 = (1 << 64) - 1
# Draws of at least this many elements are shared among torch's intra-op threads, in parts
# of whole blocks of the kernel (256 elements); shorter ones cost less than a thread's
# wake-up. Every element depends only on its counter: the bits do not depend on the parts.
PARALLEL_FROM = 1 << 18
_BLOCK = 256
_PARTS_PER_THREAD = 4  # small parts: a helper that starts late leaves little to wait for
_pool: dict[int, ThreadPoolExecutor] = {}  # by process id: a forked child makes its own


def in_parts(n: int, part: Callable[[int, int], None]) -> None:
    """``part(i, count)`` over ``[0, n)``: one call, or for long draws parts of whole blocks
    taken in turn by this thread and ``torch.get_num_threads() - 1`` helpers. This thread
    takes parts until none is left; a helper that has not started by then is cancelled, so
    a busy machine (helpers scheduled late) costs no more than one thread."""
    threads = torch.get_num_threads() if n >= PARALLEL_FROM else 1
    if threads <= 1:
        part(0, n)
        return
    size = -(-n // (threads * _PARTS_PER_THREAD) // _BLOCK) * _BLOCK  # whole blocks
    starts = iter(range(0, n, size))
    take = ForkSafeLock()

    def work() -> None:
        while True:
            with take:
                i = next(starts, None)
            if i is None:
                return
            part(i, min(size, n - i))

    pool = _pool.get(os.getpid())
    if pool is None:
        with _lock:
            pool = _pool.setdefault(os.getpid(), ThreadPoolExecutor(
                thread_name_prefix="devrng-kernel"))
    helpers = [pool.submit(work) for _ in range(threads - 1)]
    try:
        work()
    finally:
        for helper in helpers:
            if not helper.cancel():  # started: it finishes the part it holds
                helper.result()


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


def loaded() -> CpuKernel | None:
    """The kernel if ``kernel()`` has loaded it already, else None (without loading it: for
    the keys, which the first draw's call of ``kernel()`` speeds up from then on)."""
    return _loaded.get("kernel")


def status() -> tuple[bool, str]:
    """Whether the kernel is in use, and a sentence that says why (for ``devrng doctor``)."""
    try:
        kernel()
    except DevRNGError as err:  # DEVRNG_CPU_KERNEL holds a value that is neither on nor off
        return False, str(err)
    return _loaded["kernel"] is not None, _loaded["status"]


# The spellings of DEVRNG_CPU_KERNEL, compared stripped and lower-cased; unset and empty is on.
_OFF = ("0", "false", "off", "no")
_ON = ("", "1", "true", "on", "yes")


def switched_off() -> bool:
    """Whether ``DEVRNG_CPU_KERNEL`` switches the kernel off; a value that is neither one of
    the spellings of off nor one of on raises ``DevRNGError`` (a typo would otherwise
    silently leave the kernel on)."""
    raw = os.environ.get("DEVRNG_CPU_KERNEL", "")
    word = raw.strip().lower()
    if word in _OFF or word in _ON:
        return word in _OFF
    raise DevRNGError(
        f"DEVRNG_CPU_KERNEL={raw!r} is neither on nor off: set it to {', '.join(_OFF[:-1])} or "
        f"{_OFF[-1]} to draw without devrng's C kernel, or to {', '.join(_ON[1:-1])} or "
        f"{_ON[-1]} (or leave it unset or empty) to use it; case does not matter.")


_SLOWER = ("devrng.portable's CPU draws use tensor ops: the same numbers, many times more "
           "slowly than torch's generator (docs/benchmarks.md, the rows 'without the C kernel')")


def load_checked(spec: ModuleSpec | None) -> tuple[CpuKernel | None, str, str | None]:
    """The kernel at ``spec`` (the extension's, or None where it was not built), the
    sentence ``status`` gives, and the same sentence where a kernel failed its checks and
    must be warned about."""
    if switched_off():
        setting = os.environ["DEVRNG_CPU_KERNEL"].strip()
        return None, f"switched off by DEVRNG_CPU_KERNEL={setting}; {_SLOWER}.", None
    if spec is None or spec.origin is None or spec.loader is None:  # installed without a compiler
        return None, (f"not available (devrng was installed without it); {_SLOWER}. Reinstall "
                      "devrng where a C compiler is available (pip install . builds it) to "
                      "draw at torch.rand's speed."), None
    found = find(spec)
    if found.functions is not None:
        return CpuKernel(*found.functions), (f"compiled at install time ({found.where}), its "
                                             "SHA-256 and known answers checked."), None
    message = (f"the compiled kernel {found.where} {found.problem} and is not used; {_SLOWER}. "
               "Reinstall devrng.")
    return None, message, message
