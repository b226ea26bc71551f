"""devrng.portable at the edges of its inputs: what torch refuses, portable refuses.

Every covered op is called with every dtype and with edge arguments (bounds at the limits
of the dtype, empty and 0-d shapes, infinite and NaN bounds, probabilities outside [0, 1],
negative sizes, ...), once natively and once inside ``devrng.portable``: portable refuses
exactly when torch refuses -- with torch's exception type, or a ``DevRNGError`` where torch
raises a RuntimeError -- and when both accept, they return the same dtype, shape, device
and requires_grad. Before, out-of-range integer bounds wrapped, ``randperm(300,
dtype=int8)`` repeated values, ``uniform_(0, inf)`` filled with inf, and integer dropout
returned float32. The comparison is made with whichever torch runs the suite.
"""

from __future__ import annotations

import math
import random
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import devrng

Call = Callable[[], Any]

INTS = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
UINTS = [getattr(torch, n) for n in ("uint16", "uint32", "uint64") if hasattr(torch, n)]
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
COMPLEX = [torch.complex32, torch.complex64, torch.complex128]
ALL = [*FLOATS, *COMPLEX, *INTS, *UINTS, torch.bool]

# Where portable takes what torch's CPU kernels lack, on purpose: another device's torch
# takes it too, and a portable program runs the same on every device.
TAKEN_ON_PURPOSE = {
    "rrelu float16": "torch's CPU has no float16 rrelu kernel (CUDA has one)",
}


def _n(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _by_dtype(dt: torch.dtype) -> Iterator[tuple[str, str, Call]]:
    """Every op once in dtype ``dt``, with ordinary arguments."""
    n = _n(dt)

    def zeros(*shape: int) -> torch.Tensor:
        return torch.zeros(shape, dtype=dt)

    yield "factories", f"rand {n}", lambda: torch.rand(3, dtype=dt)
    yield "factories", f"randn {n}", lambda: torch.randn(3, dtype=dt)
    yield "factories", f"rand_like {n}", lambda: torch.rand_like(zeros(3))
    yield "factories", f"randn_like {n}", lambda: torch.randn_like(zeros(3))
    yield "factories", f"rand_like to {n}", lambda: torch.rand_like(torch.zeros(3), dtype=dt)
    yield "factories", f"randn out {n}", lambda: torch.randn(3, out=zeros(3))
    yield "factories", f"normal factory {n}", lambda: torch.normal(0.0, 1.0, (3,), dtype=dt)
    yield "integers", f"randint {n}", lambda: torch.randint(0, 2, (3,), dtype=dt)
    yield "integers", f"randint_like {n}", lambda: torch.randint_like(zeros(3), 0, 2)
    yield "integers", f"randperm {n}", lambda: torch.randperm(5, dtype=dt)
    yield "integers", f"random_ {n}", lambda: zeros(3).random_()
    yield "integers", f"random_(0, 2) {n}", lambda: zeros(3).random_(0, 2)
    yield "in place", f"uniform_ {n}", lambda: zeros(3).uniform_(0, 1)
    yield "in place", f"normal_ {n}", lambda: zeros(3).normal_()
    yield "in place", f"normal(tensor) {n}", lambda: torch.normal(zeros(3), 1.0)
    yield "in place", f"exponential_ {n}", lambda: zeros(3).exponential_()
    yield "bernoulli", f"bernoulli {n}", lambda: torch.bernoulli(torch.full((3,), 0.5).to(dt))
    yield "bernoulli", f"bernoulli(x, p) {n}", lambda: torch.bernoulli(zeros(3), 0.5)
    yield "bernoulli", f"bernoulli_ {n}", lambda: zeros(3).bernoulli_(0.5)
    yield "bernoulli", f"bernoulli_(tensor p) {n}", lambda: torch.zeros(3).bernoulli_(
        torch.full((3,), 0.5).to(dt))
    yield "bernoulli", f"multinomial {n}", lambda: torch.multinomial(torch.ones(4).to(dt), 2)
    yield "dropout", f"dropout {n}", lambda: F.dropout(torch.ones(4, dtype=dt), 0.5)
    yield "dropout", f"dropout in place {n}", lambda: F.dropout(torch.ones(4, dtype=dt), 0.5,
                                                                 inplace=True)
    yield "dropout", f"dropout2d {n}", lambda: F.dropout2d(torch.ones(2, 3, 4, 4, dtype=dt), 0.5)
    yield "dropout", f"alpha_dropout {n}", lambda: F.alpha_dropout(torch.ones(4, dtype=dt), 0.5,
                                                                    True)
    yield "dropout", f"feature_alpha_dropout {n}", lambda: F.feature_alpha_dropout(
        torch.ones(2, 3, 4, dtype=dt), 0.5, True)
    yield "dropout", f"torch.dropout {n}", lambda: torch.dropout(torch.ones(4, dtype=dt), 0.5,
                                                                 True)
    yield "dropout", f"native_dropout {n}", lambda: torch.native_dropout(torch.ones(4, dtype=dt),
                                                                         0.5, True)
    yield "nn", f"init.uniform_ {n}", lambda: torch.nn.init.uniform_(zeros(3))
    yield "nn", f"init.normal_ {n}", lambda: torch.nn.init.normal_(zeros(3))
    yield "nn", f"kaiming_uniform_ {n}", lambda: torch.nn.init.kaiming_uniform_(zeros(3, 4))
    yield "nn", f"rrelu {n}", lambda: F.rrelu(-torch.ones(4, dtype=dt), training=True)
    yield "nn", f"gumbel_softmax {n}", lambda: F.gumbel_softmax(zeros(2, 3))
    yield "nn", f"fractional_max_pool2d {n}", lambda: F.fractional_max_pool2d(
        torch.ones(1, 1, 4, 4, dtype=dt), 2, output_size=2)


def _integer_bounds(dt: torch.dtype) -> Iterator[tuple[str, str, Call]]:
    """randint, randint_like and random_ with bounds at and beyond the dtype's limits."""
    n = _n(dt)
    if dt == torch.bool:
        lo, hi = 0, 1
    elif dt.is_floating_point:
        lo, hi = int(torch.finfo(dt).min), int(torch.finfo(dt).max)
    else:
        lo, hi = torch.iinfo(dt).min, torch.iinfo(dt).max
    digits = {torch.float16: 11, torch.bfloat16: 8, torch.float32: 24, torch.float64: 53}.get(dt)
    pairs = [(lo, hi + 1), (lo, hi), (lo - 1, 1), (0, hi + 2), (-5, 5), (0, 300), (0, 200),
             (0, 256), (-128, 128), (0, 2**31), (0, 2**32), (-2**63, 2**63 - 1), (0, 2**63),
             (0, 2**64), (3, 3), (5, 3)]
    if digits:
        pairs += [(0, 2**digits), (0, 2**digits + 2), (-2**digits - 1, 1)]
    for a, b in pairs:
        yield "integer bounds", f"randint [{a}, {b}) {n}", lambda a=a, b=b: torch.randint(
            a, b, (4,), dtype=dt)
        yield "integer bounds", f"randint_like [{a}, {b}) {n}", lambda a=a, b=b: (
            torch.randint_like(torch.zeros(4, dtype=dt), a, b))
        yield "integer bounds", f"random_ [{a}, {b}) {n}", lambda a=a, b=b: torch.zeros(
            4, dtype=dt).random_(a, b)
        yield "integer bounds", f"random_(to={b}) {n}", lambda b=b: torch.zeros(
            4, dtype=dt).random_(b)


def _float_arguments(dt: torch.dtype) -> Iterator[tuple[str, str, Call]]:
    """uniform_, normal, exponential_, bernoulli, dropout and multinomial with infinite,
    NaN, out-of-range and overflowing arguments."""
    n = _n(dt)
    big = float(torch.finfo(dt).max)
    beyond = math.inf if dt == torch.float64 else big * 1.0001
    for a, b in [(0, math.inf), (-math.inf, 0), (math.nan, 1), (0, math.nan), (1, 0), (2, 2),
                 (-big, big), (-big / 2, big / 2), (0, big), (0, beyond), (-3e38, 3e38),
                 (0, 70000.0), (0, 1e300), (-1e-45, 1e-45)]:
        yield "float bounds", f"uniform_ [{a}, {b}) {n}", lambda a=a, b=b: torch.zeros(
            4, dtype=dt).uniform_(a, b)
        yield "float bounds", f"init.uniform_ [{a}, {b}) {n}", lambda a=a, b=b: (
            torch.nn.init.uniform_(torch.zeros(4, dtype=dt), a, b))
    for m, s in [(0, -1), (0, 0), (0, math.inf), (math.inf, 1), (math.nan, 1), (0, math.nan),
                 (0, 1e300), (1e300, 1)]:
        yield "normal", f"normal_ ({m}, {s}) {n}", lambda m=m, s=s: torch.zeros(
            4, dtype=dt).normal_(m, s)
        yield "normal", f"normal factory ({m}, {s}) {n}", lambda m=m, s=s: torch.normal(
            m, s, (4,), dtype=dt)
        yield "normal", f"normal(tensor, tensor) ({m}, {s}) {n}", lambda m=m, s=s: torch.normal(
            torch.full((4,), float(m), dtype=dt), torch.full((4,), float(s), dtype=dt))
        yield "normal", f"normal(float, tensor) ({m}, {s}) {n}", lambda m=m, s=s: torch.normal(
            float(m), torch.full((4,), float(s), dtype=dt))
    for lam in (0.0, -1.0, math.inf, math.nan, 1e-300, 1e300):
        yield "normal", f"exponential_ {lam} {n}", lambda lam=lam: torch.zeros(
            4, dtype=dt).exponential_(lam)
    for p in (-0.1, 0.0, 1.0, 1.1, math.nan, math.inf):
        yield "probabilities", f"bernoulli_ p={p} {n}", lambda p=p: torch.zeros(
            4, dtype=dt).bernoulli_(p)
        yield "probabilities", f"bernoulli(x, p={p}) {n}", lambda p=p: torch.bernoulli(
            torch.zeros(4, dtype=dt), p)
        yield "probabilities", f"bernoulli(tensor {p}) {n}", lambda p=p: torch.bernoulli(
            torch.full((4,), p, dtype=dt))
        yield "probabilities", f"dropout p={p} {n}", lambda p=p: F.dropout(
            torch.ones(4, dtype=dt), p)
        yield "probabilities", f"dropout eval p={p} {n}", lambda p=p: F.dropout(
            torch.ones(4, dtype=dt), p, training=False)
        yield "probabilities", f"dropout2d p={p} {n}", lambda p=p: F.dropout2d(
            torch.ones(2, 2, 3, 3, dtype=dt), p)
        yield "probabilities", f"alpha_dropout p={p} {n}", lambda p=p: F.alpha_dropout(
            torch.ones(4, dtype=dt), p, True)
        yield "probabilities", f"native_dropout p={p} {n}", lambda p=p: torch.native_dropout(
            torch.ones(4, dtype=dt), p, True)
        yield "probabilities", f"torch.dropout p={p} {n}", lambda p=p: torch.dropout(
            torch.ones(4, dtype=dt), p, True)
    for w in ([1.0, -1.0], [0.0, 0.0], [math.inf, 1.0], [math.nan, 1.0], [1.0, 0.0]):
        for k in (1, 2):
            yield "multinomial", f"multinomial {w} {k} {n}", lambda w=w, k=k: torch.multinomial(
                torch.tensor(w, dtype=dt), k)
    for name, make, k, replacement in [("0 samples", (3,), 0, False), ("3-D", (2, 2, 3), 1, False),
                                       ("0-D", (), 1, False), ("no rows", (0, 3), 1, False),
                                       ("no categories", (2, 0), 1, False),
                                       ("too many", (3,), 4, False), ("many", (3,), 5, True),
                                       ("negative", (3,), -1, False)]:
        yield "multinomial", f"multinomial {name} {n}", lambda make=make, k=k, r=replacement: (
            torch.multinomial(torch.ones(make, dtype=dt), k, r))
    yield "nn", f"rrelu lower > upper {n}", lambda: F.rrelu(-torch.ones(4, dtype=dt), 0.5, 0.1,
                                                             training=True)
    yield "nn", f"rrelu upper inf {n}", lambda: F.rrelu(-torch.ones(4, dtype=dt), 0.1, math.inf,
                                                         training=True)
    yield "nn", f"gumbel_softmax tau 0 {n}", lambda: F.gumbel_softmax(torch.zeros(2, 3, dtype=dt),
                                                                       tau=0.0)
    yield "nn", f"kaiming_uniform_ 1-D {n}", lambda: torch.nn.init.kaiming_uniform_(
        torch.zeros(4, dtype=dt))
    yield "nn", f"kaiming_uniform_ empty {n}", lambda: torch.nn.init.kaiming_uniform_(
        torch.zeros(0, 4, dtype=dt))
    yield "dropout", f"dropout1d 4-D {n}", lambda: F.dropout1d(torch.ones(2, 2, 2, 2, dtype=dt),
                                                                0.5)
    yield "dropout", f"dropout3d 3-D {n}", lambda: F.dropout3d(torch.ones(2, 2, 2, dtype=dt), 0.5)


def _shapes_and_others() -> Iterator[tuple[str, str, Call]]:
    for size in [(3,), (0,), (2, 0, 3), ()]:
        yield "shapes", f"rand {size}", lambda size=size: torch.rand(size)
        yield "shapes", f"randn {size}", lambda size=size: torch.randn(*size)
        yield "shapes", f"randint {size}", lambda size=size: torch.randint(0, 5, size)
        yield "shapes", f"uniform_ {size}", lambda size=size: torch.empty(size).uniform_(-1, 1)
        yield "shapes", f"normal_ {size}", lambda size=size: torch.empty(size).normal_()
        yield "shapes", f"dropout {size}", lambda size=size: F.dropout(torch.ones(size), 0.5)
        yield "shapes", f"bernoulli {size}", lambda size=size: torch.bernoulli(
            torch.full(size, 0.5))
        yield "shapes", f"multinomial {size}", lambda size=size: torch.multinomial(
            torch.ones(size), 1)
        yield "shapes", f"randn_like {size}", lambda size=size: torch.randn_like(torch.zeros(size))
        yield "shapes", f"dropout int {size}", lambda size=size: F.dropout(
            torch.ones(size, dtype=torch.int64), 0.5)
    yield "shapes", "rand(-1)", lambda: torch.rand(-1)
    yield "shapes", "randn(2, -3)", lambda: torch.randn(2, -3)
    yield "shapes", "randint size (-2,)", lambda: torch.randint(0, 5, (-2,))
    for n in (0, 1, 5, 128, 129, 255, 256, 257, 300, 2049, 2050, -1, 2**63):
        for dt in [torch.int8, torch.uint8, torch.int16, torch.int64, torch.float16,
                   torch.bfloat16, torch.float32, torch.bool, torch.complex64, *UINTS]:
            if n <= 3000 or dt in (torch.float16, torch.bfloat16, torch.float32):
                yield "randperm", f"randperm {n} {_n(dt)}", lambda n=n, dt=dt: torch.randperm(
                    n, dtype=dt)
    others: list[tuple[str, Call]] = [
        ("randint(0.5, 5)", lambda: torch.randint(0.5, 5, (3,))),  # type: ignore[call-overload]
        ("randint(0.0, 5.0)", lambda: torch.randint(0.0, 5.0, (3,))),  # type: ignore[call-overload]
        ("randint(tensor)", lambda: torch.randint(torch.tensor(5), (3,))),  # type: ignore[call-overload]
        ("random_(0.5, 5)", lambda: torch.zeros(3).random_(0.5, 5)),  # type: ignore[call-overload]
        ("randperm(5.0)", lambda: torch.randperm(5.0)),  # type: ignore[call-overload]
        ("randint_like inverted", lambda: torch.randint_like(torch.zeros(3), 5, 2)),
        ("rand sparse", lambda: torch.rand(3, layout=torch.sparse_coo)),
        ("randint requires_grad", lambda: torch.randint(0, 3, (3,), requires_grad=True)),
        ("randn requires_grad", lambda: torch.randn(3, requires_grad=True)),
        ("uniform_ on a leaf that requires grad", lambda: torch.zeros(
            3, requires_grad=True).uniform_()),
        ("exponential_ on a leaf that requires grad", lambda: torch.zeros(
            3, requires_grad=True).exponential_()),
        ("bernoulli_ on a leaf that requires grad", lambda: torch.zeros(
            3, requires_grad=True).bernoulli_(0.5)),
        ("dropout in place on a leaf that requires grad", lambda: F.dropout(
            torch.zeros(3, requires_grad=True), 0.5, inplace=True)),
        ("uniform_ on a non-leaf", lambda: (torch.zeros(3, requires_grad=True) * 1).uniform_()),
        ("normal mismatched shapes", lambda: torch.normal(torch.zeros(3), torch.ones(4))),
        ("normal broadcast", lambda: torch.normal(torch.zeros(3, 1), torch.ones(4))),
        ("normal int tensors", lambda: torch.normal(torch.zeros(3, dtype=torch.int64),
                                                    torch.ones(3, dtype=torch.int64))),
        ("normal negative std tensor", lambda: torch.normal(torch.zeros(3), -torch.ones(3))),
        ("normal complex std", lambda: torch.normal(torch.zeros(3, dtype=torch.complex64),
                                                    torch.ones(3, dtype=torch.complex64))),
        ("normal mixed dtypes", lambda: torch.normal(torch.zeros(3, dtype=torch.float64),
                                                     torch.ones(3))),
        ("uniform_ float64 on a range narrower than 2**-969", lambda: torch.zeros(
            3, dtype=torch.float64).uniform_(1e-300, 2e-300)),
        ("normal mixed dtypes, the narrower mean", lambda: torch.normal(
            torch.zeros(3), torch.ones(3, dtype=torch.float64))),
        ("normal complex32 mean, float32 std", lambda: torch.normal(
            torch.zeros(3, dtype=torch.complex32), torch.ones(3))),
        ("bernoulli probabilities above 1", lambda: torch.bernoulli(torch.tensor([1.5, 0.5]))),
        ("bernoulli_ tensor p above 1", lambda: torch.zeros(2).bernoulli_(torch.tensor([1.5, 0.5]))),
        ("bernoulli_ tensor p too long", lambda: torch.zeros(2).bernoulli_(torch.full((3,), 0.5))),
        ("multinomial int weights", lambda: torch.multinomial(torch.ones(3, dtype=torch.int64), 1)),
        ("multinomial rows summing to 0", lambda: torch.multinomial(torch.tensor(
            [[1.0, 0.0], [0.0, 0.0]]), 1)),
        ("dropout int eval", lambda: F.dropout(torch.ones(3, dtype=torch.int64), 0.5,
                                               training=False)),
        ("dropout int p=1", lambda: F.dropout(torch.ones(3, dtype=torch.int64), 1.0)),
        ("native_dropout eval p=1.1", lambda: torch.native_dropout(torch.ones(3), 1.1, False)),
        ("rrelu nan", lambda: F.rrelu(-torch.ones(3), math.nan, 0.3, training=True)),
    ]
    for name, call in others:
        yield "others", name, call


def edge_calls() -> list[tuple[str, str, Call]]:
    """(family, name, call) for every edge call; each call makes its inputs afresh."""
    calls = list(_shapes_and_others())
    for dt in ALL:
        calls += _by_dtype(dt)
        if not dt.is_complex:
            calls += _integer_bounds(dt)
        if dt.is_floating_point:
            calls += _float_arguments(dt)
    return calls


def outcome(call: Call) -> Any:
    """What ``call`` returns, or the exception it raises (warnings silenced)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return call()
        except Exception as err:  # the exception is the outcome compared
            return err


def signature(value: Any) -> Any:
    """What is compared when both accept: dtype, shape, device and requires_grad."""
    if isinstance(value, torch.Tensor):
        return value.dtype, tuple(value.shape), value.device.type, value.requires_grad
    if isinstance(value, tuple):
        return tuple(signature(v) for v in value)
    return type(value).__name__


def disagreement(call: Call) -> str | None:
    """Why portable and native torch disagree on ``call``, or None when they agree."""
    native = outcome(call)
    with devrng.portable(0):
        portable = outcome(call)
    if isinstance(native, Exception) or isinstance(portable, Exception):
        if isinstance(native, Exception) and isinstance(portable, Exception) and (
                isinstance(portable, type(native)) or (
                    isinstance(native, RuntimeError) and isinstance(portable, devrng.DevRNGError))):
            return None
        said = {k: f"{type(v).__name__}: {str(v)[:120]}" if isinstance(v, Exception)
                else signature(v) for k, v in (("native", native), ("portable", portable))}
        return f"native {said['native']} | portable {said['portable']}"
    if signature(native) != signature(portable):
        return f"native {signature(native)} | portable {signature(portable)}"
    return None


EDGE_CALLS = edge_calls()
FAMILIES = sorted({family for family, _, _ in EDGE_CALLS})


@pytest.mark.parametrize("family", FAMILIES)
def test_portable_refuses_what_torch_refuses_and_returns_what_it_returns(family: str) -> None:
    calls = [(name, call) for f, name, call in EDGE_CALLS if f == family]
    assert calls
    found = {name: why for name, call in calls if (why := disagreement(call))}
    on_purpose = {name for name in found if name in TAKEN_ON_PURPOSE}
    for name in on_purpose:  # still true: native refuses, portable draws
        assert found[name].startswith("native NotImplementedError") and "portable (" in found[name]
    assert {k: v for k, v in found.items() if k not in on_purpose} == {}


def two_faced(native: Call, portable: Call) -> Call:
    """A call that does ``native`` the first time (disagreement() calls it natively first)
    and ``portable`` the second."""
    calls = iter([native, portable])
    return lambda: next(calls)()


def raises(err: Exception) -> Call:
    def call() -> None:
        raise err

    return call


def test_the_comparison_sees_disagreements() -> None:
    assert disagreement(two_faced(raises(RuntimeError("out of bounds")), lambda: torch.zeros(
        3, dtype=torch.uint8))) == ("native RuntimeError: out of bounds | "
                                    "portable (torch.uint8, (3,), 'cpu', False)")
    assert disagreement(two_faced(lambda: torch.zeros(3, dtype=torch.int8), lambda: torch.zeros(
        3))) == ("native (torch.int8, (3,), 'cpu', False) | "
                 "portable (torch.float32, (3,), 'cpu', False)")
    assert disagreement(two_faced(raises(ValueError("p")), raises(TypeError("p")))) == (
        "native ValueError: p | portable TypeError: p")
    assert disagreement(two_faced(raises(ValueError("p")), raises(devrng.DevRNGError("p"))))
    # Agreements: torch's RuntimeError and portable's DevRNGError; equal signatures.
    assert disagreement(two_faced(raises(NotImplementedError("Byte")),
                                  raises(devrng.DevRNGError("uint8")))) is None
    assert disagreement(lambda: torch.empty(2, 3)) is None


def test_the_edges_cover_every_covered_op_and_dtype() -> None:
    names = " ".join(name for _, name, _ in EDGE_CALLS)
    for op in ("rand", "randn", "rand_like", "randn_like", "randint", "randint_like", "randperm",
               "uniform_", "normal_", "normal factory", "exponential_", "random_", "bernoulli",
               "bernoulli_", "multinomial", "dropout", "dropout2d", "alpha_dropout",
               "feature_alpha_dropout", "native_dropout", "torch.dropout", "init.uniform_",
               "init.normal_", "kaiming_uniform_", "rrelu", "gumbel_softmax",
               "fractional_max_pool2d"):
        for dt in ALL:
            assert f"{op} {_n(dt)}" in names, (op, dt)
    assert len(EDGE_CALLS) > 1500


# -- the cases the issue named, with their sentences ---------------------------------------------
@pytest.mark.parametrize(("call", "match"), [
    (lambda: torch.randint(0, 300, (3,), dtype=torch.uint8), r"randint draws integers in "
     r"\[low, high\) that torch\.uint8 holds \(\[0, 255\]\); low=0, high=300 go beyond"),
    (lambda: torch.randint(-5, 5, (3,), dtype=torch.uint8), r"low=-5, high=5 go beyond"),
    (lambda: torch.randint(0, 200, (3,), dtype=torch.int8), r"torch\.int8 holds \(\[-128, 127\]\)"),
    (lambda: torch.zeros(3, dtype=torch.uint8).random_(0, 300), r"random_ draws integers"),
    (lambda: torch.randperm(300, dtype=torch.int8), r"randperm\(300\) holds 0 to 299, more than "
     r"torch\.int8 can tell apart"),
    (lambda: torch.zeros(3).uniform_(0, math.inf), r"uniform_ draws between bounds that are "
     r"finite torch\.float32 values .*not from=0\.0, to=inf"),
    (lambda: torch.zeros(3).uniform_(-3e38, 3e38), r"uniform_ needs to - from <= "
     r"3\.4028\d*e\+38 \(the largest torch\.float32\)"),
    (lambda: F.dropout(torch.ones(3, dtype=torch.int64), 0.5), r"dropout with 0 < p < 1 scales "
     r"the kept values by 1 / \(1 - p\): it takes floating-point tensors .*not torch\.int64"),
])
def test_what_torch_refuses_is_refused_with_a_sentence(call: Call, match: str) -> None:
    with pytest.raises(RuntimeError):
        call()  # torch itself
    with devrng.portable(0) as rng, pytest.raises(devrng.DevRNGError, match=match):
        call()
    assert rng.counter == 0  # refused before anything was drawn


def test_bounds_beyond_int64_are_a_value_error_as_in_torch() -> None:
    with devrng.portable(0), pytest.raises(ValueError, match=r"randint's high must fit in int64 "
                                                             r"\(as torch's do\), not "
                                                             r"9223372036854775808\."):
        torch.randint(0, 2**63, (3,))


def test_complex32_draws_are_complex32_made_of_float16_parts() -> None:
    # Before: complex128. The parts are the float16 draws, real then imaginary.
    for draw, parts in ((lambda: torch.rand(5, dtype=torch.complex32),
                         lambda: torch.rand(2, 5, dtype=torch.float16)),
                        (lambda: torch.rand_like(torch.zeros(5, dtype=torch.complex32)),
                         lambda: torch.rand(2, 5, dtype=torch.float16))):
        with devrng.portable(3):
            got = draw()
        with devrng.portable(3):
            want = parts()
        assert got.dtype == torch.complex32
        assert torch.equal(torch.view_as_real(got.to(torch.complex64)),
                           torch.stack([want[0], want[1]], -1).float())
    with devrng.portable(3):
        z = torch.randn(4, dtype=torch.complex32)
        w = torch.randn_like(z)
    assert z.dtype == w.dtype == torch.complex32


def test_complex_uniform_fills_both_parts_within_the_bounds() -> None:
    with devrng.portable(5):
        z = torch.zeros(2000, dtype=torch.complex64).uniform_(-2.0, 3.0)
    parts = torch.view_as_real(z)
    assert float(parts.min()) >= -2.0 and float(parts.max()) < 3.0
    assert float(parts[:, 0].std()) > 1.0 and float(parts[:, 1].std()) > 1.0


def test_randperm_at_the_dtype_limit_is_a_permutation() -> None:
    with devrng.portable(1):
        a = torch.randperm(256, dtype=torch.uint8)
        b = torch.randperm(128, dtype=torch.int8)
        c = torch.randperm(2049, dtype=torch.float16)
    assert sorted(a.tolist()) == list(range(256)) and sorted(b.tolist()) == list(range(128))
    assert sorted(c.tolist()) == list(range(2049))


def test_randint_over_the_whole_int64_range() -> None:
    # Spans above 2**63 take all 64 bits modulo the span (torch's CPU kernel does the same).
    with devrng.portable(2):
        x = torch.randint(-2**63, 2**63 - 1, (4000,))
        y = torch.zeros(4000, dtype=torch.int64).random_(-2**63, 2**63 - 1)
        z = torch.randint(-2**62, 2**63 - 1, (4000,))  # about 1.5 * 2**63 values
    for t in (x, y):
        assert (t < 0).float().mean().item() == pytest.approx(0.5, abs=0.05)
        assert len(torch.unique(t)) == 4000
    # The values below low + 2**64 - span (the negative ones here) come twice as often:
    # a half of the draws, not a third.
    assert int(z.min()) >= -2**62 and (z < 0).float().mean().item() == pytest.approx(
        0.5, abs=0.05)
    assert not torch.equal(x, y)


def test_multinomial_without_replacement_goes_on_past_the_non_zero_weights() -> None:
    # torch takes more samples than there are non-zero weights (the rest by zero-weight
    # categories); portable does too: the non-zero ones first, then the others, each once.
    with devrng.portable(4):
        got = torch.multinomial(torch.tensor([[0.0, 5.0, 0.0, 1.0, 0.0]] * 200), 5)
    for row in got.tolist():
        assert sorted(row) == [0, 1, 2, 3, 4] and set(row[:2]) == {1, 3}
    firsts = {tuple(row[2:]) for row in got.tolist()}
    assert len(firsts) == 6  # the zero-weight ones in every order


@pytest.mark.slow
def test_fuzzed_edge_calls_refuse_as_torch_does() -> None:
    # 20,000 random calls: random ops, dtypes, bounds near the limits, shapes and
    # probabilities. No raw exception (one torch would not raise), no disagreement.
    rng = random.Random(38)
    found = [f"{name}: {why}" for name, call in fuzzed_calls(rng, 20_000)
             if (why := disagreement(call))]
    found = [f for f in found if f.split(":")[0] not in TAKEN_ON_PURPOSE]
    assert found == []


def fuzzed_calls(rng: random.Random, count: int) -> Iterator[tuple[str, Call]]:
    """``count`` random (name, call) pairs over every covered op."""
    def integer(dt: torch.dtype) -> int:
        if dt == torch.bool:
            edges = [0, 1, 2]
        elif dt.is_floating_point or dt.is_complex:
            edges = [0, 1, 2**24, 2**53, int(torch.finfo(torch.float16).max)]
        else:
            info = torch.iinfo(dt)
            edges = [info.min, info.max, info.max + 1, info.min - 1]
        base = rng.choice([*edges, 0, 1, -1, 5, 255, 256, 2**31, 2**32, 2**63 - 1, -2**63,
                           2**63, 2**64, rng.randrange(-2**40, 2**40)])
        return base + rng.choice([0, 0, 0, 1, -1, 2])

    def real(dt: torch.dtype) -> float:
        big = float(torch.finfo(dt if dt.is_floating_point else torch.float32).max)
        return rng.choice([0.0, 1.0, -1.0, 0.5, big, -big, big / 2, math.inf, -math.inf, math.nan,
                           1e-45, 1e300, -1e300, 3e38, rng.uniform(-10, 10),
                           rng.uniform(-1e6, 1e6)])

    def shape() -> tuple[int, ...]:
        return rng.choice([(3,), (0,), (), (2, 3), (2, 0, 3), (1, 1, 4, 4)])

    def draws(dt: torch.dtype) -> list[tuple[str, Call]]:
        """One call of each op, its arguments drawn now (then fixed for both runs)."""
        a, b, lo, hi, s, k = integer(dt), integer(dt), real(dt), real(dt), shape(), rng.choice(
            [0, 1, 2, 3, 4, -1])
        n, w, flag = min(integer(dt), 5000), [real(dt) for _ in range(3)], rng.random() < 0.5
        return [
            ("randint", lambda: torch.randint(a, b, s, dtype=dt)),
            ("random_", lambda: torch.zeros(s, dtype=dt).random_(a, b)),
            ("random_()", lambda: torch.zeros(s, dtype=dt).random_()),
            ("randperm", lambda: torch.randperm(n, dtype=dt)),
            ("uniform_", lambda: torch.zeros(s, dtype=dt).uniform_(lo, hi)),
            ("normal_", lambda: torch.zeros(s, dtype=dt).normal_(lo, hi)),
            ("normal(float, tensor)", lambda: torch.normal(lo, torch.full(s, hi).to(dt))),
            ("exponential_", lambda: torch.zeros(s, dtype=dt).exponential_(lo)),
            ("bernoulli_", lambda: torch.zeros(s, dtype=dt).bernoulli_(lo)),
            ("bernoulli", lambda: torch.bernoulli(torch.full(s, lo).to(dt))),
            ("dropout", lambda: F.dropout(torch.ones(s, dtype=dt), lo, training=flag)),
            ("native_dropout", lambda: torch.native_dropout(torch.ones(s, dtype=dt), lo, True)),
            ("multinomial", lambda: torch.multinomial(torch.tensor(w).to(dt), k, flag)),
            ("rand", lambda: torch.rand(s, dtype=dt)),
            ("randn_like", lambda: torch.randn_like(torch.zeros(s, dtype=dt))),
            ("rrelu", lambda: F.rrelu(-torch.ones(4, dtype=dt), lo, hi, training=True)),
        ]

    for _ in range(count):
        dt = rng.choice(ALL)
        name, call = rng.choice(draws(dt))
        yield f"{name} {_n(dt)}", call
