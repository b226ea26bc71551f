"""torch's own refusals of random ops' arguments, as ``devrng.portable``'s handlers
(``devrng._portable.ops``) make them before they draw.

Inside portable an op refuses what torch refuses: a ``DevRNGError`` where torch raises
a RuntimeError (or NotImplementedError: a dtype its kernels do not take), torch's own
type otherwise. Without these, out-of-range bounds wrapped, dtypes changed silently,
and overflowing bounds raised errors from deep inside the draw.
"""

from __future__ import annotations

import functools
import math
import operator
from typing import Any

import torch

from devrng._base.errors import DevRNGError, short_repr
from devrng._portable import devices, distributions

__all__ = ["BARE_UNSIGNED", "as_int", "check_bernoulli_dtype", "check_dropout_p", "check_fits",
           "check_in_place", "check_layout", "check_p", "check_std", "check_uniform_bounds",
           "float_dtype", "random_bounds", "readable", "representable", "whole_range"]

Kwargs = dict[str, Any]
_MANTISSA_BITS = {torch.float16: 11, torch.bfloat16: 8, torch.float32: 24, torch.float64: 53}
# Integer dtypes torch's random kernels leave out (no random_() over their range, no randperm,
# no bernoulli; randint and random_(from, to) do take them).
BARE_UNSIGNED = {getattr(torch, n) for n in ("uint16", "uint32", "uint64") if hasattr(torch, n)}
_INT64 = (-(1 << 63), (1 << 63) - 1)


def check_layout(kwargs: Kwargs, name: str) -> None:
    """A factory's ``layout=`` and ``names=``: portable draws dense, unnamed tensors."""
    layout = kwargs.get("layout")
    if layout is not None and layout != torch.strided:
        raise DevRNGError(f"devrng.portable draws dense tensors; {name} got layout={layout}.")
    if kwargs.get("names") is not None:
        raise DevRNGError(f"devrng.portable does not draw named tensors; {name} got names=.")


def float_dtype(dtype: torch.dtype | None, name: str, complex_ok: bool = True,
                empty: bool = False) -> torch.dtype:
    """``dtype`` (the default one for None), refused unless floating-point (or complex); not
    checked for an ``empty`` draw of the ops where torch does not check it there either."""
    dtype = dtype or torch.get_default_dtype()
    if empty:
        return dtype
    if not (dtype.is_floating_point or (complex_ok and dtype.is_complex)):
        kinds = "floating-point or complex" if complex_ok else "floating-point"
        raise DevRNGError(f"{name} draws {kinds} numbers; it got dtype={dtype}.")
    return dtype


@functools.cache
def representable(dtype: torch.dtype) -> tuple[float, float]:
    """The lowest and the largest finite value of a real dtype (bool: 0 and 1)."""
    if dtype == torch.bool:
        return 0, 1
    info = torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)
    return info.min, info.max


def _check_range(low: int, high: int, name: str) -> None:
    """Integers in [low, high): low < high."""
    if not low < high:
        raise DevRNGError(f"{name} needs low < high (integers in [low, high)), not low={low}, "
                          f"high={high}.")


def random_bounds(low: int, high: int, dtype: torch.dtype, name: str) -> tuple[int, int]:
    """torch's integers in [low, high) drawn into ``dtype``: refused unless low < high and low
    and high - 1 are values of it. For a floating-point dtype torch first moves a bound
    whose neighbour rounds past it (``update_from`` / ``update_to`` in its
    DistributionTemplates.h): the bounds drawn between, returned."""
    _check_range(low, high, name)
    if dtype.is_complex:
        raise DevRNGError(f"{name} draws integers into integral, floating-point or bool "
                          f"tensors, not {dtype} ones.")
    if dtype.is_floating_point:
        digits = _MANTISSA_BITS[dtype]
        after = _through(low + 1, dtype)
        if after < low:
            low = after + (1 << (abs(low + 1).bit_length() - digits))
        before = _through(high - 1, dtype)
        if before >= high:
            high = before - (1 << (abs(high - 1).bit_length() - digits))
        if not low < high:
            raise DevRNGError(f"{name} needs low < high once both are moved to {dtype} "
                              f"numbers (as torch moves them), not low={low}, high={high}.")
    lowest, largest = representable(dtype)
    if low < lowest or high - 1 > largest:
        raise DevRNGError(f"{name} draws integers in [low, high) that {dtype} holds "
                          f"([{lowest}, {largest}]); low={low}, high={high} go beyond: they "
                          f"would not be the numbers drawn.")
    return low, high


def _through(n: int, dtype: torch.dtype) -> int:
    """The integer ``n`` converted to ``dtype`` and back, as torch's C++ does: rounded to
    nearest, ties to even (float16 and bfloat16 through float32)."""
    for digits in ((24, _MANTISSA_BITS[dtype]) if dtype in (torch.float16, torch.bfloat16)
                   else (_MANTISSA_BITS[dtype],)):
        extra = abs(n).bit_length() - digits
        if extra > 0:
            quotient, rest = divmod(abs(n), 1 << extra)
            half = 1 << (extra - 1)
            quotient += rest > half or (rest == half and quotient % 2 == 1)
            n = (quotient << extra) * (1 if n >= 0 else -1)
    return n


def check_uniform_bounds(low: float, high: float, dtype: torch.dtype, name: str) -> None:
    """torch's rules for uniforms on [low, high) of ``dtype``: both bounds are finite values
    of it, low <= high, and high - low is no larger than its largest value."""
    lowest, largest = representable(distributions.COMPLEX_PARTS.get(dtype, dtype))
    if not (lowest <= low <= largest and lowest <= high <= largest):
        raise DevRNGError(f"{name} draws between bounds that are finite {dtype} values "
                          f"([{lowest}, {largest}]), not from={low}, to={high}.")
    if not low <= high:
        raise DevRNGError(f"{name} needs from <= to, not from={low}, to={high}.")
    if high - low > largest:
        raise DevRNGError(f"{name} needs to - from <= {largest} (the largest {dtype}), not "
                          f"from={low}, to={high}.")


def check_in_place(self: torch.Tensor, name: str) -> None:
    """An in-place draw into a leaf that requires grad, refused (torch's own error)."""
    if self.requires_grad and self.is_leaf and torch.is_grad_enabled():
        raise RuntimeError(f"a leaf Variable that requires grad is being used in an in-place "
                           f"operation ({name}).")


def as_int(value: Any, name: str) -> int:
    """An int argument as torch's bindings take it: an int or anything with ``__index__``
    (a 0-d integer tensor, a NumPy integer), not a float."""
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, not {short_repr(value)}.") from None
    if not _INT64[0] <= value <= _INT64[1]:
        raise _OutOfInt64(f"{name} must fit in int64 (as torch's do), not {value}.")
    return value  # type: ignore[no-any-return]


class _OutOfInt64(DevRNGError, ValueError):
    """An integer argument past int64: torch raised a RuntimeError for it up to 2.8 or so and
    a ValueError since; either ``except`` catches this one."""


def readable(t: torch.Tensor) -> bool:
    """Whether checking ``t``'s values is free: on the CPU, and not inside a trace (where
    a value check would be a graph break); other devices would have to wait for them."""
    return devices.row(t.device).host_memory and not torch.compiler.is_compiling()


def check_std(std: Any) -> None:
    """normal's standard deviation: real and >= 0 (a tensor's values where ``readable``)."""
    if isinstance(std, torch.Tensor):
        if std.dtype.is_complex:
            raise DevRNGError(f"normal takes a real standard deviation, not a {std.dtype} one.")
        if readable(std) and not bool((std >= 0).all()):
            raise DevRNGError("normal needs std >= 0 everywhere; the std tensor has negative "
                              "or NaN values.")
    elif not std >= 0.0:
        raise DevRNGError(f"normal needs std >= 0, not std={std}.")


def check_fits(value: float, dtype: torch.dtype, what: str) -> None:
    """torch converts a number argument to the tensor's dtype, refusing what overflows it:
    float32 (not its infinities and NaN), and integral dtypes (NaN and infinities too);
    float16, bfloat16, float64 and bool take any."""
    if dtype == torch.float32:
        fits = not math.isfinite(value) or abs(value) <= torch.finfo(dtype).max
    elif dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
        fits = True
    else:
        info = torch.iinfo(dtype)
        fits = info.min <= value <= info.max
    if not fits:
        raise DevRNGError(f"{what}={value} does not fit in {dtype}, which the draws take.")


def whole_range(dtype: torch.dtype) -> int:
    """The end of random_()'s range without bounds: every integer ``dtype`` holds (exactly,
    for floating-point ones)."""
    if dtype.is_complex or dtype in BARE_UNSIGNED:
        raise DevRNGError(f"random_() draws over the range of integral, floating-point or bool "
                          f"dtypes up to 64 bits wide (as torch does), not {dtype}; pass from "
                          f"and to.")
    if dtype.is_floating_point:
        return (1 << _MANTISSA_BITS[dtype]) + 1
    return 2 if dtype == torch.bool else torch.iinfo(dtype).max + 1


def check_p(p: Any, name: str) -> None:
    """A probability (or a floating-point tensor of them, checked where ``readable``) in
    [0, 1]."""
    if isinstance(p, torch.Tensor):
        if not p.dtype.is_floating_point:
            raise DevRNGError(f"{name} takes probabilities as a floating-point tensor, not a "
                              f"{p.dtype} one.")
        if readable(p) and p.numel() and not bool(((p >= 0) & (p <= 1)).all()):
            raise DevRNGError(f"{name} needs probabilities in [0, 1]; the tensor has values "
                              "outside, or NaN.")
    elif not 0.0 <= p <= 1.0:
        raise DevRNGError(f"{name} needs a probability in [0, 1], not p={p}.")


def check_bernoulli_dtype(dtype: torch.dtype, name: str) -> None:
    """The dtypes torch draws bernoulli's 0 and 1 in."""
    if dtype.is_complex or dtype in BARE_UNSIGNED:
        raise DevRNGError(f"{name} draws 0 and 1 as floating-point, integral (up to uint8 "
                          f"unsigned) or bool numbers, as torch does, not {dtype} ones.")


def check_dropout_p(p: float, functional: bool) -> None:
    """torch.nn.functional's dropouts raise ValueError for p outside [0, 1] (their Python
    check); torch's kernels, which NaN reaches, raise a RuntimeError."""
    if functional and (p < 0.0 or p > 1.0):
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not 0.0 <= p <= 1.0:
        raise DevRNGError(f"dropout probability has to be between 0 and 1, but got {p}")
