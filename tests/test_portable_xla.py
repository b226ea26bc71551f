"""devrng.portable against real JAX (the oracle), on real XLA devices (torch_xla on PJRT CPU)
and on torchax: the same draws on every device, one compilation for every seed and step.

These run in the xla environment (PJRT_DEVICE=CPU); the core environment skips them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import devrng

torch_xla = pytest.importorskip("torch_xla")
jax = pytest.importorskip("jax")
torchax = pytest.importorskip("torchax")
import jax.numpy as jnp  # noqa: E402
import torch_xla.debug.metrics as met  # noqa: E402

pytestmark = [pytest.mark.xla, pytest.mark.torchax]
torch_xla.device()  # start the runtime before any backward pass (see test_jit_xla)
XLA = torch_xla.device()
ENV = torchax.default_env()


def jkey(seed: int, n: int) -> Any:
    return jax.random.fold_in(jax.random.key(seed), n)


def np_of(t: Any) -> np.ndarray:
    if isinstance(t, torchax.tensor.Tensor):
        return np.asarray(t.jax()).copy()
    return t.detach().cpu().numpy()


def compiles() -> int:
    data = met.metric_data("CompileTime")
    return int(data[0]) if data else 0


def ulp_distance(a: np.ndarray, b: np.ndarray, dtype: Any = np.float32) -> int:
    """Largest distance in units in the last place between arrays of ``dtype`` (float32,
    float16, float64, or ml_dtypes' bfloat16)."""
    width = np.dtype(dtype).itemsize * 8
    ints = {16: np.int16, 32: np.int32, 64: np.int64}[width]

    def ordered(x: np.ndarray) -> np.ndarray:
        i = np.asarray(x).astype(dtype).view(ints).astype(object if width == 64 else np.int64)
        sign = 1 << (width - 1)
        return np.where(i < 0, -(i & (sign - 1)), i)

    return int(np.abs(ordered(a) - ordered(b)).max())


@pytest.fixture
def x64() -> Iterator[None]:
    jax.config.update("jax_enable_x64", True)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", False)


# -- JAX is the oracle --------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1, 12345, 2**32 - 1])
@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4), (4096,)])
def test_uniform_and_bits_equal_jax_for_the_stream_keys(seed: int, shape: tuple[int, ...]
                                                        ) -> None:
    from tests._internals import distributions, threefry

    with devrng.portable(seed):
        u0 = torch.rand(shape)
        u1 = torch.empty(shape).uniform_()
    assert np.array_equal(u0.numpy(), np.asarray(jax.random.uniform(jkey(seed, 0), shape)))
    assert np.array_equal(u1.numpy(), np.asarray(jax.random.uniform(jkey(seed, 1), shape)))
    bits = distributions.Source(threefry.fold_in(threefry.seed_key(seed), 2), torch.device("cpu")).bits(shape)
    assert np.array_equal(bits.numpy().view(np.uint32), np.asarray(jax.random.bits(
        jkey(seed, 2), shape, jnp.uint32)))


def test_a_long_randperm_equals_jax() -> None:
    # From 2**20 numbers the kernel first splits each round's words by their key's top byte,
    # and the keys are drawn on torch's threads: still JAX's permutation, with 2 threads too.
    n = 2**20 + 7
    want = np.asarray(jax.random.permutation(jkey(5, 0), n))
    threads = torch.get_num_threads()
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            with devrng.portable(5):
                got = torch.randperm(n)
            assert np.array_equal(got.numpy(), want), count
    finally:
        torch.set_num_threads(threads)


def test_other_distributions_equal_jax() -> None:
    with devrng.portable(77):
        a = torch.randint(-5, 1000, (2000,))
        b = torch.randint(0, 2**31 - 1, (2000,), dtype=torch.int32)
        c = torch.randperm(5000)
        d = torch.bernoulli(torch.full((2000,), 0.3))
        e = F.dropout(torch.ones(2000), 0.25)
        f = torch.empty(2000).uniform_(-2.5, 3.0)
        g = torch.rand(2000, dtype=torch.float16)
        h = torch.rand(2000, dtype=torch.bfloat16)
        i = torch.empty(2000).bernoulli_(torch.linspace(0, 1, 2000))
    assert np.array_equal(a.numpy(), np.asarray(jax.random.randint(jkey(77, 0), (2000,), -5,
                                                                   1000)))
    assert np.array_equal(b.numpy(), np.asarray(jax.random.randint(jkey(77, 1), (2000,), 0,
                                                                   2**31 - 1)))
    assert np.array_equal(c.numpy(), np.asarray(jax.random.permutation(jkey(77, 2), 5000)))
    assert np.array_equal(d.numpy().astype(bool), np.asarray(jax.random.bernoulli(
        jkey(77, 3), 0.3, (2000,))))
    # dropout keeps where JAX's bernoulli(1 - p) is true, as flax's Dropout does
    keep = np.asarray(jax.random.bernoulli(jkey(77, 4), 0.75, (2000,)))
    assert np.array_equal(e.numpy() != 0, keep)
    assert np.array_equal(f.numpy(), np.asarray(jax.random.uniform(jkey(77, 5), (2000,),
                                                                   minval=-2.5, maxval=3.0)))
    assert np.array_equal(g.numpy().view(np.int16), np.asarray(jax.random.uniform(
        jkey(77, 6), (2000,), jnp.float16)).view(np.int16))
    assert np.array_equal(h.float().numpy(), np.asarray(jax.random.uniform(
        jkey(77, 7), (2000,), jnp.bfloat16)).astype(np.float32))
    assert np.array_equal(i.numpy().astype(bool), np.asarray(jax.random.bernoulli(
        jkey(77, 8), jnp.linspace(0, 1, 2000, dtype=jnp.float32))))


def test_float64_uniform_equals_jax_with_x64(x64: None) -> None:
    with devrng.portable(2**40 + 9):  # a seed above 2**32: JAX's key needs x64 too
        u = torch.rand(3000, dtype=torch.float64)
    assert np.array_equal(u.numpy(), np.asarray(jax.random.uniform(
        jkey(2**40 + 9, 0), (3000,), jnp.float64)))


def test_normal_and_exponential_are_close_to_jax() -> None:
    # Not bitwise (devrng computes erfinv and log from IEEE operations, so that every
    # device agrees with every other); the same formula on the same uniforms. JAX's
    # erf_inv on the CPU is up to about 90 ulp from the true value in the tails, devrng's
    # within 5: relative differences up to 1e-5.
    with devrng.portable(5):
        z = torch.randn(100_000)
        e = torch.empty(100_000).exponential_()
    jz = np.asarray(jax.random.normal(jkey(5, 0), (100_000,)))
    je = np.asarray(jax.random.exponential(jkey(5, 1), (100_000,)))
    assert np.allclose(z.numpy(), jz, rtol=1e-5, atol=1e-6) and ulp_distance(e.numpy(), je) <= 4


def test_half_precision_normals_are_jaxs_float32_normals_rounded() -> None:
    # The documented exception: jax.random.normal draws float16 / bfloat16 from 10- and
    # 7-bit uniforms; devrng rounds its float32 draw (within 4 ulp of JAX's), so it is
    # JAX's float32 normal rounded, at most 1 ulp of the narrow type away.
    import ml_dtypes

    with devrng.portable(5):
        half = torch.randn(100_000, dtype=torch.float16)
        brain = torch.randn(100_000, dtype=torch.bfloat16)
    for got, n, dtype in ((half.numpy(), 0, np.float16),
                          (brain.view(torch.int16).numpy().view(ml_dtypes.bfloat16), 1,
                           ml_dtypes.bfloat16)):
        want = np.asarray(jax.random.normal(jkey(5, n), (100_000,))).astype(dtype)
        assert ulp_distance(got, want, dtype) <= 1
        assert np.mean(got == want) > 0.99


def test_complex_normals_split_the_key_like_jax() -> None:
    # Close as the real normals are (see above); drawn from one key, the imaginary parts
    # would be unrelated to JAX's.
    with devrng.portable(8):
        z = torch.randn(50_000, dtype=torch.complex64).numpy()
    jz = np.asarray(jax.random.normal(jkey(8, 0), (50_000,), jnp.complex64))
    assert np.allclose(z, jz, rtol=1e-5, atol=1e-6)


def test_float64_normal_and_exponential_are_close_to_jax(x64: None) -> None:
    # float64 normal and exponential use the device's erfinv and log1p: close, not bitwise.
    with devrng.portable(3):
        z = torch.randn(100_000, dtype=torch.float64).numpy()
        e = torch.empty(100_000, dtype=torch.float64).exponential_().numpy()
    jz = np.asarray(jax.random.normal(jkey(3, 0), (100_000,), jnp.float64))
    je = np.asarray(jax.random.exponential(jkey(3, 1), (100_000,), jnp.float64))
    assert np.max(np.abs(z - jz) / np.abs(jz)) < 1e-12
    assert np.max(np.abs(e - je) / np.abs(je)) < 1e-13


def test_dropout_ties_at_one_minus_p_are_dropped_on_xla_as_on_the_cpu_and_in_jax() -> None:
    # A uniform draw equal to float32(1 - p) is dropped (JAX compares in float32); XLA
    # compared the float32 draw with the Python float 0.9 in float64 and kept it.
    from tests._internals import distributions, threefry

    n = 2**24 + 3
    u = distributions.Source(threefry.fold_in(threefry.seed_key(1), 0), torch.device("cpu")).uniform((n,), torch.float32)
    ties = u == distributions.round_to(0.9, torch.float32)
    assert int(ties.sum()) == 7  # seed 1 has seven
    with devrng.portable(1):
        cpu = F.dropout(torch.ones(n), 0.1)
    with devrng.portable(1):
        xla = F.dropout(torch.ones(n, device=XLA), 0.1).cpu()
    assert bool((cpu[ties] == 0).all())
    assert torch.equal(cpu != 0, xla != 0)
    keep = np.asarray(jax.random.bernoulli(jkey(1, 0), 0.9, (n,)))
    assert np.array_equal(cpu.numpy() != 0, keep)


# -- the same numbers on the CPU, XLA and torchax -----------------------------------------------------
def _draws(device: Any) -> dict[str, Any]:
    with devrng.portable(7):
        return {
            "rand": torch.rand(1000, device=device),
            "randn": torch.randn(100_000, device=device),
            "uniform_": torch.empty(1000, device=device).uniform_(-0.3, 0.7),
            "normal_": torch.empty(1000, device=device).normal_(0.5, 0.02),
            "randint": torch.randint(3, 100, (1000,), device=device),
            "randperm": torch.randperm(300, device=device),
            "bernoulli": torch.bernoulli(torch.full((1000,), 0.3, device=device)),
            "dropout": F.dropout(torch.ones(1000, device=device), 0.2),
            "dropout2d": F.dropout2d(torch.ones(4, 8, 3, 3, device=device), 0.5),
            "exponential_": torch.empty(100_000, device=device).exponential_(),
            "multinomial": torch.multinomial(torch.tensor([0.1, 0.2, 0.3, 0.4], device=device),
                                             50, True),
            "multinomial_rows": torch.multinomial(torch.tensor(
                [[0.1, 0.2, 0.3, 0.4, 0.0], [1, 1, 1, 1, 1.0]], device=device), 3),
            "kaiming": torch.nn.init.kaiming_uniform_(torch.empty(16, 16, device=device)),
        }


CLOSE = {"randn", "normal_", "exponential_"}  # erfinv / log: within 4 ulp, not bitwise


@pytest.fixture(scope="module")
def cpu_draws() -> dict[str, np.ndarray]:
    return {k: np_of(v) for k, v in _draws("cpu").items()}


@pytest.mark.parametrize("where", ["xla", "torchax"])
def test_every_device_draws_the_same_numbers(where: str, cpu_draws: dict[str, np.ndarray]
                                             ) -> None:
    if where == "xla":
        got = {k: np_of(v) for k, v in _draws(XLA).items()}
    else:
        with ENV:  # portable inside torchax's environment, so that it answers first
            got = {k: np_of(v) for k, v in _draws("jax").items()}
    for name, want in cpu_draws.items():
        if name in CLOSE:
            assert ulp_distance(got[name], want) <= 4, name
        else:
            assert np.array_equal(got[name].astype(want.dtype), want), name


NORMAL_SCALINGS = [(0.5, 0.02), (-3.0, 2.5), (1000.0, 7.0), (0.1, 0.3), (1e-3, 1.0 / 3)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16,
                                   torch.complex64])
def test_torchax_scales_normal_draws_as_the_cpu(dtype: torch.dtype) -> None:
    # Before: scaled in the dtype (JAX has no float64 without x64): 20% of float32 values
    # 1 ulp of the larger term away (104,858 ulp of the result where it cancels), 461
    # bfloat16 and 46 float16 signs flipped in 10**6; complex parts also divided by sqrt(2)
    # through JAX's reciprocal, 38% of them 1 ulp off). Now from float32 pieces, and the
    # division corrected by its remainder: equal (0 of 10**6 per dtype, measured).
    n = 50_000
    def draws(device: str) -> list[np.ndarray]:
        out = []
        with devrng.portable(9):
            for mean, std in NORMAL_SCALINGS:
                out.append(torch.empty(n, dtype=dtype, device=device).normal_(mean, std))
            out.append(torch.randn(n, dtype=dtype, device=device))
            out.append(torch.normal(torch.full((n,), 0.1, dtype=dtype, device=device),
                                    torch.full((n,), 0.3, device=device).to(
                                        torch.float32 if dtype.is_complex else dtype)))
        return [np_of(t.to(torch.float32) if dtype == torch.bfloat16 else t) for t in out]

    cpu = draws("cpu")
    with ENV:
        jx = draws("jax")
    for k, (want, got) in enumerate(zip(cpu, jx, strict=True)):
        assert np.array_equal(got.astype(want.dtype), want), k


def test_torchax_refuses_float64_draws_without_jax_x64() -> None:
    # JAX without x64 would make float32 numbers, silently; the same for every float64 draw.
    # (Making a float64 torchax tensor inside portable without x64 is refused: below.)
    calls = [lambda: torch.rand(4, dtype=torch.float64, device="jax"),
             lambda: torch.randn(4, dtype=torch.float64, device="jax"),
             lambda: torch.normal(2.0, 0.5, (4,), dtype=torch.float64, device="jax"),
             lambda: torch.randn(4, dtype=torch.complex128, device="jax")]
    for call in calls:
        with pytest.raises(devrng.DevRNGError, match=r"float64 numbers on torchax.*"
                                                     r"jax\.config\.update\('jax_enable_x64', True\)"):
            with ENV, devrng.portable(0):
                call()


def test_torchax_refuses_to_make_float64_tensors_inside_portable_without_jax_x64() -> None:
    # Before: torch.zeros(dtype=torch.float64, device="jax") became float32 silently, and
    # uniform_, normal_ and exponential_ on it drew float32 numbers (64 of 64 cases other
    # values than the CPU's float64 ones). Inside portable every way to make one is refused.
    with ENV:
        jx = torch.zeros(4, device="jax")
    cpu64 = torch.zeros(4, dtype=torch.float64)
    calls = {"torch.zeros": lambda: torch.zeros(4, dtype=torch.float64, device="jax"),
             "torch.tensor": lambda: torch.tensor([1.0], dtype=torch.float64, device="jax"),
             "torch.zeros_like": lambda: torch.zeros_like(jx, dtype=torch.float64),
             "torch.Tensor.to": lambda: cpu64.to("jax"),
             "torch.Tensor.double": lambda: jx.double()}
    for name, call in [*calls.items(), ("torch.Tensor.to", lambda: jx.to(torch.float64))]:
        with ENV, devrng.portable(0), pytest.raises(devrng.DevRNGError, match=(
                rf"{re.escape(name)} would make a float64 torchax tensor, which torchax makes "
                r"float32 while JAX has no 64-bit floats: draws into it would be float32 "
                r"numbers.*jax\.config\.update\('jax_enable_x64', True\)")):
            call()
    with ENV, devrng.portable(0):  # float64 elsewhere, and float32 on torchax, are drawn
        assert jx.to("cpu", torch.float64).dtype == torch.float64
        assert torch.zeros(4, dtype=torch.float64).uniform_().dtype == torch.float64
        assert jx.to(torch.float32).uniform_().dtype == torch.float32


def test_torchax_makes_float64_tensors_inside_portable_with_x64(x64: None) -> None:
    with ENV, devrng.portable(0):
        made = torch.zeros(4, dtype=torch.float64, device="jax").uniform_()
    with devrng.portable(0):
        cpu = torch.zeros(4, dtype=torch.float64).uniform_()
    assert made.dtype == torch.float64 and np.array_equal(np_of(made), cpu.numpy())


def test_torchax_float64_draws_with_x64_match_the_cpu(x64: None) -> None:
    # Uniforms bitwise; normal and exponential use each device's erfinv and log1p (JAX makes
    # them itself on torchax: torchax 0.0.13 multiplies float64 tensors in float32).
    def draws(device: str) -> list[np.ndarray]:
        with devrng.portable(2**40 + 1):
            return [np_of(t) for t in (
                torch.rand(50_000, dtype=torch.float64, device=device),
                torch.empty(50_000, dtype=torch.float64, device=device).uniform_(-0.3, 0.7),
                torch.randn(50_000, dtype=torch.float64, device=device),
                torch.empty(50_000, dtype=torch.float64, device=device).normal_(0.5, 0.02),
                torch.empty(50_000, dtype=torch.float64, device=device).exponential_(3.0))]

    cpu = draws("cpu")
    with ENV:
        jax_draws = draws("jax")
    assert all(d.dtype == np.float64 for d in jax_draws)
    assert np.array_equal(cpu[0], jax_draws[0]) and np.array_equal(cpu[1], jax_draws[1])
    for want, got in zip(cpu[2:], jax_draws[2:], strict=True):
        assert np.max(np.abs(got - want) / np.abs(want)) < 1e-12


# -- bounded uniforms: the CPU's bits on every device ------------------------------------------------
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
BOUNDED = [(-0.3, 0.7), (-3.0, 2.0), (0.1, 0.2), (1000.0, 1001.5), (2.0 ** -60, 1.0 + 2.0 ** -22)]


def as_float64(t: Any) -> np.ndarray:
    if isinstance(t, torchax.tensor.Tensor):
        return np.asarray(t.jax()).astype(np.float64)
    return t.detach().cpu().to(torch.float64).numpy()


def _bounded(device: Any, dtype: torch.dtype, rrelu: bool = True) -> list[np.ndarray]:
    with devrng.portable(11):
        out = [torch.empty(1000, dtype=dtype, device=device).uniform_(lo, hi) for lo, hi in BOUNDED]
        out.append(torch.nn.init.kaiming_uniform_(torch.empty(32, 32, dtype=dtype, device=device)))
        out.append(torch.nn.init.xavier_uniform_(torch.empty(16, 48, dtype=dtype, device=device)))
        if rrelu:
            out.append(F.rrelu(-torch.ones(1000, dtype=dtype, device=device), training=True))
    return [as_float64(t) for t in out]


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("where", ["xla", "torchax", "torchax-x64"])
def test_bounded_uniforms_are_the_cpus_bits_on_every_device(where: str, dtype: torch.dtype,
                                                            request: pytest.FixtureRequest
                                                            ) -> None:
    # Before: float64 on XLA and on torchax with x64 differed from the CPU in about half of
    # the draws (the CPU rounded u * span, then the sum; XLA fused them into one rounding),
    # bfloat16 on torchax by up to 102 ulp (JAX rounds the product to bfloat16 first).
    if where == "torchax" and dtype == torch.float64:
        pytest.skip("refused without x64 (test_torchax_refuses_float64_draws_without_jax_x64)")
    if where == "torchax-x64":
        request.getfixturevalue("x64")
    # torchax 0.0.13 multiplies float64 tensors in float32 (rrelu's x * slope: not a draw).
    rrelu = where == "xla" or dtype != torch.float64
    cpu = _bounded("cpu", dtype, rrelu)
    if where == "xla":
        got = _bounded(XLA, dtype)
    else:
        with ENV:
            got = _bounded("jax", dtype, rrelu)
    for i, (want, values) in enumerate(zip(cpu, got, strict=True)):
        assert np.array_equal(values, want), (i, int((values != want).sum()))


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("jax_x64", [False, True])
def test_rounding_to_odd_runs_the_same_on_xla_and_in_jax(dtype: torch.dtype, jax_x64: bool,
                                                         request: pytest.FixtureRequest) -> None:
    # Unit draws whose products sit on rounding midpoints, bounds whose sums are not exact in
    # the wider type: the rounding to odd decides, on the CPU (checked against exact
    # arithmetic in tests/test_portable.py), XLA and JAX alike.
    from tests._internals import JAX_OPS, distributions
    from tests.test_portable import odd_cases

    if jax_x64:
        request.getfixturevalue("x64")
    bits = {torch.float16: 10, torch.bfloat16: 7, torch.float32: 23, torch.float64: 52}[dtype]
    ks = list(range(1, 1 << min(bits, 11)))  # the small ones, whose products are short
    if bits > 11:
        ks += [(j * 2654435761) % (1 << bits) for j in range(1, 2048)]  # and spread ones
    u = (torch.tensor(ks, dtype=torch.float64) * 2.0 ** -bits).to(dtype)
    wide = {torch.float16: torch.float32, torch.bfloat16: torch.float32,
            torch.float32: torch.float64, torch.float64: torch.float64}[dtype]
    twice = 0
    for low, high in [*odd_cases(dtype), (-3.0, 2.0)]:
        lo, span = distributions.bounds(low, high, dtype)
        cpu = distributions.scale_shift(u, lo, span, dtype, True)
        xla = distributions.scale_shift(u.to(XLA), lo, span, dtype, True).cpu()
        assert torch.equal(xla, cpu), (low, high)
        # Rounded in the wider type, then to dtype (float64: the product, then the sum).
        twice += int(((u.to(wide) * span + lo).to(dtype) != cpu).sum())
        if dtype == torch.float64 and not jax_x64:
            continue
        ju = jnp.asarray(u.to(torch.float64).numpy()).astype(
            jnp.dtype(str(dtype).removeprefix("torch.")))
        got = distributions.scale_shift(ju, lo, span, dtype, False, JAX_OPS)  # as on torchax
        assert np.array_equal(np.asarray(got).astype(np.float64), cpu.to(torch.float64).numpy())
    assert twice  # the cases need the rounding to odd


def test_bounded_float32_and_float64_uniforms_are_jaxs(x64: None) -> None:
    # JAX's uniform(minval, maxval) is the same formula, which XLA fuses into one rounding.
    for dtype, jnp_dtype in ((torch.float32, jnp.float32), (torch.float64, jnp.float64)):
        with devrng.portable(31):
            draws = [torch.empty(2000, dtype=dtype).uniform_(lo, hi) for lo, hi in BOUNDED]
        for n, ((lo, hi), got) in enumerate(zip(BOUNDED, draws, strict=True)):
            want = np.asarray(jax.random.uniform(jkey(31, n), (2000,), jnp_dtype, lo, hi))
            assert np.array_equal(got.numpy(), want), (dtype, lo, hi)


def test_draws_that_would_pass_through_subnormal_numbers_are_refused_where_they_flush() -> None:
    # XLA and JAX on the CPU flush float32 (and bfloat16, float64) numbers below the
    # smallest normal one to zero; float16 ones are kept.
    tiny = torch.tensor([1e-39, 3e-39])
    assert torch.equal((tiny.to(XLA) * 3.0).cpu(), torch.zeros(2))
    with ENV:
        assert not bool((torch.tensor([1e-39, 3e-39], device="jax") * 3.0).any())
    for device, name in ((XLA, "XLA"), ("jax", "torchax")):
        for dtype in (torch.float32, torch.bfloat16):
            with ENV, devrng.portable(0), pytest.raises(devrng.DevRNGError, match=(
                    rf"{name} flushes {str(dtype).removeprefix('torch.')} numbers below "
                    r"1.18e-38 to zero, and uniform draws on \[0.0, 1e-39\) can be such numbers "
                    r"\(the smallest nonzero one is about")):
                torch.empty(8, dtype=dtype, device=device).uniform_(0.0, 1e-39)
    with devrng.portable(2):
        cpu = torch.empty(2000, dtype=torch.float16).uniform_(0.0, 1e-5)  # float16 subnormals
    with devrng.portable(2):
        xla = torch.empty(2000, dtype=torch.float16, device=XLA).uniform_(0.0, 1e-5).cpu()
    with ENV, devrng.portable(2):
        jx = as_float64(torch.empty(2000, dtype=torch.float16, device="jax").uniform_(0.0, 1e-5))
    assert bool((cpu < torch.finfo(torch.float16).tiny).any())
    assert torch.equal(xla, cpu) and np.array_equal(jx, cpu.to(torch.float64).numpy())


@pytest.mark.parametrize(("dtype", "low", "high"), [
    (torch.float32, 1e-30, 1e-29), (torch.float32, -1e-33, -1e-34), (torch.float32, 0.0, 1e-30),
    (torch.bfloat16, 1e-36, 1e-35)])
def test_narrow_ranges_whose_draws_are_normal_are_drawn_where_subnormals_flush(
        dtype: torch.dtype, low: float, high: float) -> None:
    # Before: refused on XLA and torchax (bounds within about 1e-38 of zero). Only draws
    # that are themselves nonzero subnormal numbers are refused now (above); the formula's
    # steps are scaled out of the flushed range and back, the CPU's bits.
    with devrng.portable(5):
        cpu = torch.empty(3000, dtype=dtype).uniform_(low, high)
    with devrng.portable(5):
        xla = torch.empty(3000, dtype=dtype, device=XLA).uniform_(low, high).cpu()
    with ENV, devrng.portable(5):
        jx = as_float64(torch.empty(3000, dtype=dtype, device="jax").uniform_(low, high))
    assert torch.equal(xla, cpu)
    assert np.array_equal(jx, cpu.to(torch.float64).numpy())
    assert bool(((cpu == 0) | (cpu.abs() >= torch.finfo(dtype).tiny)).all())  # normal or 0


def _bounded_step(x: torch.Tensor) -> list[torch.Tensor]:
    out = [torch.empty(64, dtype=dt, device=x.device).uniform_(-3.0, 2.0) for dt in FLOATS]
    out.append(torch.empty(64, device=x.device).uniform_(2.0 ** -60, 1.0 + 2.0 ** -22))
    out.append(torch.nn.init.kaiming_uniform_(torch.empty(8, 8, dtype=torch.float64,
                                                          device=x.device)))
    return [t + x.to(t.dtype)[:t.shape[-1]] for t in out]


@pytest.mark.parametrize("backend", ["torch_xla", "openxla"])
def test_bounded_uniforms_in_compiled_xla_code_are_eagers_cpu_bits(backend: str) -> None:
    # The exact rounding runs on XLA with lowered ops only (torch_xla runs frexp and
    # nextafter on the host, and its dynamo bridge cannot take bit casts).
    x = torch.zeros(64, device=XLA)
    torch_xla.sync()
    with devrng.portable(0):
        step = devrng.seeded_jit(_bounded_step, backend=backend)
        got = [t.cpu() for t in step(x, seed=5)]
    with devrng.portable(5):
        want = _bounded_step(torch.zeros(64))
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.dtype == w.dtype and torch.equal(g, w), i


def test_bounded_uniforms_on_xla_run_no_op_on_the_host() -> None:
    before = {n for n in met.counter_names() if n.startswith("aten::")}
    with devrng.portable(0):
        for dt in FLOATS:
            torch.empty(100, dtype=dt, device=XLA).uniform_(2.0 ** -60, 256.0 + 2.0 ** -14)
    torch_xla.sync()
    assert {n for n in met.counter_names() if n.startswith("aten::")} == before


def _half_dropouts(device: Any, dtype: torch.dtype, x: torch.Tensor) -> list[Any]:
    with devrng.portable(13):
        return [F.dropout(x, 0.3), F.alpha_dropout(x, 0.3, True),
                F.dropout2d(x.reshape(10, 10, 10), 0.3), torch.native_dropout(x, 0.3, True)[0],
                F.rrelu(x, training=True), torch.normal(x, 0.5),
                F.dropout(x.clone(), 0.4, inplace=True)]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16],
                         ids=lambda d: str(d).removeprefix("torch."))
def test_half_precision_dropout_is_the_cpus_bits_and_dtype_everywhere(dtype: torch.dtype) -> None:
    # Before: XLA kept x * mask / keep in float32 before rounding (662 of 1000 float16 values
    # differed), torchax returned float32 for float16 dropout (a half tensor times a Python
    # number). The scaling is float32, rounded once, on every device.
    values = torch.linspace(-2, 2, 1000, dtype=dtype)
    cpu = _half_dropouts("cpu", dtype, values)
    xla = _half_dropouts(XLA, dtype, values.to(XLA))
    with ENV:
        tx = _half_dropouts("jax", dtype, torch.tensor(values.tolist(), dtype=dtype,
                                                        device="jax"))
    for i, want in enumerate(cpu):
        for got in (xla[i], tx[i]):
            assert got.dtype == dtype, (i, got.dtype)
            assert np.array_equal(as_float64(got), as_float64(want)), i


def test_normal_with_a_mean_and_std_keeps_a_half_dtype_on_torchax() -> None:
    # torchax made float32 of torch.normal(0.5, 0.02, size, dtype=float16).
    with ENV, devrng.portable(1):
        got = [torch.normal(0.5, 0.02, (100,), dtype=dt, device="jax")
               for dt in (torch.float16, torch.bfloat16)]
        both = torch.normal(torch.zeros(4, device="jax"), torch.ones(4, device="jax"))
    assert [g.dtype for g in got] == [torch.float16, torch.bfloat16]
    assert both.dtype == torch.float32  # two tensors of one dtype (torchax has no promote_types)


def test_trunc_normal_is_torchs_code_around_the_streams_draws() -> None:
    # The documented exception. torch 2.9's trunc_normal_ turns a portable uniform draw
    # into a normal with the device's erfinv_: CPU and XLA within 64 ulp (58 measured with
    # std=0.02, as transformers' inits use), not bitwise; torchax has no erfinv_ and raises.
    def init(device: Any) -> np.ndarray:
        with devrng.portable(4):
            return np_of(torch.nn.init.trunc_normal_(torch.empty(100_000, device=device),
                                                     std=0.02))

    cpu, xla = init("cpu"), init(XLA)
    assert 0 < ulp_distance(cpu, xla) <= 64 and float(np.abs(cpu).max()) <= 2.0
    with pytest.raises(Exception, match="erfinv"):
        with ENV:
            init("jax")


def test_xla_refuses_uncovered_ops_too() -> None:
    with pytest.raises(devrng.DevRNGError, match=r"torch\.poisson"):
        with devrng.portable(0):
            torch.poisson(torch.ones(3, device=XLA))


# -- XLA graphs: the key is runtime data ------------------------------------------------------
def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.4),
                               torch.nn.Linear(32, 4))


def _train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
                y: torch.Tensor) -> torch.Tensor:
    opt.zero_grad()
    hidden = model[:3](x)
    loss = F.mse_loss(model[3](hidden), y)
    loss.backward()
    opt.step()
    return (hidden != 0).detach()  # the dropout mask (ReLU zeros are the same everywhere)


@pytest.mark.parametrize("compiled", [False, True], ids=["lazy", "torch_xla.compile"])
def test_an_xla_training_step_compiles_once_for_every_seed_and_step(compiled: bool) -> None:
    model = _model().to(XLA)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 16).to(XLA), torch.randn(8, 4).to(XLA)
    torch_xla.sync()

    def step() -> torch.Tensor:
        return _train_step(model, opt, x, y)

    run = torch_xla.compile(step) if compiled else step
    masks, counts = [], []
    for seed in range(4):
        with devrng.portable(seed):
            for _ in range(3):
                mask = run()
                torch_xla.sync()
                counts.append(compiles())
                masks.append(mask.cpu())
    assert counts[1:] == [counts[0]] * (len(counts) - 1)  # nothing after the first step
    cpu_model = _model()
    cpu_opt = torch.optim.SGD(cpu_model.parameters(), lr=0.1)
    cpu_x, cpu_y = x.cpu(), y.cpu()
    cpu_masks = []
    for seed in range(4):
        with devrng.portable(seed):
            cpu_masks += [_train_step(cpu_model, cpu_opt, cpu_x, cpu_y) for _ in range(3)]
    for got, want in zip(masks, cpu_masks, strict=True):
        assert torch.equal(got, want)
    assert not torch.equal(masks[0], masks[3])  # a new seed, a new mask


def test_compare_devices_on_a_model_with_dropout_is_exact_only_with_portable() -> None:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Dropout(0.5),
                              torch.nn.Linear(64, 8)).train()
    x = torch.randn(16, 32)
    plain = devrng.testing.compare_devices(net, x, devices=("cpu", "xla:0"))
    portable = devrng.testing.compare_devices(net, x, devices=("cpu", "xla:0"), portable=True)
    assert not plain.ok and plain.mismatch_ratio > 0.2  # different masks: noise
    assert portable.ok, str(portable)


# -- seeded_jit on the XLA compilers and torchax ------------------------------------------------------
def _fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (F.dropout(x, 0.5), torch.rand(x.shape, device=x.device),
            torch.empty(x.shape, device=x.device).uniform_(-1, 1))


def _inputs(backend: str) -> torch.Tensor:
    if backend == "torchax":
        with ENV:
            return torch.ones(4, 8).to("jax")
    x = torch.ones(4, 8).to(XLA)
    torch_xla.sync()
    return x


@pytest.mark.parametrize("backend", ["torch_xla", "openxla", "torchax"])
def test_seeded_jit_inside_portable_equals_eager_and_compiles_once(backend: str) -> None:
    x = _inputs(backend)
    step = devrng.seeded_jit(_fn, backend=backend)
    counts, outs = [], {}
    with devrng.portable(0) as outer:
        for seed in (1, 2, 3, 1, 4):
            outs.setdefault(seed, []).append([np_of(t) for t in step(x, seed=seed)])
            counts.append(step.compile_count)
    assert outer.counter == 0 and counts == [counts[0]] * 5 and counts[0] >= 1
    for seed, runs in outs.items():
        if backend == "torchax":
            with ENV, devrng.portable(seed):
                want = [np_of(t) for t in _fn(x)]
        else:
            with devrng.portable(seed):
                want = [np_of(t) for t in _fn(x)]
        for got in runs:
            for g, w in zip(got, want, strict=True):
                assert np.array_equal(g, w)
    assert not np.array_equal(outs[1][0][0], outs[2][0][0])


def test_torchax_portable_draws_are_jax_uniforms_under_jit_too() -> None:
    x = _inputs("torchax")
    step = devrng.seeded_jit(lambda x: torch.rand(x.shape, device=x.device), backend="torchax")
    with devrng.portable(0):
        got = np_of(step(x, seed=99))
    assert np.array_equal(got, np.asarray(jax.random.uniform(jkey(99, 0), (4, 8))))


def test_plain_openxla_compile_keeps_the_draws_right_outside_the_graph() -> None:
    # torch.compile(backend="openxla") would bake the first step's key into its graph:
    # portable refuses to trace the draw, so dynamo runs it eagerly (lazily on XLA) and
    # the numbers stay right; fullgraph=True says why and what to use instead.
    def fn(x: torch.Tensor) -> torch.Tensor:
        return F.dropout(x, 0.5)

    x = _inputs("openxla")
    compiled = torch.compile(fn, backend="openxla")
    with devrng.portable(3):
        got = [np_of(compiled(x)) for _ in range(2)]
    with devrng.portable(3):
        want = [np_of(fn(x)) for _ in range(2)]
    assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))
    strict = torch.compile(lambda x: F.dropout(x, 0.5), backend="openxla", fullgraph=True)
    with pytest.raises(Exception, match=r"seeded_jit\(fn, backend='openxla'\)"):
        with devrng.portable(0):
            strict(x)


def test_openxla_training_step_inside_portable_draws_eagers_masks() -> None:
    # A whole step (backward and optimizer inside) compiled by seeded_jit's openxla inside a
    # portable block: each call's masks are those of the eager step in portable(seed).
    model = _model().to(XLA)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 16).to(XLA), torch.randn(8, 4).to(XLA)
    torch_xla.sync()
    step = devrng.seeded_jit(lambda x, y: _train_step(model, opt, x, y), backend="openxla")
    counts, masks = [], []
    with devrng.portable(0):
        for seed in (1, 2, 1, 3):
            masks.append(step(x, y, seed=seed).cpu())
            counts.append(step.compile_count)
    assert counts[1:] == [counts[0]] * 3
    cpu_model = _model()
    cpu_opt = torch.optim.SGD(cpu_model.parameters(), lr=0.1)
    for seed, got in zip((1, 2, 1, 3), masks, strict=True):
        with devrng.portable(seed):
            assert torch.equal(got, _train_step(cpu_model, cpu_opt, x.cpu(), y.cpu()))
    assert not torch.equal(masks[0], masks[1])


@pytest.mark.parametrize("shape", [(0,), (5,), (3, 7), (4096,)])
def test_the_xla_computation_equals_the_reference_and_is_one_node(shape: tuple[int, ...]) -> None:
    from tests import _threefry_ref as ref
    from tests._internals import threefry, xla_bits

    key = threefry.fold_in(threefry.seed_key(11), 4)
    on_xla = threefry.key_tensor(key, XLA)
    bits = xla_bits(on_xla, shape, 1)
    words = xla_bits(on_xla, shape, 2)
    assert np.array_equal(np_of(bits).view(np.uint32), ref.bits(key, shape))
    hi, lo = ref.words(key, shape)
    assert np.array_equal(np_of(words[0]).view(np.uint32), hi)
    assert np.array_equal(np_of(words[1]).view(np.uint32), lo)
    # Tracing cost: the draw is a handful of IR nodes, not the ~250 ops of the rounds.
    fresh = xla_bits(threefry.key_tensor(key, XLA), shape, 1)
    assert len(torch_xla._XLAC._get_xla_tensors_text([fresh]).splitlines()) < 20
