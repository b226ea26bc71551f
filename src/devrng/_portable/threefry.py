"""A counter-based generator on tensors: Threefry-2x32 laid out as JAX lays it out.

Every number is a pure function of a key (two 32-bit words) and a counter
(the element's row-major index in the draw), computed with the output
device's own integer ops: add, xor and shifts, all mod 2**32. So the same key
gives the same bits on the CPU, CUDA, XLA or anything else that has 32-bit
integers, and any slice of a draw can be computed alone (what DTensor shards
need). The layout is JAX's with ``jax_threefry_partitionable=True`` (its
default since 0.5): ``key(seed) = (seed >> 32, seed & 0xFFFFFFFF)``,
``fold_in(k, n) = threefry(k, (n >> 32, n & 0xFFFFFFFF))``, and element i of
``bits`` is ``x0 ^ x1`` of ``threefry(k, (i >> 32, i & 0xFFFFFFFF))``.

Integers are int32 tensors holding the uint32 bit patterns: ``torch.uint32``
cannot add on the CPU, and wrapping int32 addition is the same bits. A
logical right shift is an arithmetic shift plus a mask.

This module is the bits: keys on the host, the rounds on tensors, the fused CPU
kernel's words (``devrng._portable.threefry_cpu``, the same bits in one pass), and
the two ops compiled code keeps opaque, ``devrng::bits`` and ``devrng::next_key``.
The distributions drawn from them are ``devrng._portable.distributions``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from devrng._base.lazy import load
from devrng._base.seeds import HostKey, seed_key
from devrng._portable import devices
from devrng._portable.threefry_cpu import (
    BITS,
    DTYPES,
    WORDS,
    kernel,
    loaded,
)

__all__ = ["M32", "HostKey", "chain", "fold_in", "fold_in_tensor", "host_key", "kernel_fill",
           "kernel_randint", "key_tensor", "next_key", "seed_key", "shr", "threefry2x32",
           "threefry_host", "unsigned"]

M32 = 0xFFFFFFFF
_PARITY = 0x1BD11BDA
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


# -- on the host: keys -----------------------------------------------------------------
def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & M32


def threefry_host(key: HostKey, count: HostKey) -> HostKey:
    """One Threefry-2x32 block with Python ints (20 rounds).

    Examples:
        >>> threefry_host((0, 0), (0, 0))   # the reference test vector
        (1797259609, 2579123966)
    """
    k0, k1 = key
    ks = (k0, k1, k0 ^ k1 ^ _PARITY)
    x0, x1 = (count[0] + k0) & M32, (count[1] + k1) & M32
    for group in range(5):
        for r in _ROTATIONS[group % 2]:
            x0 = (x0 + x1) & M32
            x1 = _rotl(x1, r) ^ x0
        x0 = (x0 + ks[(group + 1) % 3]) & M32
        x1 = (x1 + ks[(group + 2) % 3] + group + 1) & M32
    return x0, x1


def fold_in(key: HostKey, n: int) -> HostKey:
    """``jax.random.fold_in(key, n)``: the key of the n-th draw of a stream.

    Examples:
        >>> fold_in((0, 42), 0) != fold_in((0, 42), 1)
        True
    """
    cpu = loaded()
    if cpu is not None:  # the kernel's block: the same words, without 20 rounds in Python
        return cpu.block(key[0], key[1], (n >> 32) & M32, n & M32)
    return threefry_host(key, ((n >> 32) & M32, n & M32))


def _signed(word: int) -> int:
    return word - (1 << 32) if word >= 1 << 31 else word


def key_tensor(key: HostKey, device: torch.device | str | None = None) -> torch.Tensor:
    """A key as an int32 tensor of two words on ``device`` (runtime data, not a constant)."""
    words = torch.tensor([_signed(key[0]), _signed(key[1])], dtype=torch.int32)
    return words if device is None else words.to(device)  # (the tensor itself on the CPU)


def unsigned(words: torch.Tensor) -> torch.Tensor:
    """int32 bit patterns as their uint32 values, in int64."""
    return words.to(torch.int64) & M32


# -- on tensors: the rounds ---------------------------------------------------------------
def shr(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int32 or int64 bit patterns by ``k`` (1 <= k < width).

    torch's ``>>`` is arithmetic: the copies of the sign bit it shifts in are
    masked off. torch_xla computes ``>>`` as a division, which rounds negative
    values towards zero, so there only non-negative values are shifted right
    and the sign bit is moved separately.
    """
    width = 8 * x.element_size()
    if not devices.row(x.device).shift_divides:
        return (x >> k) & ((1 << (width - k)) - 1)
    magnitude = (x & ((1 << (width - 1)) - 1)) >> k
    return magnitude | ((x < 0).to(x.dtype) << (width - 1 - k))


def _rotl_tensor(x: torch.Tensor, r: int) -> torch.Tensor:
    return (x << r) | shr(x, 32 - r)


def threefry2x32(key: torch.Tensor, x0: torch.Tensor, x1: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Threefry-2x32 (20 rounds) of int32 counter words ``x0``, ``x1`` under ``key`` (int32 [2])."""
    k0, k1 = key[0], key[1]
    ks = (k0, k1, k0 ^ k1 ^ _PARITY)
    x0 = x0 + k0
    x1 = x1 + k1
    for group in range(5):
        for r in _ROTATIONS[group % 2]:
            x0 = x0 + x1
            x1 = _rotl_tensor(x1, r) ^ x0
        x0 = x0 + ks[(group + 1) % 3]
        x1 = x1 + (ks[(group + 2) % 3] + (group + 1))
    return x0, x1


def fold_in_tensor(key: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """``fold_in`` with the key (int32 [2]) and n (an int64 0-d tensor) on a device."""
    hi = (n >> 32).to(torch.int32).reshape(1)
    lo = (n & M32).to(torch.int32).reshape(1)  # the low word's bit pattern (wraps to int32)
    y0, y1 = threefry2x32(key, hi, lo)
    return torch.cat([y0, y1])


def _counter_words(numel: int, device: torch.device, counters: torch.Tensor | None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    if counters is not None:
        flat = counters.reshape(-1)
        return (flat >> 32).to(torch.int32), (flat & M32).to(torch.int32)
    if numel < 1 << 31:
        lo = torch.arange(numel, dtype=torch.int32, device=device)
        return torch.zeros_like(lo), lo
    index = torch.arange(numel, dtype=torch.int64, device=device)
    return (index >> 32).to(torch.int32), (index & M32).to(torch.int32)


def chain(key: torch.Tensor, shape: tuple[int, ...], words: int,
          counters: torch.Tensor | None = None) -> torch.Tensor:
    """The generator as tensor ops on ``key``'s device: ``x0 ^ x1`` (words=1) or both
    words stacked (words=2). A whole draw where the device's row has a ``whole_draw``
    (XLA's prebuilt computation) comes from that instead."""
    row = devices.row(key.device)
    if row.whole_draw is not None and counters is None:
        whole_draw = load(row.whole_draw, what=f"devrng.portable on {row.name}", extra=row.extra)
        return whole_draw(key, shape, words)  # type: ignore[no-any-return]
    x0, x1 = threefry2x32(key, *_counter_words(math.prod(shape), key.device, counters))
    if words == 1:
        return (x0 ^ x1).reshape(shape)
    return torch.stack([x0, x1]).reshape(2, *shape)


def _cpu_counters(counters: torch.Tensor | None) -> torch.Tensor | None:
    return None if counters is None else counters.to(device="cpu",
                                                     dtype=torch.int64).contiguous()


def kernel_fill(key: HostKey, shape: tuple[int, ...], mode: int,
                counters: torch.Tensor | None, scale: float = 1.0, shift: float = 0.0,
                into: torch.Tensor | None = None) -> torch.Tensor | None:
    """The fused CPU kernel's output (in ``into``, a tensor on the source's device, where
    it is a plain contiguous tensor of the shape and dtype), or None where it cannot run
    (no compiler, or a FakeTensor without memory to fill)."""
    cpu = kernel()
    if cpu is None:
        return None
    if (into is not None and type(into) is torch.Tensor and mode != WORDS
            and into.dtype == DTYPES[mode] and tuple(into.shape) == shape
            and into.is_contiguous()):
        out = into
    else:
        # on the CPU whatever torch's default device (whose memory the kernel cannot fill)
        out = torch.empty((2, *shape) if mode == WORDS else shape, dtype=DTYPES[mode],
                          device="cpu")
    if type(out) is not torch.Tensor:
        return None
    if mode == WORDS:
        cpu.run(key, WORDS, out[0], out[1], counters=_cpu_counters(counters))
    else:
        cpu.run(key, mode, out, counters=_cpu_counters(counters), scale=scale, shift=shift)
    return out


def kernel_randint(key: HostKey, shape: tuple[int, ...], span: int, multiplier: int, low: int,
                   dtype: torch.dtype, counters: torch.Tensor | None) -> torch.Tensor | None:
    """``randint``'s int32-bounds case from the fused CPU kernel, or None (as ``kernel_fill``)."""
    cpu = kernel()
    if cpu is None:
        return None
    out = torch.empty(shape, dtype=dtype if dtype == torch.int32 else torch.int64, device="cpu")
    if type(out) is not torch.Tensor:
        return None
    cpu.randint((fold_in(key, 0), fold_in(key, 1)), span, multiplier, low, out,
                counters=_cpu_counters(counters))
    return out if out.dtype == dtype else out.to(dtype)


# -- the generator as ops that torch.compile keeps opaque ---------------------------------------
# Inductor took more than 5 minutes to compile the unrolled integer ops of one
# draw (docs/known-issues.md); as one op with a fake (shape-only) implementation it
# compiles in no time and runs the fused CPU kernel, or the tensor ops on other devices
# (on XLA they become part of the XLA graph).
def host_key(key: torch.Tensor) -> HostKey:
    """A key tensor (int32 [2]) as its host words."""
    hi, lo = key.tolist()
    return hi & M32, lo & M32


def _bits_now(key: torch.Tensor, shape: Sequence[int], words: int) -> torch.Tensor:
    # Where the device's row has the fused kernel, from the key's host ints.
    shape = tuple(shape)
    if devices.row(key.device).host_memory:
        out = kernel_fill(host_key(key), shape, WORDS if words == 2 else BITS, None)
        if out is not None:
            return out
    return chain(key, shape, words)


def _bits_fake(key: torch.Tensor, shape: Sequence[int], words: int) -> torch.Tensor:
    return key.new_empty((2, *shape) if words == 2 else tuple(shape))


def _next_key_cpu(state: torch.Tensor, device: torch.device) -> torch.Tensor:
    hi, lo, n = state.tolist()
    state[2] += 1
    return key_tensor(fold_in((hi, lo), n), device)


def _next_key_fake(state: torch.Tensor, device: torch.device) -> torch.Tensor:
    return torch.empty(2, dtype=torch.int32, device=device)


def next_key(state: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The key of the stream's next op, from and advancing ``state`` (CPU int64
    ``[seed >> 32, seed & M32, counter]``), inside a compiled graph."""
    return torch.ops.devrng.next_key(state, device)  # type: ignore[no-any-return]


def _define_ops() -> None:
    if hasattr(torch.ops.devrng, "bits"):  # defined once per process
        return
    torch.library.define("devrng::bits", "(Tensor key, SymInt[] shape, int words) -> Tensor")
    # One implementation for every device: it reads the device's row itself.
    torch.library.impl("devrng::bits", "CompositeExplicitAutograd")(_bits_now)
    torch.library.register_fake("devrng::bits")(_bits_fake)
    torch.library.define("devrng::next_key", "(Tensor(a!) state, Device device) -> Tensor")
    torch.library.impl("devrng::next_key", "CPU")(_next_key_cpu)
    torch.library.register_fake("devrng::next_key")(_next_key_fake)


_define_ops()
