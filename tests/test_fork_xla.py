"""fork_rng, snapshots and seeding on REAL XLA devices (PJRT on the CPU) and REAL torchax."""

from __future__ import annotations

import pytest
import torch

import devrng

xm = pytest.importorskip("torch_xla.core.xla_model")


def xla_draw() -> torch.Tensor:
    return torch.rand(6, device="xla:0").cpu()


@pytest.fixture
def xla_tensor() -> torch.Tensor:
    return torch.ones(3, device="xla:0")


@pytest.mark.parametrize("how", ["tensor", "string", "bare", "module", "device_type"])
def test_fork_restores_xla_and_cpu(how: str, xla_tensor: torch.Tensor) -> None:
    args = {
        "tensor": {"devices": [xla_tensor]},
        "string": {"devices": ["xla:0"]},
        "bare": {},  # XLA is in use in this process, so a bare fork covers it
        "module": {"devices": [torch.nn.Linear(2, 2).to("xla:0")]},
        "device_type": {"device_type": "xla"},
    }[how]
    xla_before, cpu_before = xm.get_rng_state("xla:0"), torch.get_rng_state()
    with devrng.fork_rng(**args):
        inside_xla, inside_cpu = xla_draw(), torch.rand(4)
    assert xm.get_rng_state("xla:0") == xla_before
    assert torch.equal(torch.get_rng_state(), cpu_before)
    assert torch.equal(inside_xla, xla_draw()) and torch.equal(inside_cpu, torch.rand(4))


def test_torch_fork_rng_cannot_fork_xla_but_devrng_can(xla_tensor: torch.Tensor) -> None:
    """The peer's behaviour that devrng replaces (torch 2.9): XLA state leaks out."""
    before = xm.get_rng_state("xla:0")
    with torch.random.fork_rng(devices=[]):
        xla_draw()
    assert xm.get_rng_state("xla:0") != before
    before = xm.get_rng_state("xla:0")
    with devrng.fork_rng(devices=[xla_tensor]):
        xla_draw()
    assert xm.get_rng_state("xla:0") == before


def test_manual_seed_makes_xla_draws_reproducible() -> None:
    devrng.manual_seed(123)
    a = xla_draw()
    devrng.manual_seed(123)
    b = xla_draw()
    devrng.manual_seed(124)
    assert torch.equal(a, b) and not torch.equal(a, xla_draw())


def test_torch_manual_seed_does_not_reach_xla() -> None:
    torch.manual_seed(5)
    a = xla_draw()
    torch.manual_seed(5)
    assert not torch.equal(a, xla_draw())  # the gap devrng.manual_seed closes


def test_full_uint64_seed_round_trips() -> None:
    devrng.manual_seed(2**64 - 1)
    assert xm.get_rng_state("xla:0") == 2**64 - 1
    snap = devrng.get_rng_state(devices=["xla:0"])
    xla_draw()
    devrng.set_rng_state(devrng.RNGState.from_dict(snap.to_dict()))
    assert xm.get_rng_state("xla:0") == 2**64 - 1


def test_snapshot_with_xla_through_a_file(tmp_path: object, xla_tensor: torch.Tensor) -> None:
    snap = devrng.get_rng_state(devices=[xla_tensor])
    first = xla_draw(), torch.rand(2)
    path = tmp_path / "xla.rng"  # type: ignore[operator]
    snap.save(path)
    devrng.set_rng_state(devrng.RNGState.load(path))
    again = xla_draw(), torch.rand(2)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])


def test_xla_device_that_does_not_exist_is_an_error() -> None:
    count = devrng.get_backend("xla").device_count()
    with pytest.raises(ValueError, match=rf"Device xla:{count} does not exist"), \
            devrng.fork_rng(devices=[f"xla:{count}"]):
        pass


# -- torchax --------------------------------------------------------------------------

@pytest.fixture
def env():  # type: ignore[no-untyped-def]
    torchax = pytest.importorskip("torchax")
    return torchax.default_env()


def jax_draw(env) -> torch.Tensor:  # type: ignore[no-untyped-def]
    import numpy as np

    with env:
        out = torch.rand(5, device="jax")
    return torch.from_numpy(np.asarray(out.jax()).copy())


def test_fork_over_a_torchax_tensor_restores_the_key(env) -> None:  # type: ignore[no-untyped-def]
    import jax

    with env:
        t = torch.ones(2, device="jax")
    assert devrng.infer_device_types([t]) == ("jax",)
    key_before = jax.random.key_data(env.param.prng)
    with devrng.fork_rng(devices=[t]):
        inside = jax_draw(env)
    assert (jax.random.key_data(env.param.prng) == key_before).all()
    assert torch.equal(inside, jax_draw(env))


def test_manual_seed_reaches_torchax(env) -> None:  # type: ignore[no-untyped-def]
    devrng.manual_seed(77)
    a = jax_draw(env)
    devrng.manual_seed(77)
    b = jax_draw(env)
    devrng.manual_seed(78)
    assert torch.equal(a, b) and not torch.equal(a, jax_draw(env))


def test_bare_indices_refer_to_xla_when_it_is_the_only_device_in_use(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """torch 2.9's CUDA build reports a 'cuda' accelerator with no GPU; devrng looks past it."""
    import sys

    if "torchax" in sys.modules:  # an earlier test used torchax: make its env look unused
        monkeypatch.setattr(sys.modules["torchax"], "env", None)
    before = xm.get_rng_state("xla:0")
    with devrng.fork_rng(devices=[0]):
        xla_draw()
    assert xm.get_rng_state("xla:0") == before


def test_bare_indices_are_ambiguous_when_xla_and_torchax_are_both_in_use(env) -> None:  # type: ignore[no-untyped-def]
    torch.ones(1, device="xla:0")
    with pytest.raises(ValueError, match=r"devices=\[0\] holds device indices but no device type"), \
            devrng.fork_rng(devices=[0]):
        pass


def test_repeated_single_tensor_forks_follow_the_tensor_device_and_registry(xla_tensor: torch.Tensor) -> None:
    """fork_rng keeps a single tensor's plan per device: a later fork must still fork that
    device, and a backend registered again must be used, not the cached one."""
    for _ in range(3):
        before = xm.get_rng_state("xla:0")
        with devrng.fork_rng(devices=[xla_tensor]):
            xla_draw()
        assert xm.get_rng_state("xla:0") == before

    class Counting(type(devrng.get_backend("xla"))):  # type: ignore[misc]
        sets = 0

        def set_rng_state(self, state: int, index: int) -> None:
            Counting.sets += 1
            super().set_rng_state(state, index)

    original = devrng.get_backend("xla")
    devrng.register_backend("xla", Counting(), clobber=True)
    try:
        with devrng.fork_rng(devices=[xla_tensor]):
            xla_draw()
        assert Counting.sets == 1
    finally:
        devrng.register_backend("xla", original, clobber=True)
