"""What ``devrng.portable`` does for each random op of torch: the table its mode reads.

Each covered function has an ``Op`` whose handler reads the call's arguments and
draws from the stream (``Stream``, the ``PortableRNG`` it runs in); each random function it does not
cover has an ``Uncovered``, refused under ``strict=True``. ``ENTRIES`` maps the
function to its entry. Every entry is also a module attribute named by
``entry_name(func)``: under ``torch.compile`` the mode looks entries up by name, a
constant to dynamo, instead of hashing the function into the table on every call.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from devrng._base.errors import DevRNGError
from devrng._base.lazy import imported, load
from devrng._portable import distributions
from devrng._portable.refusals import (
    BARE_UNSIGNED,
    as_int,
    check_bernoulli_dtype,
    check_dropout_p,
    check_fits,
    check_in_place,
    check_layout,
    check_p,
    check_std,
    check_uniform_bounds,
    float_dtype,
    random_bounds,
    readable,
    representable,
    whole_range,
)

__all__ = [
    "ENTRIES",
    "Args",
    "Kwargs",
    "Op",
    "Stream",
    "Uncovered",
    "aten_entry",
    "entry_name",
    "redispatch",
]

Args = tuple[Any, ...]
Kwargs = dict[str, Any]

# A torch with torch.overrides.redispatch_function (2.13 here; not 2.8 or 2.9) can run a
# Python-level torch function's body with a mode still active
# (its has_torch_function check skipped once): then random ops nested in any such
# function are covered. Older torch runs those bodies outside every mode, so the
# functions with random ops inside are in the tables below by name.
redispatch = getattr(torch.overrides, "redispatch_function", None)


class Stream(Protocol):
    """What an op draws through: the portable stream (``devrng.PortableRNG``), also a
    context manager that puts itself on torch's mode stack."""

    def source(self, device: torch.device, counters: torch.Tensor | None = None) -> Any: ...

    def refuse(self, name: str, why: str = "") -> None: ...

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: object) -> Any: ...


# -- reading arguments ----------------------------------------------------------------------
def _arg(args: Args, kwargs: Kwargs, index: int, name: str, default: Any = None) -> Any:
    if len(args) > index:
        return args[index]
    return kwargs.get(name, default)


def _size(args: Args, kwargs: Kwargs, start: int = 0) -> tuple[int, ...]:
    """The ``*size`` of a factory: ``(2, 3)``, ``((2, 3),)``, ``(torch.Size(...),)`` or ``size=``."""
    if "size" in kwargs:
        size = kwargs["size"]
    else:
        rest = args[start:]
        size = rest[0] if len(rest) == 1 and isinstance(rest[0], (tuple, list, torch.Size)) \
            else rest
    return tuple(size)


_CPU = torch.device("cpu")


def _device(value: Any) -> torch.device:
    if value is None:
        if torch.compiler.is_compiling():  # dynamo cannot call get_default_device
            return torch.empty(()).device
        # torch.get_default_device walks the torch function modes (a few microseconds a
        # draw): with none below the stream's own (popped while it handles a call) and no
        # set_default_device (which pushes one too), it is the CPU.
        if not torch._C._len_torch_function_stack() and getattr(
                torch._GLOBAL_DEVICE_CONTEXT, "device_context", None) is None:
            return _CPU
        return torch.get_default_device()
    return value if isinstance(value, torch.device) else torch.device(value)


def _finish_factory(values: torch.Tensor, kwargs: Kwargs) -> torch.Tensor:
    """Apply a factory's ``out=``, ``requires_grad=`` and ``pin_memory=``."""
    out = kwargs.get("out")
    if out is not None:
        with torch.no_grad():
            out.resize_(values.shape).copy_(values)
        return out  # type: ignore[no-any-return]
    if kwargs.get("pin_memory"):
        values = values.pin_memory()
    if kwargs.get("requires_grad"):
        values.requires_grad_(True)
    return values


def _is_dtensor(t: Any) -> bool:
    # The class name first: cheap, and dynamo reads it as a constant. Nothing can be a
    # DTensor unless torch.distributed.tensor was imported.
    if type(t).__name__ != "DTensor":
        return False
    module = imported("torch.distributed.tensor")
    return module is not None and isinstance(t, module.DTensor)


def _dtensor() -> Any:
    return load("devrng._portable.dtensor", what="devrng.portable on DTensors")


# An empty result takes its key of the stream, as every op does, and draws nothing: torch
# draws nothing there either, and checks no dtype for most of its random ops.
def _fill(rng: Stream, self: torch.Tensor,
          draw: Callable[[Any, tuple[int, ...]], torch.Tensor], *,
          into_self: bool = False) -> torch.Tensor:
    """``self`` filled in place with ``draw(source, shape)``, shard by shard for a DTensor.

    ``into_self``: the draw reads no tensor, so the CPU kernel may write it into
    ``self`` directly (``distributions.Source.into``) instead of into a new tensor that is
    then copied.
    """
    if _is_dtensor(self):
        return _dtensor().fill_(rng, self, draw)  # type: ignore[no-any-return]
    source = rng.source(self.device)
    if not self.numel():
        return self
    if into_self and type(source) is distributions.Source:
        source.into = self
    values = draw(source, tuple(self.shape))
    if values is self:  # written by the kernel: an in-place op all the same
        torch.autograd.graph.increment_version(self)
    else:
        with torch.no_grad():
            self.copy_(values)
    return self


def _like(rng: Stream, like: torch.Tensor,
          draw: Callable[[Any, tuple[int, ...]], torch.Tensor],
          dtype: torch.dtype | None = None) -> torch.Tensor:
    """A new tensor shaped like ``like`` from ``draw(source, shape)`` (a DTensor for a
    DTensor); ``dtype``: the draw's (``like``'s if None)."""
    if _is_dtensor(like):
        return _dtensor().new_like(rng, like, draw)  # type: ignore[no-any-return]
    return _new(rng, like.device, tuple(like.shape), dtype or like.dtype, draw)


def _new(rng: Stream, device: torch.device, shape: tuple[int, ...], dtype: torch.dtype,
         draw: Callable[[Any, tuple[int, ...]], torch.Tensor]) -> torch.Tensor:
    """A new tensor from ``draw(source, shape)``, drawn on ``device``."""
    source = rng.source(device)
    if math.prod(shape) == 0:
        return torch.empty(shape, dtype=dtype, device=device)
    return draw(source, shape)


# -- the covered ops --------------------------------------------------------------------------
class Op:
    """One covered torch function: ``run(rng, func, args, kwargs)`` answers it from the stream.

    ``generator_at`` is the position of a ``generator`` parameter that may be
    passed positionally (nn.init's), else it is keyword-only.
    """

    __slots__ = ("generator_at", "run")

    def __init__(self, run: Callable[[Stream, Any, Args, Kwargs], Any],
                 generator_at: int | None = None) -> None:
        self.run = run
        self.generator_at = generator_at

    def handle(self, rng: Stream, func: Any, types: Any, args: Args, kwargs: Kwargs
               ) -> Any:
        if self.explicit_generator(args, kwargs):
            return func(*args, **kwargs)  # the caller's own generator, untouched
        return self.run(rng, func, args, kwargs)

    def explicit_generator(self, args: Args, kwargs: Kwargs) -> bool:
        if kwargs.get("generator") is not None:
            return True
        at = self.generator_at
        return at is not None and len(args) > at and args[at] is not None


def _uniform_values(source: Any, shape: tuple[int, ...], dtype: torch.dtype, low: float = 0.0,
                    high: float = 1.0) -> torch.Tensor:
    """Uniforms on [low, high) of ``dtype``; complex: both parts, as torch.rand and uniform_ do."""
    if dtype.is_complex:
        both = source.uniform((2, *shape), distributions.COMPLEX_PARTS[dtype], low, high)
        return torch.complex(both[0], both[1])
    return source.uniform(shape, dtype, low, high)  # type: ignore[no-any-return]


_HALF = (torch.float16, torch.bfloat16)


def _rand(rng: Stream, func: Any, args: Args, kwargs: Kwargs) -> torch.Tensor:
    check_layout(kwargs, "rand")
    out = kwargs.get("out")
    dtype = float_dtype(kwargs.get("dtype") or (out.dtype if out is not None else None), "rand")
    device = _device(kwargs.get("device") if out is None else out.device)
    shape = _size(args, kwargs)
    values = _new(rng, device, shape, dtype, lambda s, shape: _uniform_values(s, shape, dtype))
    return _finish_factory(values, kwargs)


def _randn(rng: Stream, func: Any, args: Args, kwargs: Kwargs) -> torch.Tensor:
    check_layout(kwargs, "randn")
    out = kwargs.get("out")
    shape = _size(args, kwargs)
    dtype = float_dtype(kwargs.get("dtype") or (out.dtype if out is not None else None),
                        "randn", empty=math.prod(shape) == 0)
    device = _device(kwargs.get("device") if out is None else out.device)
    return _finish_factory(_new(rng, device, shape, dtype, lambda s, shape: s.normal(shape, dtype)),
                           kwargs)


def _like_options(like: torch.Tensor, kwargs: Kwargs, name: str) -> tuple[torch.dtype, Kwargs]:
    check_layout(kwargs, name)
    dtype = kwargs.get("dtype") or like.dtype
    if kwargs.get("device") is not None and _device(kwargs["device"]) != like.device:
        raise DevRNGError(f"devrng.portable draws {name} on the input's device; move the input "
                          f"to {kwargs['device']} first.")
    return dtype, kwargs


def _finish_like(values: torch.Tensor, like: torch.Tensor, kwargs: Kwargs) -> torch.Tensor:
    fmt = kwargs.get("memory_format", torch.preserve_format)
    if not _is_dtensor(values) and fmt != torch.contiguous_format:
        shaped = torch.empty_like(like, dtype=values.dtype, memory_format=fmt)
        if shaped.stride() != values.stride():
            values = shaped.copy_(values)
    if kwargs.get("requires_grad"):
        values.requires_grad_(True)
    return values


def _rand_like(rng: Stream, func: Any, args: Args, kwargs: Kwargs) -> torch.Tensor:
    like = args[0] if args else kwargs["input"]
    dtype, kwargs = _like_options(like, kwargs, "rand_like")
    dtype = float_dtype(dtype, "rand_like")
    values = _like(rng, like, lambda s, shape: _uniform_values(s, shape, dtype), dtype)
    return _finish_like(values, like, kwargs)


def _randn_like(rng: Stream, func: Any, args: Args, kwargs: Kwargs) -> torch.Tensor:
    like = args[0] if args else kwargs["input"]
    dtype, kwargs = _like_options(like, kwargs, "randn_like")
    dtype = float_dtype(dtype, "randn_like", empty=not like.numel())
    values = _like(rng, like, lambda s, shape: s.normal(shape, dtype), dtype)
    return _finish_like(values, like, kwargs)


def _randint(rng: Stream, func: Any, args: Args, kwargs: Kwargs) -> torch.Tensor:
    check_layout(kwargs, "randint")
    positional = list(args)
    size = kwargs["size"] if "size" in kwargs else positional.pop()
    high = as_int(kwargs["high"] if "high" in kwargs else positional.pop(), "randint's high")
    low = as_int(positional.pop() if positional else kwargs.get("low", 0), "randint's low")
    out = kwargs.get("out")
    dtype = kwargs.get("dtype") or (out.dtype if out is not None else torch.int64)
    low, high = random_bounds(low, high, dtype, "randint")
    device = _device(kwargs.get("device") if out is None else out.device)
    values = rng.source(device).randint(tuple(size), low, high, dtype)
    return _finish_factory(values, kwargs)


def _randint_like(rng: Stream, func: Any, args: Args, kwargs: Kwargs) -> torch.Tensor:
    like, *bounds = args
    if "high" in kwargs:
        bounds = [*bounds, kwargs["high"]]
    if len(bounds) == 1:
        bounds = [kwargs.get("low", 0), bounds[0]]
    low, high = as_int(bounds[0], "randint_like's low"), as_int(bounds[1], "randint_like's high")
    dtype, kwargs = _like_options(like, kwargs, "randint_like")
    low, high = random_bounds(low, high, dtype, "randint_like")
    values = _like(rng, like, lambda s, shape: s.randint(shape, low, high, dtype), dtype)
    return _finish_like(values, like, kwargs)


def _randperm(rng: Stream, func: Any, args: Args, kwargs: Kwargs) -> torch.Tensor:
    check_layout(kwargs, "randperm")
    n = as_int(args[0] if args else kwargs["n"], "randperm's n")
    if n < 0:
        raise DevRNGError(f"randperm needs n >= 0, not {n}.")
    out = kwargs.get("out")
    dtype = kwargs.get("dtype") or (out.dtype if out is not None else torch.int64)
    if dtype == torch.bool or dtype.is_complex or dtype in BARE_UNSIGNED:
        raise DevRNGError(f"randperm draws permutations as integral or floating-point numbers "
                          f"(as torch does), not {dtype} ones.")
    largest = 2049 if dtype == torch.float16 else representable(dtype)[1] + 1  # torch's limits
    if n > largest:
        raise DevRNGError(f"randperm({n}) holds 0 to {n - 1}, more than {dtype} can tell apart; "
                          f"draw it as a wider dtype.")
    device = _device(kwargs.get("device") if out is None else out.device)
    return _finish_factory(rng.source(device).randperm(n, dtype), kwargs)


def _uniform_(rng: Stream, func: Any, args: Args, kwargs: Kwargs) -> torch.Tensor:
    self = args[0]
    low = float(_arg(args, kwargs, 1, "from", 0.0))
    high = float(_arg(args, kwargs, 2, "to", 1.0))
    dtype = float_dtype(self.dtype, "uniform_")
    if self.numel() or not dtype.is_complex:  # torch checks nothing in an empty complex one
        check_uniform_bounds(low, high, dtype, "uniform_")
    check_in_place(self, "uniform_")
    return _fill(rng, self, lambda s, shape: _uniform_values(s, shape, dtype, low, high),
                 into_self=True)


def _normal_values(source: Any, shape: tuple[int, ...], dtype: torch.dtype, mean: Any,
                   std: Any) -> torch.Tensor:
    if not isinstance(std, torch.Tensor) and not isinstance(mean, torch.Tensor):
        return source.normal(shape, dtype, float(mean), float(std))  # type: ignore[no-any-return]
    return distributions.affine(source.normal(shape, dtype), std, mean, dtype)  # z * std + mean, rounded once


def _normal_(rng: Stream, func: Any, args: Args, kwargs: Kwargs) -> torch.Tensor:
    self = args[0]
    mean = float(_arg(args, kwargs, 1, "mean", 0.0))
    std = float(_arg(args, kwargs, 2, "std", 1.0))
    check_std(std)
    dtype = float_dtype(self.dtype, "normal_", empty=not self.numel())
    check_in_place(self, "normal_")
    return _fill(rng, self, lambda s, shape: _normal_values(s, shape, dtype, mean, std),
                 into_self=True)


def _normal(rng: Stream, func: Any, args: Args, kwargs: Kwargs) -> torch.Tensor:
    mean = _arg(args, kwargs, 0, "mean", 0.0)
    std = _arg(args, kwargs, 1, "std", 1.0)
    check_std(std)
    if isinstance(std, torch.Tensor) and not isinstance(mean, torch.Tensor):
        check_fits(float(mean), std.dtype, "normal's mean (for the std tensor)")
    tensors = [t for t in (mean, std) if isinstance(t, torch.Tensor)]
    if not tensors:  # normal(mean, std, size, ...): a factory
        check_layout(kwargs, "normal")
        shape = tuple(_arg(args, kwargs, 2, "size"))
        out = kwargs.get("out")
        dtype = float_dtype(kwargs.get("dtype") or (out.dtype if out is not None else None),
                            "normal", empty=math.prod(shape) == 0)
        device = _device(kwargs.get("device") if out is None else out.device)
        values = _new(rng, device, shape, dtype, lambda s, shape: _normal_values(
            s, shape, dtype, float(mean), float(std)))
        return _finish_factory(values, kwargs)
    shape = tuple(torch.broadcast_shapes(*(t.shape for t in tensors)))  # type: ignore[no-untyped-call]
    # torch's dtype: the mean's where it is a tensor (whatever the std's), else the std's
    dtype = float_dtype(tensors[0].dtype, "normal", empty=math.prod(shape) == 0)
    values = _new(rng, tensors[0].device, shape, dtype, lambda s, shape: _normal_values(
        s, shape, dtype, mean, std))
    return _finish_factory(values, {"out": kwargs.get("out")})


def _exponential_(rng: Stream, func: Any, args: Args, kwargs: Kwargs) -> torch.Tensor:
    self = args[0]
    lambd = float(_arg(args, kwargs, 1, "lambd", 1.0))
    if not lambd > 0:
        raise DevRNGError(f"exponential_ needs lambd > 0, not lambd={lambd}.")
    dtype = float_dtype(self.dtype, "exponential_", complex_ok=False, empty=not self.numel())
    check_in_place(self, "exponential_")
    return _fill(rng, self, lambda s, shape: s.exponential(shape, dtype, lambd), into_self=True)


def _random_(rng: Stream, func: Any, args: Args, kwargs: Kwargs) -> torch.Tensor:
    self = args[0]
    rest = list(args[1:])
    low = kwargs.get("from", 0)
    high = kwargs.get("to")
    if len(rest) == 1:
        high = rest[0]
    elif len(rest) == 2:
        low, high = rest
    if high is None and not self.numel():  # nothing to draw, no dtype to check
        check_in_place(self, "random_")
        return _fill(rng, self, lambda s, shape: self)
    if high is None:  # the dtype's whole range: torch's random_() without bounds
        low, high = 0, whole_range(self.dtype)
    else:
        low, high = as_int(low, "random_'s from"), as_int(high, "random_'s to")
    low, high = random_bounds(low, high, self.dtype, "random_")
    check_in_place(self, "random_")
    return _fill(rng, self, lambda s, shape: s.randint(shape, low, high, torch.int64))


def _bernoulli_values(source: Any, shape: tuple[int, ...], p: Any, dtype: torch.dtype
                      ) -> torch.Tensor:
    return source.bernoulli(shape, p).to(dtype)  # type: ignore[no-any-return]


def _bernoulli(rng: Stream, func: Any, args: Args, kwargs: Kwargs) -> torch.Tensor:
    """``torch.bernoulli(input)`` (input holds the probabilities), ``torch.bernoulli(input, p)``,
    and the methods ``x.bernoulli()`` / ``x.bernoulli(p)``."""
    like = args[0] if args else kwargs["input"]
    p = _arg(args, kwargs, 1, "p", None)
    probs = like if p is None else p
    if not isinstance(probs, torch.Tensor):
        probs = float(probs)
    dtype = like.dtype
    if like.numel():  # torch checks no dtype where it draws nothing
        check_p(probs, "bernoulli")
        check_bernoulli_dtype(dtype, "bernoulli")
    elif not isinstance(probs, torch.Tensor):
        check_p(probs, "bernoulli")
    values = _like(rng, like, lambda s, shape: _bernoulli_values(
        s, shape, _local(probs), dtype))
    return _finish_factory(values, {"out": kwargs.get("out")})


def _fits(shape: torch.Size, target: torch.Size) -> bool:
    """Whether ``shape`` broadcasts to ``target`` without growing it."""
    try:
        return tuple(torch.broadcast_shapes(shape, target)) == tuple(target)  # type: ignore[no-untyped-call]
    except RuntimeError:
        return False


def _local(p: Any) -> Any:
    return p.to_local() if _is_dtensor(p) else p


def _bernoulli_(rng: Stream, func: Any, args: Args, kwargs: Kwargs) -> torch.Tensor:
    self = args[0]
    p = _arg(args, kwargs, 1, "p", 0.5)
    if not isinstance(p, torch.Tensor):
        p = float(p)
    dtype = self.dtype
    if self.numel():  # torch checks no dtype where it draws nothing
        check_p(p, "bernoulli_")
        check_bernoulli_dtype(dtype, "bernoulli_")
    elif not isinstance(p, torch.Tensor):
        check_p(p, "bernoulli_")
    if isinstance(p, torch.Tensor) and not _fits(p.shape, self.shape):
        raise DevRNGError(f"bernoulli_ takes probabilities of a shape that broadcasts to the "
                          f"tensor's {tuple(self.shape)}, not {tuple(p.shape)}.")
    check_in_place(self, "bernoulli_")
    return _fill(rng, self, lambda s, shape: _bernoulli_values(s, shape, _local(p), dtype))


def _multinomial(rng: Stream, func: Any, args: Args, kwargs: Kwargs) -> torch.Tensor:
    weights = args[0] if args else kwargs["input"]
    num_samples = as_int(_arg(args, kwargs, 1, "num_samples"), "multinomial's num_samples")
    replacement = bool(_arg(args, kwargs, 2, "replacement", False))
    if _is_dtensor(weights):
        raise DevRNGError("devrng.portable does not draw multinomial on a DTensor; call it on "
                          "dtensor.full_tensor().")
    if weights.dim() not in (1, 2) or not weights.dtype.is_floating_point:
        raise DevRNGError(f"multinomial takes a 1-D or 2-D floating-point tensor of weights, "
                          f"not a {weights.dtype} tensor of shape {tuple(weights.shape)}.")
    categories = weights.shape[-1]
    if num_samples <= 0 or (not replacement and num_samples > categories):
        raise DevRNGError(f"multinomial cannot draw num_samples={num_samples} from "
                          f"{categories} categories{' without replacement' * (not replacement)}.")
    if readable(weights):  # what torch checks on the CPU
        if not bool(torch.isfinite(weights).all()) or bool((weights < 0).any()):
            raise DevRNGError("multinomial needs finite, non-negative weights.")
        rows = weights.reshape(-1, categories)
        if bool((rows.sum(-1) <= 0).any()):
            raise DevRNGError("multinomial needs weights that sum to more than 0 in every row.")
    picked = distributions.multinomial(rng.source(weights.device), weights, num_samples, replacement)
    return _finish_factory(picked, {"out": kwargs.get("out")})


# -- dropout ------------------------------------------------------------------------------------
_SELU_ALPHA = 1.7580993408473766  # -scale * alpha of SELU: what alpha dropout sets dropped units to


def _dropout_core(rng: Stream, x: torch.Tensor, p: float, *, feature: bool, alpha: bool,
                  inplace: bool) -> torch.Tensor:
    """torch's dropout formulas with a portable mask: ``x * mask / (1 - p)``; alpha dropout
    keeps the mean and variance of SELU activations. ``feature`` drops whole channels."""
    if p == 1.0:
        zero = torch.zeros((), dtype=x.dtype, device=x.device)
        return x.mul_(zero) if inplace else x * zero
    if not x.dtype.is_floating_point:  # torch's noise / (1 - p) cannot be cast back
        if not x.numel():
            return x
        raise DevRNGError(f"dropout with 0 < p < 1 scales the kept values by 1 / (1 - p): it "
                          f"takes floating-point tensors (as torch's does), not {x.dtype} ones.")
    if feature:
        if x.dim() < 2:
            raise DevRNGError("Feature dropout needs an input of at least 2 dimensions (batch "
                              f"and channel); it got shape {tuple(x.shape)}.")
        noise_shape = (*x.shape[:2], *([1] * (x.dim() - 2)))
    else:
        noise_shape = tuple(x.shape)
    keep = 1.0 - p
    # float16 and bfloat16 are scaled in float32 and rounded once: XLA keeps intermediates
    # of these types in float32 anyway (excess precision), and torchax makes float32 of a
    # half tensor times a Python number; written so, every device rounds the same way.
    work = torch.float32 if x.dtype in _HALF else x.dtype

    def draw(source: Any, shape: tuple[int, ...]) -> torch.Tensor:
        return source.bernoulli(shape, keep).to(work)  # type: ignore[no-any-return]

    if _is_dtensor(x):
        noise = _dtensor().noise_like(rng, x, noise_shape, draw)
    else:
        noise = draw(rng.source(x.device), noise_shape)
    if alpha:
        a = 1.0 / math.sqrt((_SELU_ALPHA ** 2 * p + 1) * (1 - p))
        b = (noise - 1) * (_SELU_ALPHA * a) + _SELU_ALPHA * a * p
        noise = noise * a
        if work == x.dtype:
            return x.mul_(noise).add_(b) if inplace else x * noise + b
        out = (x.to(work) * noise + b).to(x.dtype)
    else:
        noise = noise / keep
        if work == x.dtype:
            return x.mul_(noise) if inplace else x * noise
        out = (x.to(work) * noise).to(x.dtype)
    return x.copy_(out) if inplace else out


def _dropout_fn(*, feature: bool, alpha: bool, inplace: bool | None = None,
                default_training: bool = True
                ) -> Callable[[Stream, Any, Args, Kwargs], torch.Tensor]:
    """A handler for F.dropout-style functions ``(input, p, training, inplace)`` (``inplace``
    given: torch's ``(input, p, train)`` builtins, whose name says in-place or not)."""
    def run(rng: Stream, func: Any, args: Args, kwargs: Kwargs) -> torch.Tensor:
        x = args[0] if args else kwargs["input"]
        p = float(_arg(args, kwargs, 1, "p", 0.5))
        training = bool(_arg(args, kwargs, 2, "train" if inplace is not None else "training",
                             default_training))
        in_place = inplace if inplace is not None else bool(_arg(args, kwargs, 3, "inplace",
                                                                  False))
        check_dropout_p(p, functional=inplace is None)
        if not training or p == 0.0:
            return x  # type: ignore[no-any-return]
        return _dropout_core(rng, x, p, feature=feature, alpha=alpha, inplace=in_place)

    return run


def _dropout_nd(n: int) -> Callable[[Stream, Any, Args, Kwargs], torch.Tensor]:
    """F.dropout1d / 2d / 3d: channel dropout with torch's rules for unbatched input."""
    batched_dims = n + 2

    def run(rng: Stream, func: Any, args: Args, kwargs: Kwargs) -> torch.Tensor:
        x = args[0] if args else kwargs["input"]
        p = float(_arg(args, kwargs, 1, "p", 0.5))
        training = bool(_arg(args, kwargs, 2, "training", True))
        inplace = bool(_arg(args, kwargs, 3, "inplace", False))
        check_dropout_p(p, functional=True)
        dims = x.dim()
        if n == 1 and dims not in (2, 3):
            raise RuntimeError(f"dropout1d: Expected 2D or 3D input, but received a {dims}D "
                               "input.")
        if n != 1 and dims not in (batched_dims - 1, batched_dims):
            warnings.warn(f"dropout{n}d: Received a {dims}-D input, which is deprecated; use "
                          "dropout for inputs of other shapes.", UserWarning, stacklevel=5)
        # torch's dropout2d reads a 3-D input as (N, C, L); 1d and 3d add a batch dim.
        unbatched = n != 2 and dims == batched_dims - 1
        if not training or p == 0.0:
            return x  # type: ignore[no-any-return]
        y = x.unsqueeze(0) if unbatched else x
        out = _dropout_core(rng, y, p, feature=True, alpha=False, inplace=inplace)
        if unbatched:
            out = out.squeeze(0)
            if inplace:
                return x  # type: ignore[no-any-return]
        return out

    return run


def _native_dropout(rng: Stream, func: Any, args: Args, kwargs: Kwargs
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    x = args[0] if args else kwargs["input"]
    p = float(_arg(args, kwargs, 1, "p", 0.5))
    train = _arg(args, kwargs, 2, "train", True)
    if not x.numel():  # torch returns the input and a mask of its dtype, checking nothing
        if train is not False:
            rng.source(x.device)  # the op's key, as every op takes one
        return x.clone(), torch.empty_like(x)
    if train is not False:
        if not 0.0 <= p <= 1.0:
            raise DevRNGError(f"native_dropout draws its mask with probability 1 - p in [0, 1], "
                              f"not p={p}.")
        if not (x.dtype.is_floating_point or x.dtype.is_complex):
            raise DevRNGError(f"native_dropout scales the kept values by 1 / (1 - p): it takes "
                              f"floating-point or complex tensors (as torch's does), not "
                              f"{x.dtype} ones.")
    if train is False or p == 0.0:
        return x.clone(), torch.ones_like(x, dtype=torch.bool)
    keep = 1.0 - p
    mask = _like(rng, x, lambda s, shape: s.bernoulli(shape, keep), torch.bool)
    if p == 1.0:
        return x * torch.zeros((), dtype=x.dtype, device=x.device), mask
    if x.dtype in _HALF:  # scaled in float32, rounded once (see _dropout_core)
        return (x.float() * mask * (1.0 / keep)).to(x.dtype), mask
    return x * mask * (1.0 / keep), mask


# -- nn.init and other Python-level functions with random ops inside --------------------------
def _init(op: Callable[[Stream, Any, Args, Kwargs], torch.Tensor], first: tuple[str, float],
          second: tuple[str, float]) -> Callable[[Stream, Any, Args, Kwargs], torch.Tensor]:
    """An ``nn.init`` function ``f(tensor, first, second)`` that fills ``tensor`` by ``op``."""
    def run(rng: Stream, func: Any, args: Args, kwargs: Kwargs) -> torch.Tensor:
        tensor = args[0] if args else kwargs["tensor"]
        a = float(_arg(args, kwargs, 1, *first))
        b = float(_arg(args, kwargs, 2, *second))
        with torch.no_grad():
            return op(rng, func, (tensor, a, b), {})

    return run


def _fan(tensor: torch.Tensor, mode: str) -> int:
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"Mode {mode} not supported, please use one of fan_in, fan_out")
    if tensor.dim() < 2:
        raise ValueError("Fan in and fan out can not be computed for tensor with fewer than 2 "
                         "dimensions")
    receptive = math.prod(tensor.shape[2:])
    return int(tensor.shape[1 if mode == "fan_in" else 0] * receptive)


def _init_kaiming_uniform_(rng: Stream, func: Any, args: Args, kwargs: Kwargs
                           ) -> torch.Tensor:
    tensor = args[0] if args else kwargs["tensor"]
    a = _arg(args, kwargs, 1, "a", 0)
    mode = _arg(args, kwargs, 2, "mode", "fan_in")
    nonlinearity = _arg(args, kwargs, 3, "nonlinearity", "leaky_relu")
    if 0 in tensor.shape:
        warnings.warn("Initializing zero-element tensors is a no-op", UserWarning, stacklevel=4)
        return tensor  # type: ignore[no-any-return]
    gain = torch.nn.init.calculate_gain(nonlinearity, a)
    bound = math.sqrt(3.0) * (gain / math.sqrt(_fan(tensor, mode)))  # torch's, rounding alike
    with torch.no_grad():
        return _uniform_(rng, func, (tensor, -bound, bound), {})


def _gumbel_softmax(rng: Stream, func: Any, args: Args, kwargs: Kwargs) -> torch.Tensor:
    logits: torch.Tensor = args[0] if args else kwargs["logits"]
    tau = float(_arg(args, kwargs, 1, "tau", 1.0))
    hard = bool(_arg(args, kwargs, 2, "hard", False))
    dim = int(_arg(args, kwargs, 4, "dim", -1))
    float_dtype(logits.dtype, "gumbel_softmax", complex_ok=False, empty=not logits.numel())
    # Gumbel(0, 1) noise is -log of Exp(1) noise.
    gumbels = -_like(rng, logits, lambda s, shape: s.exponential(shape, logits.dtype)).log()
    noisy = logits + gumbels
    # (float16 and bfloat16 divided in float32 and rounded, as torch's kernels do: torchax
    # would keep float32)
    soft = ((noisy.float() / tau).to(noisy.dtype) if noisy.dtype in _HALF
            else noisy / tau).softmax(dim)
    if not hard:
        return soft
    index = soft.max(dim, keepdim=True)[1]
    one_hot = torch.zeros_like(logits).scatter_(dim, index, 1.0)
    return one_hot - soft.detach() + soft  # straight-through: hard forward, soft gradient


def _rrelu_train(rng: Stream, x: torch.Tensor, lower: float, upper: float
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """RReLU in training, as torch's rrelu_with_noise: each element at or below zero is
    scaled by its slope, drawn uniformly from [lower, upper). Returns the output and the
    noise (the slopes there, 1 elsewhere)."""
    float_dtype(x.dtype, "rrelu", complex_ok=False)
    if not (math.isfinite(lower) and math.isfinite(upper)):
        raise DevRNGError(f"rrelu needs finite bounds, not lower={lower}, upper={upper}.")
    if lower > upper:
        raise DevRNGError(f"rrelu needs lower <= upper, not lower={lower}, upper={upper}.")
    opmath = torch.float64 if x.dtype == torch.float64 else torch.float32  # torch's, for them
    check_fits(lower, opmath, "rrelu's lower")
    check_fits(upper, opmath, "rrelu's upper")
    # torch draws the slopes in double: bounds beyond the dtype's range are taken, and so
    # drawn in float64 here (not on torchax without x64), then rounded.
    lowest, largest = representable(x.dtype)
    wide = not (lowest <= lower and upper <= largest and upper - lower <= largest)
    work = torch.float64 if wide else x.dtype
    slope = _like(rng, x, lambda s, shape: s.uniform(shape, work, lower, upper).to(x.dtype))
    negative = x <= 0
    return torch.where(negative, x * slope, x), torch.where(negative, slope, 1.0)


def _rrelu(inplace: bool) -> Callable[[Stream, Any, Args, Kwargs], torch.Tensor]:
    def run(rng: Stream, func: Any, args: Args, kwargs: Kwargs) -> torch.Tensor:
        x = args[0] if args else kwargs["input"]
        lower = float(_arg(args, kwargs, 1, "lower", 1.0 / 8))
        upper = float(_arg(args, kwargs, 2, "upper", 1.0 / 3))
        training = bool(_arg(args, kwargs, 3, "training", False))
        in_place = inplace or bool(_arg(args, kwargs, 4, "inplace", False))
        if not training:
            return func(*args, **kwargs)  # type: ignore[no-any-return]  # no randomness
        out = _rrelu_train(rng, x, lower, upper)[0]
        return x.copy_(out) if in_place else out

    return run


def _rrelu_with_noise(form: str) -> Callable[[Stream, Any, Args, Kwargs], Any]:
    """The private op behind rrelu, ``(self, noise, lower, upper, training, generator)``:
    ``form`` "" writes the slopes into ``noise`` and returns the output (``out=`` too),
    "_" does that in place on ``self``, "_functional" returns both and leaves ``noise``."""
    def run(rng: Stream, func: Any, args: Args, kwargs: Kwargs) -> Any:
        x = args[0] if args else kwargs["self"]
        noise = _arg(args, kwargs, 1, "noise")
        lower = float(_arg(args, kwargs, 2, "lower", 1.0 / 8))
        upper = float(_arg(args, kwargs, 3, "upper", 1.0 / 3))
        if not bool(_arg(args, kwargs, 4, "training", False)):
            return func(*args, **kwargs)  # no randomness: leaky ReLU with the mean slope
        out, values = _rrelu_train(rng, x, lower, upper)
        if form == "_functional":
            return out, values
        with torch.no_grad():
            noise.copy_(values)
        if form == "_":
            return x.copy_(out)
        return _finish_factory(out, {"out": kwargs.get("out")})

    return run


def _fractional_max_pool(dims: int) -> Callable[[Stream, Any, Args, Kwargs], Any]:
    def run(rng: Stream, func: Any, args: Args, kwargs: Kwargs) -> Any:
        x = args[0] if args else kwargs["input"]
        if _arg(args, kwargs, 5, "_random_samples") is None:
            float_dtype(x.dtype, f"fractional_max_pool{dims}d", complex_ok=False)
            batch = 1 if x.dim() == dims + 1 else x.shape[0]
            shape = (batch, x.shape[-dims - 1], dims)
            samples = rng.source(x.device).uniform(shape, x.dtype)
            args = args[:5]
            kwargs = {**kwargs, "_random_samples": samples}
        return func(*args, **kwargs)

    return run


# torch function -> its entry (an Op or an Uncovered); each entry is also a module
# attribute, named in _NAMES, which is how compiled code reaches it (see
# Stream.__torch_function__).
ENTRIES: dict[Any, Any] = {}
_NAMES: dict[Any, str] = {}


def _register(funcs: Sequence[Any], entry: Any) -> None:
    name = f"_entry_{len(set(ENTRIES.values()))}"
    globals()[name] = entry
    for func in funcs:
        ENTRIES[func] = entry
        _NAMES[func] = name


def entry_name(func: Any) -> str:
    """The module attribute holding ``func``'s entry, or "" (dynamo runs it while tracing
    and takes the answer as a constant: see _teach_dynamo)."""
    return _NAMES.get(func, "")


def _cover(funcs: Sequence[Any], run: Callable[[Stream, Any, Args, Kwargs], Any],
           generator_at: int | None = None) -> None:
    _register(funcs, Op(run, generator_at))


T = torch.Tensor
_cover([torch.rand], _rand)
_cover([torch.randn], _randn)
_cover([torch.rand_like], _rand_like)
_cover([torch.randn_like], _randn_like)
_cover([torch.randint], _randint)
_cover([torch.randint_like], _randint_like)
_cover([torch.randperm], _randperm)
_cover([T.uniform_], _uniform_)
_cover([T.normal_], _normal_)
_cover([torch.normal], _normal)
_cover([T.exponential_], _exponential_)
_cover([T.random_], _random_)
_cover([torch.bernoulli, T.bernoulli], _bernoulli)
_cover([T.bernoulli_], _bernoulli_)
_cover([torch.multinomial, T.multinomial], _multinomial)
_cover([F.dropout], _dropout_fn(feature=False, alpha=False))
_cover([F.alpha_dropout], _dropout_fn(feature=False, alpha=True, default_training=False))
_cover([F.feature_alpha_dropout], _dropout_fn(feature=True, alpha=True,
                                              default_training=False))
_cover([F.dropout1d], _dropout_nd(1))
_cover([F.dropout2d], _dropout_nd(2))
_cover([F.dropout3d], _dropout_nd(3))
for _name, _feature, _alpha in (("dropout", False, False), ("feature_dropout", True, False),
                                ("alpha_dropout", False, True),
                                ("feature_alpha_dropout", True, True)):
    _cover([getattr(torch, _name)], _dropout_fn(feature=_feature, alpha=_alpha, inplace=False))
    _cover([getattr(torch, _name + "_")], _dropout_fn(feature=_feature, alpha=_alpha,
                                                      inplace=True))
_cover([torch.native_dropout], _native_dropout)
_cover([torch.nn.init.uniform_], _init(_uniform_, ("a", 0.0), ("b", 1.0)), generator_at=3)
_cover([torch.nn.init.normal_], _init(_normal_, ("mean", 0.0), ("std", 1.0)), generator_at=3)
_cover([torch.nn.init.kaiming_uniform_], _init_kaiming_uniform_, generator_at=4)
_cover([F.gumbel_softmax], _gumbel_softmax)
_cover([F.rrelu, torch.rrelu], _rrelu(False))
_cover([F.rrelu_, torch.rrelu_], _rrelu(True))
for _form in ("", "_", "_functional"):
    # The Python binding, the aten op (torch.ops.aten.X) and each of its overloads.
    _packet = getattr(torch.ops.aten, "rrelu_with_noise" + _form, None)
    _funcs = [getattr(torch._C._nn, "rrelu_with_noise" + _form, None), _packet,
              *(getattr(_packet, o) for o in (_packet.overloads() if _packet else ()))]
    _cover([f for f in _funcs if f is not None], _rrelu_with_noise(_form), generator_at=5)
_cover([F.fractional_max_pool2d, F.fractional_max_pool2d_with_indices], _fractional_max_pool(2))
_cover([F.fractional_max_pool3d, F.fractional_max_pool3d_with_indices], _fractional_max_pool(3))


# -- random ops it does not cover ----------------------------------------------------------------
class Uncovered:
    """A random op portable refuses (strict) or lets draw natively; ``draws(args, kwargs)``
    says whether this call is random at all (sdpa without dropout is not)."""

    __slots__ = ("draws", "name", "why")

    def __init__(self, name: str, draws: Callable[[Args, Kwargs], bool] | None = None,
                 why: str = "") -> None:
        self.name = name
        self.draws = draws or (lambda args, kwargs: True)
        self.why = why

    def handle(self, rng: Stream, func: Any, types: Any, args: Args, kwargs: Kwargs
               ) -> Any:
        if self.draws(args, kwargs):
            rng.refuse(self.name, self.why)
        return func(*args, **kwargs)


class _Composite(Uncovered):
    """A Python-level torch function with random ops in its body: run inside the mode where
    torch can (redispatch, eager code), refused where it cannot and this call draws."""

    def handle(self, rng: Stream, func: Any, types: Any, args: Args, kwargs: Kwargs
               ) -> Any:
        if redispatch is not None and not torch.compiler.is_compiling():
            with rng:
                return redispatch(func, types, args, kwargs)
        return super().handle(rng, func, types, args, kwargs)


def _rnn_dropout(args: Args, kwargs: Kwargs) -> bool:
    # lstm / gru / rnn_*: (..., dropout: float, train: bool, ...), positions differ by overload.
    return any(type(a) is float and a > 0 and b is True for a, b in itertools.pairwise(args))


def _sdpa_dropout(args: Args, kwargs: Kwargs) -> bool:
    return float(_arg(args, kwargs, 4, "dropout_p", 0.0)) > 0.0


def _mha_dropout(args: Args, kwargs: Kwargs) -> bool:
    return (float(_arg(args, kwargs, 10, "dropout_p", 0.0)) > 0.0
            and bool(_arg(args, kwargs, 13, "training", True)))


for _owner, _prefix, _names in (
        (torch, "torch.", ("poisson", "binomial", "_standard_gamma", "_sample_dirichlet",
                           "_fused_dropout")),
        (T, "Tensor.", ("cauchy_", "geometric_", "log_normal_"))):
    for _name in _names:
        _register([getattr(_owner, _name)], Uncovered(_prefix + _name))
for _name in ("lstm", "gru", "rnn_relu", "rnn_tanh"):
    _register([getattr(torch, _name)], Uncovered(
        f"torch.{_name} (a recurrent layer with dropout)", _rnn_dropout,
        " (the dropout between its layers runs inside one C++ kernel)"))


def _schema_draws(schema: Any) -> Callable[[Args, Kwargs], bool]:
    """Whether a call of an aten op draws, read from its schema: not when its dropout
    probability is 0 or its train flag False (the fused attention and RNN kernels)."""
    checks = [(i, a.name, a.default_value) for i, a in enumerate(schema.arguments)
              if a.name in ("dropout_p", "dropout", "train", "training")]

    def draws(args: Args, kwargs: Kwargs) -> bool:
        for i, name, default in checks:
            value = args[i] if i < len(args) else kwargs.get(name, default)
            if value is False or (name.startswith("dropout") and value == 0):
                return False
        return True

    return draws


def _seeded_schema(op: Any) -> Any:
    """The schema of an aten op (an OpOverload, or a packet's first overload) if it is tagged
    as drawing random numbers (``nondeterministic_seeded``), else None."""
    if isinstance(op, torch._ops.OpOverloadPacket):
        op = next((getattr(op, name) for name in op.overloads()), None)  # type: ignore[no-untyped-call]
    if op is None or torch.Tag.nondeterministic_seeded not in op.tags:
        return None
    return op._schema


# torch's private bindings of aten ops tagged as random (fused attention, cuDNN and MIOpen
# RNNs): tests/test_portable.py checks that every binding of such an op is in the tables.
for _name in ("_cudnn_rnn", "miopen_rnn", "_lstm_mps", "_scaled_dot_product_attention_math",
              "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_for_cpu",
              "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
              "_scaled_dot_product_attention_math_for_mps", "_triton_scaled_dot_attention"):
    _binding = getattr(torch, _name, None)
    _schema = _seeded_schema(getattr(torch.ops.aten, _name, None))
    if _binding is not None and _schema is not None:
        _register([_binding], Uncovered(f"torch.{_name}", _schema_draws(_schema)))
_ATEN: dict[Any, Any] = {}  # torch.ops.aten ops seen that the tables do not list


def aten_entry(func: Any) -> Any:
    """For an op of ``torch.ops.aten`` (an OpOverload or a packet) the tables do not list:
    an ``Uncovered`` if it is tagged as drawing random numbers, else None (cached)."""
    try:
        return _ATEN[func]
    except KeyError:
        schema = _seeded_schema(func)
        entry = _ATEN[func] = None if schema is None else Uncovered(f"torch.ops.{func}",
                                                                    _schema_draws(schema))
        return entry


_register([F.scaled_dot_product_attention], Uncovered(
    "F.scaled_dot_product_attention with dropout_p > 0", _sdpa_dropout,
    " (its attention dropout runs inside the fused kernel)"))
# Its body runs outside every mode on older torch and in compiled code (see redispatch).
_register([F.multi_head_attention_forward], _Composite(
    "F.multi_head_attention_forward (nn.MultiheadAttention) with dropout", _mha_dropout,
    " in compiled code, or on a torch without torch.overrides.redispatch_function (eager "
    "code on torch 2.13 is covered)"))
