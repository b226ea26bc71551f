"""torch's own RNG sites on real XLA devices (and torchax tensors) through devrng.patch_torch().

Without the patch torch.utils.checkpoint crashes on XLA tensors
(``module 'torch' has no attribute 'xla'``); a naive shim module lets it run
but the backward pass recomputes a different dropout mask. With the patch,
one training step under checkpointing gives gradients bitwise equal to the
same step without it.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.utils.checkpoint as tcp
from tests._internals import DeviceRNGModule

import devrng

torch_xla = pytest.importorskip("torch_xla")
xm = pytest.importorskip("torch_xla.core.xla_model")
xla_checkpoint = pytest.importorskip("torch_xla.utils.checkpoint")

TORCH_FORK_RNG = torch.random.fork_rng  # torch's own, captured before any patching
SEED = 1234


@pytest.fixture(autouse=True)
def _unpatched() -> Iterator[None]:
    devrng.unpatch_torch()
    yield
    devrng.unpatch_torch()


@pytest.fixture(scope="module")
def setup() -> tuple[Any, torch.nn.Module, torch.Tensor]:
    dev = torch_xla.device()
    gen = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.5), torch.nn.Linear(32, 4)
    )
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    x = torch.randn(8, 16, generator=gen)
    model = model.to(dev)
    x = x.to(dev)
    torch_xla.sync()  # materialise: no stray compilation inside the steps
    return dev, model, x


def train_step(setup: tuple[Any, torch.nn.Module, torch.Tensor], mode: str,
               seed: int = SEED) -> list[torch.Tensor]:
    """One forward+backward from ``seed``; returns the parameter gradients on the CPU."""
    dev, model, x = setup
    for p in model.parameters():
        p.grad = None
    xm.set_rng_state(seed, dev)
    inp = x.detach().requires_grad_()
    if mode == "plain":
        out = model(inp)
    elif mode == "torch_xla":
        out = xla_checkpoint.checkpoint(model, inp)
    else:
        out = tcp.checkpoint(model, inp, use_reentrant=(mode == "reentrant"))
    out.square().sum().backward()
    torch_xla.sync()
    grads = [p.grad.cpu() for p in model.parameters()]
    for p in model.parameters():
        p.grad = None
    return grads


def bitwise_equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("mode", ["reentrant", "non_reentrant"])
def test_checkpoint_crashes_on_xla_without_patch(setup: Any, mode: str) -> None:
    with pytest.raises(AttributeError, match="module 'torch' has no attribute 'xla'"):
        train_step(setup, mode)


@pytest.mark.parametrize("mode", ["reentrant", "non_reentrant"])
def test_checkpoint_gradients_bitwise_equal_with_patch(setup: Any, mode: str) -> None:
    devrng.patch_torch()
    plain = train_step(setup, "plain")
    assert not bitwise_equal(plain, train_step(setup, "plain", seed=SEED + 1))  # dropout matters
    assert bitwise_equal(train_step(setup, mode), plain)


def test_checkpoint_matches_torch_xla_checkpoint(setup: Any) -> None:
    devrng.patch_torch()
    reference = train_step(setup, "torch_xla")
    assert bitwise_equal(train_step(setup, "non_reentrant"), reference)
    assert bitwise_equal(train_step(setup, "reentrant"), reference)


class NaiveShim(types.ModuleType):
    """What a quick fix registers: XLA's seed as an int64 tensor, no ``_initialized``."""

    def __init__(self) -> None:
        super().__init__("naive_xla_shim")

    def device_count(self) -> int:
        return int(torch_xla.device_count())

    def get_rng_state(self, device: Any = None) -> torch.Tensor:
        return torch.tensor(xm.get_rng_state(), dtype=torch.int64)

    def set_rng_state(self, state: torch.Tensor, device: Any = None) -> None:
        xm.set_rng_state(int(state))


@pytest.fixture
def naive_shim() -> Iterator[NaiveShim]:
    shim = NaiveShim()
    torch._register_device_module("xla", shim)
    yield shim
    if getattr(torch, "xla", None) is shim:
        delattr(torch, "xla")
    sys.modules.pop("torch.xla", None)
    torch.get_device_module.cache_clear()


@pytest.mark.parametrize("mode", ["reentrant", "non_reentrant"])
def test_naive_shim_runs_but_gives_wrong_gradients(setup: Any, naive_shim: NaiveShim,
                                                   mode: str) -> None:
    plain = train_step(setup, "plain")
    assert not bitwise_equal(train_step(setup, mode), plain)
    devrng.patch_torch()
    assert torch.xla is naive_shim  # type: ignore[attr-defined]  (a foreign module is left alone)


def test_naive_int64_state_overflows_on_large_seeds(setup: Any, naive_shim: NaiveShim) -> None:
    dev = setup[0]
    xm.set_rng_state(2**64 - 5, dev)
    with pytest.raises((RuntimeError, ValueError), match=r"[Oo]verflow"):
        naive_shim.get_rng_state()


def test_state_is_the_full_uint64_seed_as_bytes(setup: Any) -> None:
    dev = setup[0]
    devrng.patch_torch()
    xm.set_rng_state(2**64 - 5, dev)
    state = torch.xla.get_rng_state()  # type: ignore[attr-defined]
    assert state.dtype == torch.uint8
    assert int.from_bytes(bytes(state.tolist()), "little") == 2**64 - 5
    xm.set_rng_state(7, dev)
    torch.xla.set_rng_state(state)  # type: ignore[attr-defined]
    assert xm.get_rng_state(dev) == 2**64 - 5
    assert [int.from_bytes(bytes(s.tolist()), "little")
            for s in torch.xla.get_rng_state_all()] == [2**64 - 5]  # type: ignore[attr-defined]


@pytest.mark.parametrize("fork_name", ["torch", "devrng"])
@pytest.mark.parametrize("devices", [None, [0], [torch.device("xla:0")]],
                         ids=["all", "index", "pipelining_site"])
def test_fork_rng_device_type_xla_restores(setup: Any, fork_name: str, devices: Any) -> None:
    # devices=[torch.device("xla:0")] with device_type="xla" is the call torch's
    # pipelining schedules make (torch >= 2.10) around shape inference.
    dev = setup[0]
    if fork_name == "torch":
        with pytest.raises(RuntimeError, match="torch has no module of `xla`"), TORCH_FORK_RNG(devices=devices, device_type="xla"):
            pass
    devrng.patch_torch()
    fork = TORCH_FORK_RNG if fork_name == "torch" else torch.random.fork_rng
    xm.set_rng_state(2**63 + 11, dev)
    expected = torch.rand(4, device=dev).cpu()
    xm.set_rng_state(2**63 + 11, dev)
    with fork(devices=devices, device_type="xla"):
        inside = torch.rand(4, device=dev).cpu()
        torch.rand(4, device=dev).cpu()
    assert xm.get_rng_state(dev) == 2**63 + 11
    assert torch.equal(torch.rand(4, device=dev).cpu(), expected)
    assert torch.equal(inside, expected)


def test_unpatch_brings_the_crash_back(setup: Any) -> None:
    devrng.patch_torch()
    assert isinstance(torch.xla, DeviceRNGModule)  # type: ignore[attr-defined]
    devrng.unpatch_torch()
    assert not hasattr(torch, "xla")
    assert "torch.xla" not in sys.modules
    with pytest.raises(AttributeError, match="has no attribute 'xla'"):
        train_step(setup, "non_reentrant")


# --- torchax tensors (device type 'jax') --------------------------------------------------


@pytest.fixture(scope="module")
def jax_setup() -> tuple[Any, torch.Tensor, torch.Tensor]:
    torchax = pytest.importorskip("torchax")
    env = torchax.default_env()
    gen = torch.Generator().manual_seed(0)
    w_cpu = torch.randn(8, 8, generator=gen)
    x_cpu = torch.randn(4, 8, generator=gen)
    with env:
        w = w_cpu.to("jax").requires_grad_()
        x = x_cpu.to("jax")
    return env, w, x


def jax_step(jax_setup: Any, mode: str, seed: int = SEED) -> torch.Tensor:
    env, w, x = jax_setup
    devrng.get_backend("jax").manual_seed(seed)

    def block(t: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.dropout(t @ w, 0.5, training=True)

    with env:
        w.grad = None
        inp = x.detach().requires_grad_()
        out = block(inp) if mode == "plain" else tcp.checkpoint(
            block, inp, use_reentrant=(mode == "reentrant"))
        out.square().sum().backward()
        grad = w.grad
        w.grad = None
    return torch.from_numpy(__import__("numpy").asarray(grad.jax()).copy())


@pytest.mark.parametrize("mode", ["reentrant", "non_reentrant"])
def test_torchax_checkpoint_silently_wrong_without_patch(jax_setup: Any, mode: str) -> None:
    assert not torch.equal(jax_step(jax_setup, mode), jax_step(jax_setup, "plain"))


@pytest.mark.parametrize("mode", ["reentrant", "non_reentrant"])
def test_torchax_checkpoint_bitwise_equal_with_patch(jax_setup: Any, mode: str) -> None:
    placeholder = torch.jax  # type: ignore[attr-defined]
    devrng.patch_torch()
    assert torch.jax is not placeholder  # type: ignore[attr-defined]
    assert torch.jax.get_amp_supported_dtype() == placeholder.get_amp_supported_dtype()  # type: ignore[attr-defined]
    plain = jax_step(jax_setup, "plain")
    assert not torch.equal(plain, jax_step(jax_setup, "plain", seed=SEED + 1))
    assert torch.equal(jax_step(jax_setup, mode), plain)
    devrng.unpatch_torch()
    assert torch.jax is placeholder
    assert sys.modules["torch.jax"] is placeholder
    assert torch.get_device_module("jax") is placeholder


def test_torchax_fork_rng_device_type_jax(jax_setup: Any) -> None:
    env = jax_setup[0]
    backend = devrng.get_backend("jax")
    with pytest.raises(TypeError, match="get_rng_state"), TORCH_FORK_RNG(device_type="jax"):  # torchax's placeholder takes no device
        pass
    devrng.patch_torch()
    backend.manual_seed(2**64 - 1)
    before = backend.get_rng_state(0)["key"].clone()
    for fork in (TORCH_FORK_RNG, torch.random.fork_rng):
        with fork(device_type="jax"), env:
            torch.rand(3, device="jax")
        assert torch.equal(backend.get_rng_state(0)["key"], before)


def test_torch_manual_seed_reaches_torchax_key_only_while_patched(jax_setup: Any) -> None:
    backend = devrng.get_backend("jax")
    backend.manual_seed(99)
    torch.manual_seed(5)
    assert backend.get_rng_state(0)["key"].tolist() == [0, 99]  # torchax's placeholder: no-op
    devrng.patch_torch()
    torch.manual_seed(5)
    assert backend.get_rng_state(0)["key"].tolist() == [0, 5]
