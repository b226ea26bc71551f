"""One conformance suite that every backend runs.

cpu is real everywhere; xla and jax (torchax) are real in the xla environment;
cuda, xpu and mps are SIMULATED (fake torch.<type> modules backed by real
torch.Generator objects, see tests/_fakes.py); "thirdparty" is a backend
with only the required Protocol members, registered at run time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from tests._fakes import HAS_TORCHAX, HAS_XLA, MinimalBackend, registered

import devrng


class Case:
    """How to reach one backend in a test: its device strings and a draw on it."""

    def __init__(self, name: str, draw: Callable[[int], torch.Tensor], count: int) -> None:
        self.name = name
        self.draw = draw
        self.count = count

    def device(self, index: int = 0) -> str:
        return f"{self.name}:{index}"


def _xla_case() -> Case:
    import torch_xla  # noqa: F401

    return Case("xla", lambda i: torch.rand(8, device=f"xla:{i}").cpu(),
                devrng.get_backend("xla").device_count())


def _jax_case() -> Case:
    import numpy as np
    import torchax

    env = torchax.default_env()

    def draw(i: int) -> torch.Tensor:
        with env:
            out = torch.rand(8, device="jax")
        return torch.from_numpy(np.asarray(out.jax()).copy())

    return Case("jax", draw, 1)


PARAMS = [
    pytest.param("cpu", id="cpu-real"),
    pytest.param("cuda", id="cuda-simulated"),
    pytest.param("xpu", id="xpu-simulated"),
    pytest.param("mps", id="mps-simulated"),
    pytest.param("thirdparty", id="thirdparty-minimal-protocol"),
    pytest.param("xla", id="xla-real",
                 marks=pytest.mark.skipif(not HAS_XLA, reason="needs torch_xla (xla env)")),
    pytest.param("jax", id="jax-torchax-real",
                 marks=pytest.mark.skipif(not HAS_TORCHAX, reason="needs torchax (xla env)")),
]


@pytest.fixture(params=PARAMS)
def case(request: pytest.FixtureRequest, simulate_device: Any) -> Iterator[Case]:
    name = request.param
    if name == "cpu":
        yield Case("cpu", lambda i: torch.rand(8), 1)
    elif name in ("cuda", "xpu", "mps"):
        fake = simulate_device(name, count=1 if name == "mps" else 2)
        yield Case(name, fake.draw, fake.device_count())
    elif name == "thirdparty":
        with registered("thirdparty", MinimalBackend()) as backend:
            yield Case("thirdparty", lambda i: torch.rand(8, generator=backend.gens[i]), 2)
    elif name == "xla":
        yield _xla_case()
    else:
        yield _jax_case()


def test_state_round_trip(case: Case) -> None:
    backend = devrng.get_backend(case.name)
    for index in range(case.count):
        state = backend.get_rng_state(index)
        first = case.draw(index)
        backend.set_rng_state(state, index)
        assert torch.equal(case.draw(index), first)


def test_fork_restores_device_and_cpu(case: Case) -> None:
    devices = [case.device(i) for i in range(case.count)] if case.name != "cpu" else []
    snap = devrng.get_rng_state(devices=devices, python=False, numpy=False)
    with devrng.fork_rng(devices=devices):
        inside = [case.draw(i) for i in range(case.count)]
        torch.rand(3)
    after = [case.draw(i) for i in range(case.count)]
    assert all(torch.equal(a, b) for a, b in zip(inside, after, strict=True))
    devrng.set_rng_state(snap)
    assert all(torch.equal(case.draw(i), after[i]) for i in range(case.count))


def test_fork_restores_after_exception(case: Case) -> None:
    devices = [case.device(i) for i in range(case.count)] if case.name != "cpu" else []
    snap = devrng.get_rng_state(devices=devices, python=False, numpy=False)
    def body() -> None:
        with devrng.fork_rng(devices=devices):
            case.draw(0)
            torch.rand(2)
            raise KeyError("boom")

    with pytest.raises(KeyError):
        body()
    assert devrng.get_rng_state(devices=devices, python=False, numpy=False) == snap


def test_same_seed_same_draws(case: Case) -> None:
    types = None if case.name == "cpu" else [case.name]
    devrng.manual_seed(2024, device_type=types)
    a = [case.draw(i) for i in range(case.count)]
    devrng.manual_seed(2024, device_type=types)
    b = [case.draw(i) for i in range(case.count)]
    devrng.manual_seed(2025, device_type=types)
    c = [case.draw(i) for i in range(case.count)]
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a[0], c[0])


def test_snapshot_round_trip_through_a_file(case: Case, tmp_path: Any) -> None:
    devices = [case.device(i) for i in range(case.count)] if case.name != "cpu" else []
    snap = devrng.get_rng_state(devices=devices)
    first = [case.draw(i) for i in range(case.count)] + [torch.rand(4)]
    path = tmp_path / "state.rng"
    snap.save(path)
    raw = torch.load(path, weights_only=True)  # no arbitrary unpickling needed
    assert raw["format"] == "devrng.RNGState"
    loaded = devrng.RNGState.load(path)
    assert loaded.fingerprint() == snap.fingerprint()
    devrng.set_rng_state(loaded)
    again = [case.draw(i) for i in range(case.count)] + [torch.rand(4)]
    assert all(torch.equal(x, y) for x, y in zip(first, again, strict=True))
