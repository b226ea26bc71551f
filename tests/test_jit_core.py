"""seeded_jit's contract on the backends every environment has: eager and inductor.

Inductor compiles for tens of seconds on these machines, so each backend's
training step is compiled once per module (``steps`` fixture) and the seed
sequence 11, 12, 11, 13, 12 is run as the very first calls of that compiled
function, so the first (compiling) call is part of what is checked.
"""

from __future__ import annotations

import re
import sys
from typing import Any

import pytest
import torch
from tests._helpers import extra_install_command
from tests._internals import COMPILERS_PACKAGE, auto_compiler, nth_seed

import devrng
from devrng import DevRNGError

SEEDS = (11, 12, 11, 13, 12)
BACKENDS = ("eager", "inductor")


def _model() -> torch.nn.Module:
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.5),
                               torch.nn.Linear(16, 1))


class Case:
    """One backend's compiled training step with its model, data and first-call results."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.model = _model()
        self.init = {k: v.clone() for k, v in self.model.state_dict().items()}
        g = torch.Generator().manual_seed(2)
        self.x = torch.randn(4, 8, generator=g)
        self.y = torch.randn(4, 1, generator=g)
        model = self.model

        def train_step(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            with torch.no_grad():  # the optimizer step: plain SGD
                for p in model.parameters():
                    p.sub_(0.1 * p.grad)
                    p.grad = None
            return loss.detach(), torch.rand(3)

        self.step = devrng.seeded_jit(train_step, backend=backend)

    def reset(self) -> None:
        self.model.load_state_dict(self.init)

    def weights(self) -> list[torch.Tensor]:
        return [p.detach().clone() for p in self.model.parameters()]

    def run(self, seed: Any = None) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """One step from the initial weights: (loss, rand draw, weights after)."""
        self.reset()
        loss, noise = self.step(self.x, self.y, seed=seed)
        return loss, noise, self.weights()


def _same(a: Any, b: Any) -> bool:
    return all(torch.equal(p, q) for p, q in zip(torch.utils._pytree.tree_leaves(a),
                                                 torch.utils._pytree.tree_leaves(b), strict=True))


@pytest.fixture(scope="module", params=BACKENDS)
def case(request: pytest.FixtureRequest) -> Any:
    c = Case(request.param)
    # The first calls of the fresh compiled function: the compiling call is seed 11.
    c.first_results = []  # type: ignore[attr-defined]
    c.cpu_unchanged = []  # type: ignore[attr-defined]
    c.counts = []  # type: ignore[attr-defined]
    for seed in SEEDS:
        before = torch.get_rng_state()
        c.first_results.append(c.run(seed))  # type: ignore[attr-defined]
        c.cpu_unchanged.append(torch.equal(before, torch.get_rng_state()))  # type: ignore[attr-defined]
        c.counts.append(c.step.compile_count)  # type: ignore[attr-defined]
    return c


def test_equal_seeds_give_bitwise_equal_outputs_first_call_included(case: Any) -> None:
    res = dict(zip(range(len(SEEDS)), case.first_results, strict=True))
    assert _same(res[0], res[2])  # seed 11: the compiling call and a cached one
    assert _same(res[1], res[4])  # seed 12


def test_different_seeds_give_different_draws(case: Any) -> None:
    by_seed = {s: case.first_results[SEEDS.index(s)] for s in (11, 12, 13)}
    for a, b in ((11, 12), (11, 13), (12, 13)):
        assert not torch.equal(by_seed[a][0], by_seed[b][0]), "dropout masks did not change"
        assert not torch.equal(by_seed[a][1], by_seed[b][1]), "torch.rand did not change"


def test_auto_and_eager_draw_their_own_numbers_for_one_seed() -> None:
    """docs/seeded-jit.md: a seed makes each backend reproducible, not backends equal
    (``portable`` makes them equal: tests/test_portable.py)."""
    def noise(x: torch.Tensor) -> torch.Tensor:  # its own code object: its own compilation
        return torch.nn.functional.dropout(x, 0.5) + torch.rand(x.shape)

    auto, eager = devrng.seeded_jit(noise), devrng.seeded_jit(noise, backend="eager")
    x = torch.ones(64)
    a, e = auto(x, seed=3), eager(x, seed=3)
    assert auto.backend == "inductor"
    assert torch.equal(a, auto(x, seed=3)) and torch.equal(e, eager(x, seed=3))
    assert not torch.equal(a, e)


def test_new_seeds_never_recompile(case: Any) -> None:
    counts = case.counts
    if case.backend == "eager":
        assert counts == [0] * len(SEEDS)
    else:
        assert counts[0] >= 1
        assert counts == [counts[0]] * len(SEEDS)
        from torch._dynamo.utils import counters

        graphs = counters["stats"]["unique_graphs"]  # dynamo's own count, read directly
        case.run(seed=987654321)
        case.run(seed=2**64 - 1)
        assert case.step.compile_count == counts[0]
        assert counters["stats"]["unique_graphs"] == graphs


def test_callers_cpu_rng_state_is_unchanged(case: Any) -> None:
    assert all(case.cpu_unchanged)
    torch.manual_seed(5)
    expected = torch.rand(4)
    torch.manual_seed(5)
    case.run(seed=3)
    assert torch.equal(torch.rand(4), expected)


def test_training_twice_from_same_weights_and_seeds_is_bitwise_equal(case: Any) -> None:
    def train(seeds: tuple[int, ...]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        case.reset()
        losses = [case.step(case.x, case.y, seed=s)[0] for s in seeds]
        return losses, case.weights()

    a, b, c = train((1, 2, 3)), train((1, 2, 3)), train((4, 5, 6))
    assert _same(a, b)
    assert not any(torch.equal(p, q) for p, q in zip(a[0], c[0], strict=True))
    assert not _same(a[1], c[1])
    assert a[1][0].shape == (16, 8) and not _same(a[1], list(case.init.values()))  # it trained


def test_seed_tensor_equals_int_seed(case: Any) -> None:
    count = case.step.compile_count
    assert _same(case.run(torch.tensor(11)), case.first_results[0])
    assert _same(case.run(torch.tensor(13, dtype=torch.int32)), case.first_results[3])
    # int64 -1 is the unsigned 64-bit seed 2**64 - 1
    assert _same(case.run(torch.tensor(-1)), case.run(2**64 - 1))
    assert case.step.compile_count == count


def test_seed_none_follows_the_stream_and_state_dict_resumes_it(case: Any) -> None:
    step = case.step
    step.load_state_dict({"base_seed": 77, "counter": 0})
    sd = step.state_dict()
    assert (sd["base_seed"], sd["counter"]) == (77, 0)
    a1, a2 = case.run(), case.run()
    assert (step.state_dict()["base_seed"], step.state_dict()["counter"]) == (77, 2)
    assert not torch.equal(a1[0], a2[0])
    assert _same(a2, case.run(nth_seed(77, 1)))  # explicit seeds do not move the stream
    step.load_state_dict(sd)
    assert _same(case.run(), a1)
    assert _same(case.run(), a2)


# -- cheap checks on eager --------------------------------------------------------------

def _dropout(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.dropout(x, 0.5, training=True)


def test_base_seed_is_drawn_from_torchs_default_generator() -> None:
    torch.manual_seed(3)
    a = devrng.seeded_jit(_dropout, backend="eager")
    torch.manual_seed(3)
    b = devrng.seeded_jit(_dropout, backend="eager")
    torch.manual_seed(4)
    c = devrng.seeded_jit(_dropout, backend="eager")
    assert a.base_seed == b.base_seed != c.base_seed
    x = torch.ones(64)
    assert torch.equal(a(x), b(x))
    assert not torch.equal(a(x), a(x))  # the stream moves on
    assert devrng.seeded_jit(_dropout, backend="eager", seed=9).base_seed == 9


def test_stream_seeds_of_neighbouring_bases_are_distinct() -> None:
    seeds = {nth_seed(base, n) for base in range(200) for n in range(50)}
    assert len(seeds) == 200 * 50
    assert all(0 <= s < 2**64 for s in seeds)
    # well mixed: about half of the bits flip between neighbouring bases
    flips = [bin(nth_seed(b, 0) ^ nth_seed(b + 1, 0)).count("1") for b in range(200)]
    assert 24 < sum(flips) / len(flips) < 40


def test_decorator_forms() -> None:
    @devrng.seeded_jit
    def plain(x: torch.Tensor) -> torch.Tensor:
        return _dropout(x)

    @devrng.seeded_jit(backend="eager", seed=5)
    def configured(x: torch.Tensor) -> torch.Tensor:
        """Doc kept."""
        return _dropout(x)

    assert plain.backend == "auto" and plain.compile_count == 0
    assert configured.backend == "eager" and configured.base_seed == 5
    assert configured.__name__ == "configured" and configured.__doc__ == "Doc kept."
    x = torch.ones(32)
    assert torch.equal(configured(x, seed=1), configured(x, seed=1))
    assert "backend='eager'" in repr(configured)


def test_auto_chooses_inductor_for_cpu_inputs() -> None:
    assert auto_compiler((torch.ones(2),), {}) == "inductor"
    assert auto_compiler((), {"m": torch.nn.Linear(2, 2), "n": 3}) == "inductor"


def test_callers_state_is_restored_when_fn_raises() -> None:
    def boom(x: torch.Tensor) -> torch.Tensor:
        torch.rand(5)
        raise RuntimeError("boom")

    step = devrng.seeded_jit(boom, backend="eager")
    before = torch.get_rng_state()
    with pytest.raises(RuntimeError, match="boom"):
        step(torch.ones(2), seed=1)
    assert torch.equal(before, torch.get_rng_state())


def test_eager_seeds_and_restores_a_simulated_cuda_device(simulate_device: Any) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():  # before the simulation: a CUDA build would try to reach a GPU
        x = torch.empty(2, device="cuda:0")
    fake = simulate_device("cuda", count=2)

    def draw(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return fake.draw(0), fake.draw(1)

    step = devrng.seeded_jit(draw, backend="eager")
    before = [g.get_state() for g in fake.generators]
    a, b, c = step(x, seed=8), step(x, seed=8), step(x, seed=9)
    assert _same(a, b) and not torch.equal(a[0], c[0])
    assert all(torch.equal(s, g.get_state()) for s, g in zip(before, fake.generators, strict=True))


# -- errors -------------------------------------------------------------------------------

@pytest.mark.parametrize(("seed", "exc", "match"), [
    (1.5, TypeError, r"seed must be None, an int in \[0, 2\*\*64\) or a 0-d integer tensor, not 1\.5"),
    (True, TypeError, r"not True \(a bool\)"),
    ("7", TypeError, r"not '7' \(a str\)"),
    (-1, ValueError, r"seed=-1 is out of range"),
    (2**64, ValueError, r"seed=18446744073709551616 is out of range"),
    (torch.tensor([1, 2]), TypeError, r"0-d integer tensor, not a torch.int64 tensor of shape \(2,\)"),
    (torch.tensor(1.0), TypeError, r"not a torch.float32 tensor of shape \(\)"),
    (torch.tensor(True), TypeError, r"not a torch.bool tensor"),
])
def test_bad_call_seed_is_refused(seed: Any, exc: type[Exception], match: str) -> None:
    step = devrng.seeded_jit(_dropout, backend="eager")
    with pytest.raises(exc, match=match):
        step(torch.ones(2), seed=seed)


def test_bad_wrap_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match=r"backend='tpu'; accepted backends are 'eager', 'inductor'"):
        devrng.seeded_jit(_dropout, backend="tpu")
    with pytest.raises(ValueError, match=r"seeded_jit's seed=-3 is out of range"):
        devrng.seeded_jit(_dropout, backend="eager", seed=-3)
    with pytest.raises(TypeError, match=r"backend='eager' compiles nothing .* \['mode'\]"):
        devrng.seeded_jit(_dropout, backend="eager", mode="max-autotune")
    with pytest.raises(TypeError, match="needs a callable"):
        devrng.seeded_jit(3, backend="eager")  # type: ignore[call-overload]


def test_compile_options_reach_torch_compile() -> None:
    # torch.compile itself refuses an option it does not know: proof they are passed on.
    with pytest.raises(TypeError, match="no_such_option"):
        devrng.seeded_jit(_dropout, backend="inductor", no_such_option=True)


def test_bad_state_dict_is_refused() -> None:
    step = devrng.seeded_jit(_dropout, backend="eager", seed=1)
    with pytest.raises(DevRNGError, match=r"exactly the keys 'base_seed' and 'counter', not a "
                       r"mapping with the keys 'base_seed'\."):
        step.load_state_dict({"base_seed": 1})
    with pytest.raises(DevRNGError, match=r"state_dict\['counter'\] must be an int in \[0, 2\*\*63\), not -1"):
        step.load_state_dict({"base_seed": 1, "counter": -1})
    with pytest.raises(DevRNGError, match=r"state_dict\['base_seed'\] must be an int"):
        step.load_state_dict({"base_seed": "x", "counter": 0})
    with pytest.raises(DevRNGError, match=r"not a mapping with the keys 'base_seed', 1\."):
        step.load_state_dict({1: 0, "base_seed": 0})  # keys of mixed types
    assert (step.state_dict()["base_seed"], step.state_dict()["counter"]) == (1, 0)
    saved = step.state_dict()
    for key, value in (("counter", 5), ("base_seed", 2), ("version", 1)):
        with pytest.raises(DevRNGError, match=r"was altered or damaged|is version 1"):
            step.load_state_dict({**saved, key: value})  # changed under its digest
    assert step.state_dict() == saved


@pytest.mark.parametrize(("backend", "package", "extra"), [
    ("torch_xla", "torch_xla", "xla"), ("openxla", "torch_xla", "xla"),
    ("torchax", "torchax", "torchax"),
])
def test_missing_package_gives_the_install_hint(monkeypatch: pytest.MonkeyPatch, backend: str,
                                                package: str, extra: str) -> None:
    monkeypatch.setitem(sys.modules, package, None)  # makes `import package` fail
    for mod in ("torch_xla", "openxla", "torchax"):
        monkeypatch.delitem(sys.modules, f"{COMPILERS_PACKAGE}.{mod}", raising=False)
    with pytest.raises(ImportError, match=rf"backend='{backend}'\) needs .*devrng's '{extra}' extra\) "
                                          rf"with: {re.escape(extra_install_command(extra))}$"):
        devrng.seeded_jit(_dropout, backend=backend)


def _cleanup_over_an_interrupt(x: torch.Tensor) -> torch.Tensor:
    # What dynamo's _compile does on torch 2.9 when a Ctrl-C lands in it: its cleanup reads a
    # local the interrupted code never set, and an UnboundLocalError replaces the interrupt.
    try:
        if x.numel():
            raise KeyboardInterrupt
        result = x
    finally:
        print(result)  # unbound when the interrupt came
    return result


def _wrapped_interrupt(x: torch.Tensor) -> torch.Tensor:
    # What torch's C++ makes of an interrupt raised in a Python callback.
    raise SystemError("returned a result with an exception set") from KeyboardInterrupt()


@pytest.mark.parametrize("fn", [_cleanup_over_an_interrupt, _wrapped_interrupt])
def test_an_interrupt_another_error_replaced_goes_on_as_itself(fn: Any) -> None:
    step = devrng.seeded_jit(fn, backend="eager", seed=0)
    with pytest.raises(KeyboardInterrupt):
        step(torch.ones(2))


def test_an_error_with_no_interrupt_behind_it_is_not_touched() -> None:
    def fails(x: torch.Tensor) -> torch.Tensor:
        try:
            raise ValueError("inner")
        finally:
            print(undefined_name)  # type: ignore[name-defined]  # noqa: F821

    step = devrng.seeded_jit(fails, backend="eager", seed=0)
    with pytest.raises(NameError, match="undefined_name") as info:
        step(torch.ones(2))
    assert isinstance(info.value.__context__, ValueError)
