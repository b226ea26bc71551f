"""seeded_jit on real torch_xla (torch_xla.compile and torch.compile(backend="openxla")) and torchax.

These run in the xla environment (PJRT_DEVICE=CPU); the core environment skips them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import devrng

torch_xla = pytest.importorskip("torch_xla")
xm = pytest.importorskip("torch_xla.core.xla_model")
# torch 2.9's autograd engine sizes its device queues at the first backward pass: one
# run before the XLA runtime starts makes every later XLA backward fail an internal
# assert. Start it while pytest collects, before any test's backward runs.
torch_xla.device()

SEEDS = (11, 12, 11, 13, 12)
CALLER_XLA_SEED = 424242


def _draws(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.nn.functional.dropout(x, 0.5, training=True), torch.rand_like(x)


class XLAKit:
    """How to make inputs, read outputs and read the caller's state on one backend."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        if backend == "torchax":
            import jax
            import torchax

            self.env = torchax.default_env()
            self.jax = jax
        else:
            self.device = torch_xla.device()

    def tensor(self, t: torch.Tensor) -> torch.Tensor:
        if self.backend == "torchax":
            with self.env:
                return t.to("jax")
        out = t.to(self.device)
        torch_xla.sync()  # materialised, as a data loader delivers it
        return out

    def host(self, out: Any) -> list[np.ndarray]:
        if self.backend == "torchax":
            from torchax import interop

            return [np.asarray(interop.jax_view(o)) for o in out]
        return [o.cpu().numpy() for o in out]

    def set_caller_state(self) -> None:
        if self.backend == "torchax":
            devrng.get_backend("jax").manual_seed(CALLER_XLA_SEED)
        else:
            xm.set_rng_state(CALLER_XLA_SEED, self.device)

    def caller_state(self) -> Any:
        if self.backend == "torchax":
            return np.asarray(self.jax.random.key_data(self.env.param.prng)).tolist()
        return xm.get_rng_state(self.device)


@pytest.fixture(scope="module", params=["torch_xla", "openxla", "torchax"])
def kit(request: pytest.FixtureRequest) -> XLAKit:
    if request.param == "torchax":
        pytest.importorskip("torchax")
    return XLAKit(request.param)


def test_seed_sequence_reproducible_one_compile_caller_state_kept(kit: XLAKit) -> None:
    step = devrng.seeded_jit(_draws, backend=kit.backend)
    # Odd shapes: XLA caches compiled graphs by their HLO, so a graph another test already
    # compiled would be counted 0 here.
    x = kit.tensor(torch.ones(13, 17))
    kit.set_caller_state()
    caller = kit.caller_state()
    cpu = torch.get_rng_state()
    outs = []
    for seed in SEEDS:
        outs.append(kit.host(step(x, seed=seed)))
        assert kit.caller_state() == caller, f"caller's RNG state changed by seed {seed}"
        assert torch.equal(torch.get_rng_state(), cpu)
    for i, j in ((0, 2), (1, 4)):  # equal seeds, the first (compiling) call included
        assert all(np.array_equal(a, b) for a, b in zip(outs[i], outs[j], strict=True))
    for i, j in ((0, 1), (0, 3), (1, 3)):  # different seeds: different mask and rand
        assert not np.array_equal(outs[i][0], outs[j][0])
        assert not np.array_equal(outs[i][1], outs[j][1])
    assert step.compile_count == 1
    assert set(np.unique(outs[0][0]).tolist()) == {0.0, 2.0}  # a real dropout mask


def test_seed_tensor_and_stream(kit: XLAKit) -> None:
    step = devrng.seeded_jit(_draws, backend=kit.backend, seed=5)
    x = kit.tensor(torch.ones(7, 9))
    by_int = kit.host(step(x, seed=11))
    # A seed tensor on the device (torchax derives the key from it without a host read).
    by_tensor = kit.host(step(x, seed=kit.tensor(torch.tensor(11))))
    assert all(np.array_equal(a, b) for a, b in zip(by_int, by_tensor, strict=True))
    sd = step.state_dict()
    a = [kit.host(step(x)) for _ in range(2)]
    step.load_state_dict(sd)
    b = [kit.host(step(x)) for _ in range(2)]
    assert all(np.array_equal(p, q) for s, t in zip(a, b, strict=True) for p, q in zip(s, t, strict=True))
    assert not np.array_equal(a[0][0], a[1][0])
    assert step.compile_count == 1


def test_auto_picks_backend_from_inputs(kit: XLAKit) -> None:
    if kit.backend == "openxla":
        pytest.skip("auto never picks openxla: XLA inputs go to torch_xla")
    step = devrng.seeded_jit(_draws)
    x = kit.tensor(torch.ones(4))
    first = kit.host(step(x, seed=3))
    assert step.backend == kit.backend
    assert all(np.array_equal(a, b) for a, b in zip(first, kit.host(step(x, seed=3)), strict=True))


def _xla_model() -> torch.nn.Module:
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.5),
                               torch.nn.Linear(16, 1))


def _train(run_step: Callable[[int], torch.Tensor], model: torch.nn.Module,
           init: dict[str, torch.Tensor], seeds: tuple[int, ...]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    model.load_state_dict(init)  # from CPU copies: fresh device buffers
    torch_xla.sync()
    losses = [run_step(s).cpu().numpy() for s in seeds]
    return losses, [p.detach().cpu().numpy() for p in model.parameters()]


def _check_training(train: Callable[[tuple[int, ...]], Any]) -> None:
    a, b, c = train(SEEDS), train(SEEDS), train((21, 22, 21, 23, 22))
    assert all(np.array_equal(p, q) for p, q in zip(a[0], b[0], strict=True)), "losses differ between runs"
    assert all(np.array_equal(p, q) for p, q in zip(a[1], b[1], strict=True)), "weights differ between runs"
    assert np.array_equal(a[0][0], a[0][2])  # seed 11 twice, each step from the initial weights
    assert not any(np.array_equal(p, q) for p, q in zip(a[0], c[0], strict=True))


def _training_setup() -> tuple[Any, dict[str, torch.Tensor], Any, torch.Tensor, torch.Tensor]:
    """A dropout model on XLA, its initial weights (CPU), SGD, and one materialised batch."""
    device = torch_xla.device()
    model = _xla_model().to(device)
    init = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4, 8, generator=g).to(device)
    y = torch.randn(4, 1, generator=g).to(device)
    torch_xla.sync()
    return model, init, opt, x, y


@pytest.mark.parametrize("backend", ["torch_xla", "openxla"])
def test_xla_training_step_with_dropout_and_optimizer_is_reproducible(backend: str) -> None:
    # The whole step inside the compiled function, returning loss.detach(): with openxla,
    # dynamo compiles that detach alone after the graph break at backward(), a graph with
    # no XLA computation that torch_xla's bridge fails to look up ("cachedComputation").
    model, init, opt, x, y = _training_setup()

    @devrng.seeded_jit(backend=backend)
    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    def train(seeds: tuple[int, ...]) -> Any:
        # Reset weights before every step: then a step's loss depends only on its seed.
        losses = []
        for s in seeds:
            losses.append(_train(lambda s: step(x, y, seed=s), model, init, (s,))[0][0])
        weights = _train(lambda s: step(x, y, seed=s), model, init, seeds)[1]
        return losses, weights

    _check_training(train)
    first = step.compile_count
    assert first >= 1
    _check_training(train)
    assert step.compile_count == first  # 30 more steps, 8 seeds: nothing recompiled


def test_openxla_forward_only_training_step_is_reproducible() -> None:
    # The other split: compile the forward, run backward and the optimizer after the call
    # (an L1 loss: a graph XLA has not compiled for the test above).
    model, init, opt, x, y = _training_setup()
    forward = devrng.seeded_jit(
        lambda x, y: torch.nn.functional.l1_loss(model(x), y), backend="openxla")

    def one(seed: int) -> torch.Tensor:
        loss = forward(x, y, seed=seed)
        loss.backward()
        opt.step()
        opt.zero_grad()
        torch_xla.sync()
        return loss.detach()

    def train(seeds: tuple[int, ...]) -> Any:
        losses = [_train(one, model, init, (s,))[0][0] for s in seeds]
        return losses, _train(one, model, init, seeds)[1]

    _check_training(train)
    assert forward.compile_count == 1


def test_torchax_training_step_with_dropout_is_reproducible() -> None:
    torchax = pytest.importorskip("torchax")
    env = torchax.default_env()
    model = _xla_model()
    g = torch.Generator().manual_seed(2)
    with env:
        params = {k: v.detach().to("jax") for k, v in model.state_dict().items()}
        x = torch.randn(4, 8, generator=g).to("jax")
        y = torch.randn(4, 1, generator=g).to("jax")

    def loss_fn(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.mse_loss(torch.func.functional_call(model, p, (x,)), y)

    @devrng.seeded_jit(backend="torchax")
    def step(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> Any:
        grads, loss = torch.func.grad_and_value(loss_fn)(p, x, y)
        return loss, {k: p[k] - 0.1 * grads[k] for k in p}

    from torchax import interop

    def train(seeds: tuple[int, ...]) -> Any:
        losses = [np.asarray(interop.jax_view(step(params, x, y, seed=s)[0])) for s in seeds]
        p = params
        for s in seeds:
            p = step(p, x, y, seed=s)[1]
        return losses, [np.asarray(interop.jax_view(v)) for v in p.values()]

    _check_training(train)
    assert step.compile_count == 1


def test_compile_options_reach_torch_xla_compile() -> None:
    with pytest.raises(TypeError, match="no_such_option"):
        devrng.seeded_jit(_draws, backend="torch_xla", no_such_option=True)


def test_peers_show_the_bugs_seeded_jit_fixes() -> None:
    """Without devrng: openxla's first call and torchax's jax_jit are not seedable."""
    device = torch_xla.device()
    x = torch.ones(8, 8, device=device)
    torch_xla.sync()

    def draws(x: torch.Tensor) -> torch.Tensor:  # a fresh function: a fresh dynamo cache
        return torch.nn.functional.dropout(x, 0.5, training=True) * 3

    stock = torch.compile(draws, backend="openxla")
    outs = []
    for _ in range(2):
        xm.set_rng_state(7, device)
        outs.append(stock(x).cpu())
    assert not torch.equal(outs[0], outs[1]), "stock openxla: first call now reproducible?"

    torchax = pytest.importorskip("torchax")
    from torchax import interop

    with torchax.default_env():
        t = torch.ones(8, 8, device="jax")
    baked = interop.jax_jit(_draws)
    # Tracing rotates the environment's key inside the trace and leaves a leaked
    # tracer as the global key: fork it so that later tests get a real key back.
    with devrng.fork_rng(device_type="jax"):
        a, b = (np.asarray(interop.jax_view(baked(t)[0])) for _ in range(2))
    assert np.array_equal(a, b), "torchax jax_jit: the key is no longer baked in?"


def test_torchax_key_stack_is_restored_when_tracing_raises() -> None:
    torchax = pytest.importorskip("torchax")
    import jax

    env = torchax.default_env()
    with env:
        x = torch.ones(3, device="jax")

    def bad(x: torch.Tensor) -> torch.Tensor:
        torch.nn.functional.dropout(x, 0.5, training=True)
        raise ValueError("bad shape")

    step = devrng.seeded_jit(bad, backend="torchax")
    depth = len(env._property.content)
    key = np.asarray(jax.random.key_data(env.param.prng)).tolist()
    cpu = torch.get_rng_state()
    with pytest.raises(ValueError, match="bad shape"):
        step(x, seed=1)
    assert len(env._property.content) == depth
    assert np.asarray(jax.random.key_data(env.param.prng)).tolist() == key
    assert torch.equal(torch.get_rng_state(), cpu)


def test_torchax_backend_says_what_to_do_with_a_cpu_tensor() -> None:
    pytest.importorskip("torchax")
    step = devrng.seeded_jit(lambda x: x * 2, backend="torchax")
    with pytest.raises(TypeError, match=r"got a cpu tensor of shape \(3,\); it compiles functions "
                                        r"of torchax tensors\. Move the inputs first"):
        step(torch.ones(3), seed=1)
