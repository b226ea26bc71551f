"""The distributions on top of the Threefry bits (``devrng._portable.threefry``), as
``jax.random`` draws them.

``Source`` is where one op's numbers come from; the distributions follow ``jax.random``
where JAX has one (uniform, bits, bernoulli, randint, permutation, normal, exponential),
so that they equal it; multinomial is devrng's own (a fixed-order prefix sum, so every
device adds in the same order). Float16 and bfloat16 normal draws are the float32 draw
rounded (as torch draws them; JAX draws them from 10- and 7-bit uniforms).

On the CPU the fused kernel (``devrng._portable.threefry_cpu``) makes the common draws
in one pass, the same bits as the tensor ops here. In compiled code the draws with a
transcendental step (normal, exponential) and uniforms between bounds are one opaque
op, ``devrng::draw``, that runs this module's eager code: the compiler cannot
substitute its own ``log``, ``sqrt`` or ``erfinv`` (or fuse their arithmetic), so
compiled draws are eager's, bit for bit.
"""

from __future__ import annotations

import functools
import math
import struct
import sys
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any, NamedTuple

import torch

from devrng._base.errors import DevRNGError
from devrng._portable import devices
from devrng._portable.kernel_proof import jax_multiplier
from devrng._portable.threefry import (
    M32,
    HostKey,
    chain,
    fold_in,
    fold_in_tensor,
    host_key,
    kernel_fill,
    kernel_randint,
    key_tensor,
    shr,
    unsigned,
)
from devrng._portable.threefry_cpu import (
    BITS,
    EXPONENTIAL,
    HALF_MODES,
    NORMAL,
    NORMAL_AT,
    UNIFORM,
    UNIFORM64,
    UNIFORM64_AT,
    UNIFORM_AT,
    WORDS,
    kernel,
)

__all__ = ["COMPLEX_PARTS", "TORCH_OPS", "UNIT_BITS", "Ops", "Source", "affine", "bernoulli_mask",
           "bounds", "erfinv32", "exponential", "log32", "multinomial", "normal", "prefix_sums",
           "randint", "randperm", "round_to", "scale_shift", "search_right", "sqrt32",
           "sum_is_exact", "uniform", "unit"]


class Source:
    """Where one op's numbers come from: its key, the output device, and the counters.

    ``key`` is host ints (eager code: the fused kernel takes them as they are
    where the device's row has it, other devices get them as runtime data,
    ``devrng._portable.devices``) or an int32 [2] tensor already on ``device``
    (compiled code: then the draw is the opaque ``devrng::bits`` op, so that
    inductor does not compile the rounds). ``counters`` (an int64 tensor,
    optional) gives each element's index in the full draw, for one shard of
    it; without it element i is counter i of a draw of ``shape``.
    """

    __slots__ = ("counters", "device", "into", "key")

    def __init__(self, key: HostKey | torch.Tensor, device: torch.device,
                 counters: torch.Tensor | None = None) -> None:
        self.key = key
        self.device = device
        self.counters = counters
        # An in-place op's own tensor, which the fused kernel may fill instead of a new
        # one (set by ops' _fill where the draw reads no other tensor).
        self.into: torch.Tensor | None = None

    def fused(self, mode: int, shape: Sequence[int], scale: float = 1.0, shift: float = 0.0
              ) -> torch.Tensor | None:
        """The fused CPU kernel's draw in ``mode`` (``devrng._portable.threefry_cpu``), or None where
        it does not run (another device, a key in a compiled graph, no kernel)."""
        if isinstance(self.key, tuple) and devices.row(self.device).host_memory:
            return kernel_fill(self.key, tuple(shape), mode, self.counters, scale, shift,
                               self.into)
        return None

    def split(self, i: int) -> Source:
        """The source of ``jax.random.split(key)[i]`` (which is ``fold_in(key, i)``)."""
        if isinstance(self.key, tuple):
            return Source(fold_in(self.key, i), self.device, self.counters)
        n = torch.tensor(i, dtype=torch.int64, device=self.key.device)
        return Source(fold_in_tensor(self.key, n), self.device, self.counters)

    def _draw(self, shape: Sequence[int], words: int) -> torch.Tensor:
        shape = tuple(shape)
        out = self.fused(WORDS if words == 2 else BITS, shape)
        if out is not None:
            return out
        key = self.key
        if isinstance(key, tuple):
            key = key_tensor(key, self.device)
        elif self.counters is None:
            return torch.ops.devrng.bits(key, list(shape), words)  # type: ignore[no-any-return]
        return chain(key, shape, words, self.counters)

    def bits(self, shape: Sequence[int]) -> torch.Tensor:
        """32 random bits per element (int32 bit patterns): ``jax.random.bits(key, shape)``."""
        return self._draw(shape, 1)

    def words(self, shape: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Both words per element (64 random bits: x0 is the high half, as JAX's 64-bit bits)."""
        both = self._draw(shape, 2)
        return both[0], both[1]

    def unit_float32(self, shape: Sequence[int]) -> torch.Tensor:
        """float32 in [0, 1) from 23 of the bits, as ``jax.random.uniform``."""
        out = self.fused(UNIFORM, shape)
        if out is not None:
            return out
        return _scaled(shr(self.bits(shape), 9), 23, torch.float32)

    def _draw_op(self, distribution: str, shape: Sequence[int], dtype: torch.dtype,
                 params: Sequence[float]) -> torch.Tensor:
        """``_DISTRIBUTIONS[distribution]`` of this source: as the opaque ``devrng::draw``
        when the key is a tensor of a compiled graph, else directly."""
        if isinstance(self.key, torch.Tensor):
            return torch.ops.devrng.draw(  # type: ignore[no-any-return]
                self.key, list(shape), distribution, dtype, list(params), self.counters)
        return _DISTRIBUTIONS[distribution](self, shape, dtype, *params)

    # The distributions, as methods so that JAX's own (devrng._portable.jax) can stand in.
    def unit(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        return unit(self, shape, dtype)

    def uniform(self, shape: Sequence[int], dtype: torch.dtype, low: float = 0.0,
                high: float = 1.0) -> torch.Tensor:
        if low == 0.0 and high == 1.0:
            return self.unit(shape, dtype)
        return self._draw_op("uniform", shape, dtype, (low, high))

    def normal(self, shape: Sequence[int], dtype: torch.dtype, mean: float = 0.0,
               std: float = 1.0) -> torch.Tensor:
        return self._draw_op("normal", shape, dtype, (mean, std))

    def exponential(self, shape: Sequence[int], dtype: torch.dtype,
                    lambd: float = 1.0) -> torch.Tensor:
        return self._draw_op("exponential", shape, dtype, (lambd,))

    def bernoulli(self, shape: Sequence[int], p: float | torch.Tensor) -> torch.Tensor:
        return bernoulli_mask(self, shape, p)

    def randint(self, shape: Sequence[int], low: int, high: int,
                dtype: torch.dtype) -> torch.Tensor:
        return randint(self, shape, low, high, dtype)

    def randperm(self, n: int, dtype: torch.dtype) -> torch.Tensor:
        return randperm(self, n, dtype)

    def search(self, scan: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return search_right(scan, target)


# -- distributions ----------------------------------------------------------------------
# JAX sets the mantissa of 1.0 to the top random bits and subtracts 1: the result is
# k * 2**-mantissa_bits for the integer k those bits make. That is computed here as an
# exact integer-to-float conversion and scaling (no bit casts: torchax has none, and
# XLA's dynamo bridge mishandles them). dtype -> (random bits kept, shift, mantissa bits):
# JAX draws at least 8 bits, so bfloat16 (7 mantissa bits) keeps 8 and drops one.
_UNIT16 = {torch.float16: (0xFFFF, 6, 10), torch.bfloat16: (0xFF, 1, 7)}


def _scaled(k: torch.Tensor, mantissa_bits: int, dtype: torch.dtype) -> torch.Tensor:
    return k.to(dtype) * 2.0 ** -mantissa_bits


def unit(source: Source, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """Floats in [0, 1) of ``dtype``: ``jax.random.uniform(key, shape, dtype)``."""
    if dtype == torch.float32:
        return source.unit_float32(shape)
    if dtype == torch.float64:
        fused = source.fused(UNIFORM64, shape)
        if fused is not None:
            return fused
        hi, lo = source.words(shape)
        wide = (hi.to(torch.int64) << 32) | unsigned(lo)
        return _scaled(shr(wide, 12), 52, dtype)
    if dtype in _UNIT16:
        fused = source.fused(HALF_MODES["unit"][dtype], shape)
        if fused is not None:
            return fused
        keep, shift, mantissa_bits = _UNIT16[dtype]
        low = source.bits(shape) & keep  # JAX keeps the low bits of x0 ^ x1
        return _scaled(low >> shift, mantissa_bits, dtype)
    raise TypeError(f"devrng.portable draws floats of float16, bfloat16, float32 or float64, "
                    f"not {dtype}.")


def round_to(value: float, dtype: torch.dtype) -> float:
    """``value`` rounded to ``dtype`` (as JAX converts its bounds before any arithmetic).

    Plain Python, not a tensor op (dynamo takes its result as a constant of the graph:
    see ``devrng._portable.rng``).
    """
    if dtype == torch.float64:
        return float(value)
    try:
        if dtype == torch.bfloat16:  # the top half of float32, rounded to nearest even
            bits = struct.unpack("<I", struct.pack("<f", value))[0]
            bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
            return float(struct.unpack("<f", struct.pack("<I", bits & M32))[0])
        return float(struct.unpack(_PACK[dtype], struct.pack(_PACK[dtype], value))[0])
    except OverflowError:  # struct refuses what rounds beyond the largest finite value
        return math.copysign(math.inf, value)


_PACK = {torch.float32: "<f", torch.float16: "<e"}


def affine(x: torch.Tensor, scale: float | torch.Tensor, shift: float | torch.Tensor,
           dtype: torch.dtype) -> torch.Tensor:
    """``x * scale + shift`` in ``dtype``: the scaling of normal draws by a mean and a std.

    XLA and Triton turn ``a * b + c`` into one fused multiply-add (one
    rounding), torch's eager kernels round twice: 1 ulp apart on a third of
    the values. Computed in float64 and rounded to ``dtype``, a fused and an
    unfused sum differ by a float64 unit at most, which moves the rounded
    value only where it lies on a rounding boundary of ``dtype`` (a float32
    ``scale`` makes the product exact, and then nothing moves). MPS has no
    float64, and JAX (torchax) only with x64: there it is computed from float32 pieces
    (``_affine_pieces``), which round the same way except where the exact value lies within
    about 2**-48 of the larger term of a rounding boundary. (Uniforms between bounds are
    exact everywhere: ``scale_shift``.) A complex ``x`` is scaled part by part, as torch's
    ``normal`` does: a real ``shift`` is added to both parts, a complex one to each its own.
    """
    if dtype.is_complex:  # as torch: a number added to both parts, a complex tensor by part
        part = COMPLEX_PARTS[dtype]
        by_part = isinstance(shift, torch.Tensor) and shift.dtype.is_complex
        real, imag = (shift.real, shift.imag) if by_part else (shift, shift)
        return torch.complex(affine(x.real, scale, real, part), affine(x.imag, scale, imag, part))
    if dtype == torch.float64:
        return x * scale + shift
    if not devices.row(x.device).float64:
        return _affine_pieces(x, scale, shift, dtype)
    return (x.to(torch.float64) * scale + shift).to(dtype)


_SPLITTER = 4097.0  # 2**12 + 1: Veltkamp's split of a float32 into two halves of 12 bits


def _halves(v: float | torch.Tensor) -> tuple[Any, Any]:
    """``v`` (float32 values) as ``hi + lo`` exactly, each of at most 12 significant bits."""
    if isinstance(v, torch.Tensor):
        c = v * _SPLITTER
        top = c - (c - v)
        return top, v - top
    # The same steps on a number, each rounded to float32 as the tensor ops round them.
    wide = round_to(v * _SPLITTER, torch.float32)
    high = round_to(wide - round_to(wide - v, torch.float32), torch.float32)
    return high, v - high


def _pieces(v: float | torch.Tensor) -> tuple[Any, Any]:
    """``v`` as a float32 number or tensor and the float32 rest (0 for a tensor, whose
    values are float32 numbers already)."""
    if isinstance(v, torch.Tensor):
        return v.to(torch.float32), 0.0
    hi = round_to(v, torch.float32)
    return hi, round_to(v - hi, torch.float32)


def _affine_pieces(x: torch.Tensor, scale: float | torch.Tensor, shift: float | torch.Tensor,
                   dtype: torch.dtype) -> torch.Tensor:
    """``affine`` without float64: ``x * scale + shift`` from float32 pieces, rounded once.

    ``scale`` and ``shift`` are split into a float32 number and its float32 rest (48 bits of
    each); ``x * scale_hi`` is made exactly as two float32 numbers (Dekker's product of
    Veltkamp's halves: no fused multiply-add needed), its sum with ``shift_hi`` exactly by
    Knuth's two-sum, and the small terms are added to the error: the exact value within
    about 2**-48 of the larger term, rounded once to ``dtype``.
    """
    x = x.to(torch.float32)
    s_hi, s_lo = _pieces(scale)
    m_hi, m_lo = _pieces(shift)
    product = x * s_hi
    (x1, x0), (s1, s0) = _halves(x), _halves(s_hi)
    product_error = ((x1 * s1 - product) + x1 * s0 + x0 * s1) + x0 * s0
    total, error = _two_sum(product, m_hi)
    rest = error + (product_error + (x * s_lo + m_lo))
    if dtype == torch.float32:
        return total + rest  # type: ignore[no-any-return]
    total, error = _two_sum(total, rest)
    return _rounded_once(total, error, dtype, torch.float32, TORCH_OPS)  # type: ignore[no-any-return]


def bounds(low: float, high: float, dtype: torch.dtype, row: devices.Device = devices.CPU
           ) -> tuple[float, float]:
    """``(lo, span)`` of a uniform draw on ``[low, high)`` in ``dtype``, as JAX makes them:
    ``lo = dtype(low)``, ``span = dtype(dtype(high) - lo)`` (the difference of two ``dtype``
    numbers is rounded once: float64 has more than twice their precision). Refused: bounds
    whose span is not finite, and on a device that flushes subnormal numbers (``row``),
    bounds where some draw's exact value ``u * span + lo`` is a nonzero number below the
    dtype's smallest normal one (which the device would make 0)."""
    lo = round_to(low, dtype)
    span = round_to(round_to(high, dtype) - lo, dtype)
    name = str(dtype).removeprefix("torch.")
    if not (math.isfinite(lo) and math.isfinite(span)):
        raise DevRNGError(f"devrng.portable draws uniforms between finite bounds whose "
                          f"difference is a finite {name} number, not [{low!r}, {high!r}).")
    if row.flushes_subnormals and dtype != torch.float16 and _reaches_subnormals(lo, span, dtype):
        raise DevRNGError(
            f"{row.name} flushes {name} numbers below {torch.finfo(dtype).tiny:.3g} to zero, "
            f"and uniform draws on [{low!r}, {high!r}) can be such numbers (the smallest "
            f"nonzero one is about {float(_smallest_draw(lo, span, dtype)):.3g}): they would "
            f"differ from the CPU's. Draw on the CPU and move the result, or draw on a scaled "
            f"range and scale it back.")
    return lo, span


def _smallest_draw(lo: float, span: float, dtype: torch.dtype) -> Fraction:
    """The smallest nonzero ``|u * span + lo|`` over the unit draws u of ``dtype`` (exact;
    0 when every draw is 0)."""
    last = (1 << UNIT_BITS[dtype]) - 1
    step, start = Fraction(span) / (last + 1), Fraction(lo)
    if not step:
        return abs(start)
    turn = math.floor(-start / step)  # where the draws cross zero, if they do
    ks = {0, last} | {min(max(k, 0), last) for k in range(turn - 1, turn + 3)}
    return min((v for v in (abs(start + k * step) for k in ks) if v), default=Fraction(0))


def _reaches_subnormals(lo: float, span: float, dtype: torch.dtype) -> bool:
    """Whether some draw of ``u * span + lo`` is exactly a nonzero number below the smallest
    normal ``dtype`` number."""
    smallest = _smallest_draw(lo, span, dtype)
    return bool(smallest) and smallest < Fraction(torch.finfo(dtype).tiny)


def _quantum(lo: float, span: float, dtype: torch.dtype) -> Fraction:
    """A power of two that divides every value of a uniform draw's formula: ``lo``'s lowest
    bit, and the last bit of ``span``'s significand times ``2**-UNIT_BITS``."""
    exponent = math.frexp(span)[1]
    quantum = Fraction(2) ** (exponent - _SIGNIFICAND[dtype] - UNIT_BITS[dtype])
    return min(quantum, _lowest_bit(lo)) if lo else quantum


def uniform(source: Source, shape: Sequence[int], dtype: torch.dtype, low: float = 0.0,
            high: float = 1.0) -> torch.Tensor:
    """``jax.random.uniform(key, shape, dtype, low, high)``: ``u * span + lo`` rounded once
    (``scale_shift``), from the unit draw u of ``dtype``."""
    if low == 0.0 and high == 1.0:
        return source.unit(shape, dtype)  # u * 1 + 0, exactly
    row = devices.row(source.device)
    lo, span, mode = _planned(low, high, math.copysign(1.0, low), math.copysign(1.0, high),
                              dtype, row)
    if mode is not None:
        fused = source.fused(mode, shape, span, lo)
        if fused is not None:
            return fused
    return scale_shift(source.unit(shape, dtype), lo, span, dtype, row.float64,  # type: ignore[no-any-return]
                       flushes=row.flushes_subnormals)


@functools.lru_cache(maxsize=256)
def _planned(low: float, high: float, _low_sign: float, _high_sign: float, dtype: torch.dtype,
             row: devices.Device) -> tuple[float, float, int | None]:
    """``bounds`` and the kernel's mode (``_fused_uniform``) of a uniform draw, kept for the
    next draw on the same bounds (half the cost of a draw of a thousand numbers). The signs
    are in the key as ``0.0 == -0.0`` is not."""
    lo, span = bounds(low, high, dtype, row)
    return lo, span, _fused_uniform(lo, span, dtype, row.flushes_subnormals)


def _fused_uniform(lo: float, span: float, dtype: torch.dtype, flushes: bool) -> int | None:
    """The kernel's mode for ``u * span + lo`` in ``dtype`` (the same bits as ``scale_shift``),
    or None where only the tensor ops make it: float32 and the half types where every sum is
    exact in the wider type (the kernel rounds it once from there), float64 where no step
    needs rescaling (the kernel repeats ``_formula``'s steps)."""
    if dtype == torch.float32:
        return UNIFORM_AT if sum_is_exact(lo, span, dtype, torch.float64) else None
    if dtype == torch.float64:
        return UNIFORM64_AT if _plain64(lo, span, flushes) else None
    if dtype in _UNIT16 and span and sum_is_exact(lo, span, dtype, torch.float32):
        return HALF_MODES["uniform"][dtype]
    return None


@functools.lru_cache(maxsize=256)
def _plain64(lo: float, span: float, flushes: bool) -> bool:
    """Whether the float64 ``_formula`` runs on ``lo`` and ``span`` as they are: a span of 0 or
    a positive normal number, and no rescaling."""
    return (span == 0.0 or span >= sys.float_info.min) and not _rescaling(
        lo, span, torch.float64, True, flushes)


# -- u * span + lo, rounded once on every device ------------------------------------------------
# A bounded uniform is u * span + lo for the unit draw u = k * 2**-UNIT_BITS[dtype] (k an
# integer), rounded once to dtype: what one fused multiply-add gives, and what JAX computes
# (XLA fuses the multiply and the add). torch's eager kernels round the product and the sum
# separately; XLA, Triton and LLVM may fuse them or not, as they choose. So the formula is
# written with products that are exact -- then fusing changes nothing -- and additions whose
# rounding error is kept (two_sum), never with a rounded product:
# - float16 and bfloat16: in float32, where u * span is exact;
# - float32: in float64, where u * span is exact (devices without float64: as float64);
# - float64: u * span split exactly into two float64 numbers through integer arithmetic
#   (an error-free product without a fused multiply-add), then added to lo.
# Where a sum rounded twice could differ from the exact value rounded once -- only when the
# first rounding lands exactly on a midpoint of the second -- the kept error decides.
# Additions, comparisons and conversions only: torch_xla runs frexp and nextafter on the
# host, and its dynamo bridge mishandles bit casts.
# A complex number's parts (the real and the imaginary one).
COMPLEX_PARTS = {torch.complex32: torch.float16, torch.complex64: torch.float32,
                  torch.complex128: torch.float64}
UNIT_BITS = {torch.float16: 10, torch.bfloat16: 7, torch.float32: 23, torch.float64: 52}
_PRECISION = {torch.float32: 24, torch.float64: 53}  # significand bits
_SIGNIFICAND = {torch.float16: 11, torch.bfloat16: 8, **_PRECISION}
_MIN_EXPONENT = {torch.float32: -149, torch.float64: -1074}  # of the smallest subnormal
_MIN_NORMAL = {torch.float32: -126, torch.float64: -1022}  # of the smallest normal number


class Ops(NamedTuple):
    """The array functions ``scale_shift`` uses: torch's, or JAX's for torchax (whose torch
    ops compute float64 tensors in float32).

    Attributes:
        xp: ``torch`` or ``jax.numpy`` (for ``where``).
        cast: ``cast(x, dtype)``: ``x`` converted to a torch dtype (rounded to nearest).
    """

    xp: Any
    cast: Callable[[Any, torch.dtype], Any]


TORCH_OPS = Ops(torch, lambda x, dtype: x.to(dtype))


def scale_shift(u: Any, lo: float, span: float, dtype: torch.dtype, float64: bool,
                ops: Ops = TORCH_OPS, flushes: bool = False) -> Any:
    """``u * span + lo`` rounded once to ``dtype``, the same bits on every device and whether
    or not a compiler fuses multiplies and adds (see above). ``u`` is a unit draw of
    ``dtype`` (never negative), ``lo`` and ``span`` are ``dtype`` numbers (``bounds``),
    ``float64``: the device computes float64, ``flushes``: it flushes subnormal numbers.

    Where a step of the formula would make a number below the smallest one the working
    type keeps (its smallest subnormal, or normal where the device flushes), ``lo`` and
    ``span`` are first scaled by a power of two and the result scaled back: exact, for
    results that are 0 or normal numbers. Ranges whose draws need that and reach the
    subnormal numbers of ``dtype`` are refused.
    """
    scale = _rescaling(lo, span, dtype, float64, flushes)
    if not scale:
        return _formula(u, lo, span, dtype, float64, ops)
    if _reaches_subnormals(lo, span, dtype):
        name = str(dtype).removeprefix("torch.")
        raise DevRNGError(
            f"devrng.portable draws {name} uniforms on a range as narrow as {span!r} only "
            f"where no draw is a nonzero number below {torch.finfo(dtype).tiny:.3g} (a "
            f"subnormal {name} number), which its exact rounding does not reach there; the "
            f"draws on [{lo!r}, {lo + span!r}) do. Draw on a scaled range and scale it back.")
    scaled = _formula(u, lo * 2.0 ** scale, span * 2.0 ** scale, dtype, float64, ops)
    return scaled * 2.0 ** -scale  # exact: a power of two, and the results are normal or 0


def _rescaling(lo: float, span: float, dtype: torch.dtype, float64: bool, flushes: bool) -> int:
    """The power of two by which ``_formula`` needs ``lo`` and ``span`` scaled up (0: none):
    every number it makes is a multiple of ``_quantum``, which must not fall below what its
    working type keeps."""
    if not span:
        return 0
    work = (torch.float32 if dtype in (torch.float16, torch.bfloat16)
            else torch.float64 if float64 else dtype)
    floor = _MIN_NORMAL[work] if flushes else _MIN_EXPONENT[work]
    quantum = _quantum(lo, span, dtype)
    exponent = quantum.numerator.bit_length() - quantum.denominator.bit_length()  # a power of 2
    return max(0, floor - exponent)


def _formula(u: Any, lo: float, span: float, dtype: torch.dtype, float64: bool,
             ops: Ops) -> Any:
    """``scale_shift`` for ``lo`` and ``span`` whose every step stays in range."""
    if span == 0.0 or (dtype in _PRECISION and math.frexp(span)[0] == 0.5):
        return u * span + lo  # a power of two: the product is exact, the sum rounds once
    wide = (torch.float32 if dtype in (torch.float16, torch.bfloat16)
            else torch.float64 if dtype == torch.float32 and float64 else None)
    if wide is not None:  # the product is exact in wide; so is the sum, or its error decides
        product = ops.cast(u, wide) * span
        if sum_is_exact(lo, span, dtype, wide):
            return ops.cast(product + lo, dtype)
        return _rounded_once(*_two_sum(product, lo), dtype, wide, ops)
    high, low = _exact_product(u, span, dtype, ops)
    total, error = _two_sum(lo, high)
    return _sum_rounded_once(total, error, low, ops)


@functools.lru_cache(maxsize=256)
def sum_is_exact(lo: float, span: float, dtype: torch.dtype, wide: torch.dtype) -> bool:
    """Whether every ``u * span + lo`` (u a unit draw of ``dtype``) is a ``wide`` number: all
    of them are multiples of ``_quantum`` and no larger than ``|lo| + span``. Then rounding
    the sum to ``wide`` is exact."""
    quantum = _quantum(lo, span, dtype)
    largest = Fraction(abs(lo)) + Fraction(span)
    return quantum >= Fraction(2) ** _MIN_EXPONENT[wide] and (
        largest < (1 << _PRECISION[wide]) * quantum)


def _lowest_bit(x: float) -> Fraction:
    """The value of the lowest set bit of a nonzero float."""
    numerator, denominator = abs(x).as_integer_ratio()  # denominator: a power of two
    return Fraction(numerator & -numerator, denominator)


def _two_sum(a: Any, b: Any) -> tuple[Any, Any]:
    """``a + b`` rounded, and its rounding error exactly (Knuth's TwoSum: additions only)."""
    total = a + b
    b_part = total - a
    return total, (a - (total - b_part)) + (b - b_part)


def _rounded_once(total: Any, error: Any, dtype: torch.dtype, wide: torch.dtype,
                  ops: Ops) -> Any:
    """``total + error`` (``total`` a ``wide`` sum, ``error`` its exact rounding error)
    rounded once to the narrower ``dtype``. Rounding ``total`` can go wrong only where it is
    exactly halfway between two ``dtype`` numbers and ``error`` is not 0: then ``error``'s
    sign picks the neighbour. ``2 * total - rounded`` is the other one (exactly)."""
    rounded = ops.cast(total, dtype)
    back = ops.cast(rounded, wide)
    mirrored = total + (total - back)  # both steps exact: the neighbour across ``total``
    other = ops.cast(mirrored, dtype)
    halfway = (total != back) & (ops.cast(other, wide) == mirrored)
    beyond = (error != 0) & ((error > 0) == (total > back))
    return ops.xp.where(halfway & beyond, other, rounded)


def _sum_rounded_once(high: Any, middle: Any, low: Any, ops: Ops) -> Any:
    """``high + middle + low`` rounded once, for ``high = round(high + middle)`` (a two_sum)
    and ``low`` smaller than ``high``'s last bit: the smaller two are added first; their
    rounding error can change the result only where the sum is exactly halfway between two
    numbers, and then its sign picks the side."""
    small, small_error = _two_sum(middle, low)
    total, error = _two_sum(high, small)
    other = total + 2 * error  # the neighbour on error's side, if total + error is halfway
    halfway = (error != 0) & (other - total == 2 * error)
    beyond = (small_error != 0) & ((small_error > 0) == (error > 0))
    return ops.xp.where(halfway & beyond, other, total)


# (float dtype, its integer, bits of k's low part, bits of the span's low part): u * span
# as four products of halves, each exact in the float type.
_SPLITS = {torch.float64: (torch.int64, 26, 27), torch.float32: (torch.int32, 12, 12)}


def _exact_product(u: Any, span: float, dtype: torch.dtype, ops: Ops) -> tuple[Any, Any]:
    """``u * span`` as ``high + low`` exactly (``high`` the product rounded to ``dtype``),
    with integer arithmetic and no rounded product: u is ``k * 2**-m`` (k < 2**m), span is
    ``s * 2**a`` (s an integer of ``precision`` bits), and ``k * s = top * 2**m + bottom``."""
    integer, k_bits, s_bits = _SPLITS[dtype]
    precision, m = _PRECISION[dtype], UNIT_BITS[dtype]
    fraction, exponent = math.frexp(span)
    s, a = int(fraction * (1 << precision)), exponent - precision
    k = ops.cast(u * float(1 << m), integer)
    k1, k0 = k >> k_bits, k & ((1 << k_bits) - 1)
    s1, s0 = s >> s_bits, s & ((1 << s_bits) - 1)
    # k * s = k1*s1 * 2**(k_bits + s_bits) + (k1*s0 * 2**k_bits + k0*s1 * 2**s_bits) + k0*s0,
    # each product within the integer type; the middle is mid * 2**shift.
    shift = min(k_bits, s_bits)
    mid = k1 * (s0 << (k_bits - shift)) + k0 * (s1 << (s_bits - shift))
    rest = m - shift
    bottom = (mid & ((1 << rest) - 1)) * (1 << shift) + k0 * s0
    top = k1 * (s1 << (k_bits + s_bits - m)) + (mid >> rest) + (bottom >> m)
    bottom = bottom & ((1 << m) - 1)
    first = ops.cast(top, dtype) * 2.0 ** a  # both exact: integers below 2**precision
    second = ops.cast(bottom, dtype) * 2.0 ** (a - m)
    high = first + second  # Dekker's Fast2Sum (|first| >= |second|): exact error
    return high, second - (high - first)


# Giles, "Approximating the erfinv function" (GPU Computing Gems, 2011), single precision:
# a polynomial in w = -log(1 - x**2), one for w < 5 and one in sqrt(w) for the tails.
_ERFINV_CENTRAL = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06,
                   2.1858087e-04, -1.25372503e-03, -4.17768164e-03, 2.46640727e-01,
                   1.50140941e00)
_ERFINV_TAIL = (-2.00214257e-04, 1.00950558e-04, 1.34934322e-03, -3.67342844e-03,
                5.73950773e-03, -7.6224613e-03, 9.43887047e-03, 1.00167406e00, 2.83297682e00)


def _horner(coefficients: Sequence[float], w: torch.Tensor) -> torch.Tensor:
    p = torch.full_like(w, coefficients[0])
    for c in coefficients[1:]:
        p = p * w + c
    return p


_LN2 = 0.6931471805599453
_SQRT_HALF = 0.7071067690849304  # sqrt(1/2) rounded to float32


def log32(t: torch.Tensor) -> torch.Tensor:
    """Natural log of positive, normal float32 values from +, -, *, / only.

    ``torch.log`` is each device's own library (MKL on the CPU in eager
    code, Sleef in inductor's, XLA's own): their last bits differ, so eager
    and compiled draws would too. Here ``t = m * 2**e`` is split exactly by
    ``frexp``, m moved into [sqrt(1/2), sqrt(2)), and ``log(m) = 2 atanh(s)`` with
    ``s = (m - 1) / (m + 1)`` is a short odd series: every step is an IEEE
    operation with one correctly rounded result. About 1 ulp from the true log.
    """
    m, exponent = torch.frexp(t)  # exact: t = m * 2**exponent, m in [0.5, 1)
    small = m < _SQRT_HALF
    m = torch.where(small, m * 2.0, m)
    exponent = exponent - small.to(exponent.dtype)
    s = (m - 1.0) / (m + 1.0)
    z = s * s
    series = _horner((2.0 / 9, 2.0 / 7, 2.0 / 5, 2.0 / 3, 2.0), z)
    return s * series + exponent.to(torch.float32) * _LN2


def sqrt32(w: torch.Tensor) -> torch.Tensor:
    """The correctly rounded square root of non-negative float32 values, from the device's
    ``torch.sqrt``, which need not be (torch's eager CPU kernel, MKL's, is 1 ulp off for
    about one value in five): a neighbour of the device's root replaces it where ``w``
    lies beyond the midpoint between them. Each midpoint has 25 significant bits, so its
    square is exact in float64; so is every comparison. Without float64 (MPS, JAX without
    x64) the device's root is kept: JAX's (XLA's) is correctly rounded."""
    r = torch.sqrt(w)
    if not devices.row(w.device).float64:
        return r
    wide = w.to(torch.float64)
    result = r
    for towards in (math.inf, 0.0):
        neighbour = torch.nextafter(r, torch.full_like(r, towards))
        mid = (r.to(torch.float64) + neighbour.to(torch.float64)) * 0.5
        beyond = wide > mid * mid if towards > 0 else wide < mid * mid
        result = torch.where(beyond, neighbour, result)
    return result


def erfinv32(x: torch.Tensor) -> torch.Tensor:
    """erfinv in float32 from one log, one square root and two polynomials (Giles'
    single-precision method), the same formula on every device: ``log32`` and ``sqrt32``
    are IEEE operations, each correctly rounded, so only a compiler's fused multiply-adds
    (XLA, Triton) move the last bits. (``torch.erfinv`` is a different method on each
    device: 87 ulp apart from XLA's near zero.) ``x`` is in (-1, 1)."""
    w = -log32((1.0 - x) * (1.0 + x))
    central = _horner(_ERFINV_CENTRAL, w - 2.5)
    tail = _horner(_ERFINV_TAIL, sqrt32(w) - 3.0)
    return torch.where(w < 5.0, central, tail) * x


def normal(source: Source, shape: Sequence[int], dtype: torch.dtype, mean: float = 0.0,
           std: float = 1.0) -> torch.Tensor:
    """``mean + std * z`` for a standard normal z (``affine``: rounded once); complex: each
    part ``mean + std * z_part``, as torch's ``normal_`` (its parts have std / sqrt(2))."""
    if mean == 0.0 and std == 1.0:
        return _standard_normal(source, shape, dtype)
    mode = NORMAL_AT if dtype == torch.float32 else HALF_MODES["normal_at"].get(dtype)
    if mode is not None:
        fused = source.fused(mode, shape, std, mean)
        if fused is not None:
            return fused
    return affine(_standard_normal(source, shape, dtype), std, mean, dtype)


def _standard_normal(source: Source, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """Standard normal, as ``jax.random.normal`` makes it: ``sqrt(2) * erfinv(u)`` with u
    uniform on (-1, 1). Float16 and bfloat16 take the float32 draw, rounded; float64 uses
    the device's ``torch.erfinv``; complex dtypes draw the real and imaginary parts from
    ``split(key)``'s two keys and divide them by sqrt(2), as JAX does."""
    if dtype.is_complex:
        real = COMPLEX_PARTS[dtype]
        root2 = round_to(math.sqrt(2.0), real)
        return torch.complex(_divided(_standard_normal(source.split(0), shape, real), root2),
                             _divided(_standard_normal(source.split(1), shape, real), root2))
    work = torch.float64 if dtype == torch.float64 else torch.float32
    if work == torch.float32:
        fused = source.fused(HALF_MODES["normal"].get(dtype, NORMAL), shape)
        if fused is not None:
            return fused if fused.dtype == dtype else fused.to(dtype)
    lo = -1.0 + torch.finfo(work).eps / 2  # nextafter(-1, 0): the next float towards 0
    u = source.uniform(shape, work, lo, 1.0)
    if work == torch.float64:  # in place on the draw's own tensor: 8 bytes a number
        return u.erfinv_().mul_(round_to(math.sqrt(2.0), work))
    return (erfinv32(u) * round_to(math.sqrt(2.0), work)).to(dtype)


def _divided(x: torch.Tensor, c: float) -> torch.Tensor:
    """``x / c``, correctly rounded: without float64 (JAX, whose float32 division by a number
    goes through its reciprocal: 1 ulp off for a third of them) the quotient is corrected by
    its exact remainder ``x - q * c`` (Dekker's product of Veltkamp's halves)."""
    q = x / c
    if x.dtype != torch.float32 or devices.row(x.device).float64:
        return q
    product = q * c
    (q1, q0), (c1, c0) = _halves(q), _halves(c)
    error = ((q1 * c1 - product) + q1 * c0 + q0 * c1) + q0 * c0
    return q + ((x - product) - error) / c  # type: ignore[no-any-return]


def exponential(source: Source, shape: Sequence[int], dtype: torch.dtype,
                lambd: float = 1.0) -> torch.Tensor:
    """``jax.random.exponential``'s ``-log1p(-u)``, divided by ``lambd``: as ``-log32(1 - u)``
    (``1 - u`` is exact for these u) in float32 math for float32 and narrower, the device's
    ``torch.log1p`` for float64."""
    if dtype == torch.float64:
        e = -torch.log1p(-source.uniform(shape, dtype))
    else:
        fused = source.fused(EXPONENTIAL, shape)
        e = -log32(1.0 - source.uniform(shape, torch.float32)) if fused is None else fused
    e = e if lambd == 1.0 else e / lambd
    return e.to(dtype)


# The draws devrng::draw makes in compiled code, by name: f(source, shape, dtype, *params).
_DISTRIBUTIONS: dict[str, Callable[..., torch.Tensor]] = {
    "normal": normal, "exponential": exponential, "uniform": uniform}


def bernoulli_mask(source: Source, shape: Sequence[int], p: float | torch.Tensor
                   ) -> torch.Tensor:
    """``jax.random.bernoulli(key, p, shape)``: ``uniform < p`` in float32 for a number ``p``
    (rounded to float32 first, as JAX converts it: XLA would compare a float32 draw with a
    Python number in float64, and keep the draws equal to float32(p) that the CPU and JAX
    drop), in ``p``'s dtype for a floating tensor."""
    if isinstance(p, torch.Tensor) and p.dtype.is_floating_point:
        return source.uniform(shape, p.dtype) < p
    return source.uniform(shape, torch.float32) < round_to(float(p), torch.float32)


def randint(source: Source, shape: Sequence[int], low: int, high: int,
            dtype: torch.dtype) -> torch.Tensor:
    """Integers in ``[low, high)``.

    For bounds within int32 this is ``jax.random.randint(key, shape, low,
    high, int32)``: two 32-bit draws (keys ``split(key)``) combined modulo
    the span (for spans above 2**16 JAX's uint32 arithmetic keeps only the
    second: bias below span / 2**32). Wider spans up to 2**63 take 63 bits modulo
    the span (bias below span / 2**63); wider ones all 64 bits modulo the span, as
    torch's CPU kernel does (the values below 2**64 - span come twice as often).
    """
    span = high - low
    if low >= -(1 << 31) and high <= 1 << 31 and span < 1 << 32:
        multiplier = jax_multiplier(span)
        if isinstance(source.key, tuple) and devices.row(source.device).host_memory:
            fused = kernel_randint(source.key, tuple(shape), span, multiplier, low, dtype,
                                   source.counters)
            if fused is not None:
                return fused
        higher = unsigned(source.split(0).bits(shape))
        lower = unsigned(source.split(1).bits(shape))
        # (higher % span) * multiplier mod 2**32, split so that no product leaves int64.
        a = higher % span
        product = (a * (multiplier & 0xFFFF) + (((a * (multiplier >> 16)) & 0xFFFF) << 16)) & M32
        offset = ((product + lower % span) & M32) % span
    elif span <= 1 << 64:
        hi, lo = source.words(shape)
        wide = ((hi.to(torch.int64) << 32) | unsigned(lo))  # 64 random bits
        if span <= 1 << 63:
            r = shr(wide, 1)  # 63 of them, never negative
            offset = r if span == 1 << 63 else r % span
        else:  # all 64 modulo the span, as torch's CPU kernel takes them: one subtraction
            # (unsigned order is the signed order of the bits with the top one flipped)
            below = (wide ^ -(1 << 63)) < span - (1 << 63)
            offset = torch.where(below, wide, wide - (span - (1 << 64)))  # wraps: mod 2**64
    else:
        raise ValueError(f"devrng.portable draws integers from ranges of at most 2**64 values; "
                         f"[{low}, {high}) has {span}.")
    return (offset + low).to(dtype)  # wraps into int64 as the true value does


def randperm(source: Source, n: int, dtype: torch.dtype) -> torch.Tensor:
    """``jax.random.permutation(key, n)``: stable sorts by random 32-bit keys, in enough
    rounds (``ceil(3 ln n / ln(2**32 - 1))``) that ties do not bias the result."""
    x = None  # arange(n), until the first round permutes it
    rounds = math.ceil(3 * math.log(max(1, n)) / math.log(M32))
    if rounds and isinstance(source.key, tuple) and source.counters is None \
            and devices.row(source.device).host_memory:
        cpu = kernel()  # the kernel's stable radix sorts of arange(n) by each round's keys
        if cpu is not None:
            key, keys = source.key, []
            for _ in range(rounds):  # (split(1)'s key sorts, split(0)'s goes on)
                keys.append(fold_in(key, 1))
                key = fold_in(key, 0)
            permuted = cpu.permute(keys, n)
            if permuted is not None:
                return permuted if dtype == torch.int64 else permuted.to(dtype)
    for _ in range(rounds):
        source, sub = source.split(0), source.split(1)
        # The unsigned order of the keys is the signed order of their bits with the top one
        # flipped: an int32 sort (half the memory of int64), the same stable order.
        order = torch.sort(sub.bits((n,)) ^ -(1 << 31), stable=True).indices
        x = order if x is None else x[order]
    if x is None:
        x = torch.arange(n, dtype=torch.int64, device=source.device)
    return x.to(dtype)


def prefix_sums(w: torch.Tensor) -> torch.Tensor:
    """Prefix sums of non-negative weights along the last dim, the same bits on every device.

    The sums are made in a fixed order (Hillis-Steele: log2 n passes of
    elementwise adds; ``torch.cumsum`` adds in each device's own order). Sums
    made along different trees can round a zero weight's sum below its
    neighbour's, so each zero weight takes the running maximum before it:
    the sums never decrease and a zero weight's interval is empty.
    """
    scan = _hillis_steele(w, torch.add)
    floor = torch.full_like(scan, -math.inf)
    return _hillis_steele(torch.where(w > 0, scan, floor), torch.maximum)


def _hillis_steele(x: torch.Tensor, combine: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
                   ) -> torch.Tensor:
    """Inclusive scan along the last dim in log2 n elementwise passes."""
    step = 1
    while step < x.shape[-1]:
        x = torch.cat([x[..., :step], combine(x[..., step:], x[..., :-step])], dim=-1)
        step *= 2
    return x


def search_right(scan: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """For each target (rows x k), how many of its row's prefix sums are <= it: the index
    of the interval it falls in."""
    return torch.searchsorted(scan, target, right=True)


def multinomial(source: Source, weights: torch.Tensor, num_samples: int,
                replacement: bool) -> torch.Tensor:
    """Indices drawn in proportion to ``weights`` (1-D, or 2-D: one row per draw).

    Each draw inverts the prefix sums: ``u * total`` is looked up in them. The
    sums are the same bits on every device and the lookup only compares, so
    the indices are too. Without replacement the draws are made one after
    another, each with the chosen weight set to zero (``num_samples`` passes);
    a row whose non-zero weights are all taken goes on with equal weights on the
    categories not taken yet (torch takes zero-weight ones then too).
    """
    rows = weights.reshape(-1, weights.shape[-1])
    work = rows.to(torch.float32) if rows.dtype in (torch.float16, torch.bfloat16) else rows
    last = work.shape[-1] - 1
    u = source.uniform((rows.shape[0], num_samples), work.dtype)
    if replacement:
        scan = prefix_sums(work)
        picked = source.search(scan, u * scan[:, -1:])
    else:
        columns = []
        left = torch.ones_like(work)  # 1 for the categories not taken yet
        for j in range(num_samples):
            exhausted = ~(work > 0).any(-1, keepdim=True)
            scan = prefix_sums(torch.where(exhausted, left, work))
            index = source.search(scan, u[:, j:j + 1] * scan[:, -1:]).clamp_max(last)
            columns.append(index)
            work = work.scatter(1, index, 0.0)
            left = left.scatter(1, index, 0.0)
        picked = torch.cat(columns, dim=1)
    return picked.clamp_max(last).reshape(*weights.shape[:-1], num_samples)


# -- the draws compiled code keeps opaque ----------------------------------------------------
# devrng::draw does for the draws with a transcendental step what devrng::bits does for
# the bits (devrng._portable.threefry), so that they run eager's code: inductor would
# compile its own sqrt and erfinv (91 of 2**18 float32 normal draws differed, 72,747
# float64 ones); and for uniforms between bounds, whose exact rounding is host
# arithmetic first.
def _draw_now(key: torch.Tensor, shape: Sequence[int], distribution: str, dtype: torch.dtype,
              params: Sequence[float], counters: torch.Tensor | None) -> torch.Tensor:
    # The module's function, not Source's method of the same name (which would call this
    # op again). Where the device's row has the fused kernel, from the key's host ints;
    # elsewhere the bits come from devrng::bits, run eagerly here.
    host = devices.row(key.device).host_memory
    source = Source(host_key(key) if host else key, key.device, counters)
    return _DISTRIBUTIONS[distribution](source, tuple(shape), dtype, *params)


def _draw_fake(key: torch.Tensor, shape: Sequence[int], distribution: str, dtype: torch.dtype,
               params: Sequence[float], counters: torch.Tensor | None) -> torch.Tensor:
    return key.new_empty(tuple(shape), dtype=dtype)


def _define_draw() -> None:
    if hasattr(torch.ops.devrng, "draw"):  # defined once per process
        return
    torch.library.define("devrng::draw", "(Tensor key, SymInt[] shape, str distribution, "
                         "ScalarType dtype, float[] params, Tensor? counters) -> Tensor")
    torch.library.impl("devrng::draw", "CompositeExplicitAutograd")(_draw_now)
    torch.library.register_fake("devrng::draw")(_draw_fake)


_define_draw()
