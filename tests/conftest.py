"""Shared fixtures: simulated devices and RNG hygiene between tests.

CUDA, XPU and MPS cannot run on these machines. ``simulate_device`` swaps the
RNG functions of ``torch.cuda`` / ``torch.xpu`` / ``torch.mps`` for fakes
backed by real ``torch.Generator`` objects (one per simulated device), so the
dispatch and restore logic runs for real against a device that is SIMULATED.
"""

from __future__ import annotations

import importlib.util
import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

HAS_XLA = importlib.util.find_spec("torch_xla") is not None
HAS_TORCHAX = importlib.util.find_spec("torchax") is not None


def pytest_configure(config: pytest.Config) -> None:
    # torch 2.9 + torch_xla 2.9: a CPU backward pass run before the XLA runtime starts
    # makes every later XLA backward fail an internal assert. Start XLA first, as a
    # program that uses XLA does.
    if HAS_XLA:
        import torch_xla

        torch_xla.device()


def _index(device: Any) -> int:
    if device is None:
        return 0
    if isinstance(device, int):
        return device
    d = torch.device(device)
    return d.index or 0


class SimulatedDeviceModule:
    """Stands in for ``torch.<type>``: real torch.Generator per simulated device."""

    def __init__(self, type_name: str, count: int, *, initialized: bool = True) -> None:
        self.type = type_name
        self.generators = [torch.Generator().manual_seed(1000 + i) for i in range(count)]
        self.initialized = initialized
        self.init_calls = 0
        self.set_calls: list[int] = []
        self.fail_set = False

    # the RNG surface of torch.cuda / torch.xpu / torch.mps
    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return self.initialized

    def device_count(self) -> int:
        return len(self.generators)

    def current_device(self) -> int:
        return 0

    def get_rng_state(self, device: Any = None) -> torch.Tensor:
        if not self.initialized:  # like torch.cuda: touching RNG state initialises the device
            self.initialized = True
            self.init_calls += 1
        return self.generators[_index(device)].get_state()

    def set_rng_state(self, state: torch.Tensor, device: Any = None) -> None:
        if self.fail_set:
            raise RuntimeError(f"simulated {self.type} failure while setting RNG state")
        self.set_calls.append(_index(device))
        self.generators[_index(device)].set_state(state)

    def manual_seed(self, seed: int) -> None:
        self.generators[0].manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        for g in self.generators:
            g.manual_seed(seed)

    def draw(self, index: int = 0, n: int = 4) -> torch.Tensor:
        """A random draw "on" simulated device ``index``."""
        return torch.rand(n, generator=self.generators[index])


_SURFACE = ("is_available", "is_initialized", "device_count", "current_device", "get_rng_state",
            "set_rng_state", "manual_seed", "manual_seed_all")


@pytest.fixture
def simulate_device(monkeypatch: pytest.MonkeyPatch) -> Callable[..., SimulatedDeviceModule]:
    """``simulate_device("xpu", count=2, accelerator=True)`` -> the SIMULATED module."""

    def make(type_name: str, count: int = 1, *, accelerator: bool = False,
             initialized: bool = True) -> SimulatedDeviceModule:
        fake = SimulatedDeviceModule(type_name, count, initialized=initialized)
        module = getattr(torch, type_name)
        for name in _SURFACE:
            monkeypatch.setattr(module, name, getattr(fake, name), raising=False)
        if type_name == "mps":
            monkeypatch.setattr(torch.backends.mps, "is_available", fake.is_available)
        if accelerator:
            monkeypatch.setattr(torch.accelerator, "current_accelerator",
                                lambda check_available=False: torch.device(type_name))
        return fake

    return make


@pytest.fixture(autouse=True)
def _isolate_global_rng() -> Iterator[None]:
    """Every test starts from the same seeds and leaves no RNG change behind."""
    cpu = torch.get_rng_state()
    py = random.getstate()
    try:
        import numpy

        np_state = numpy.random.get_state()
    except ImportError:
        numpy = None  # type: ignore[assignment]
    torch.manual_seed(0)
    random.seed(0)
    yield
    torch.set_rng_state(cpu)
    random.setstate(py)
    if numpy is not None:
        numpy.random.set_state(np_state)


def fake_tensor(device: str, n: int = 2) -> torch.Tensor:
    """A FakeTensor whose ``.device`` is ``device`` (e.g. a SIMULATED "xpu:1"); no memory.

    Make it before ``simulate_device`` patches that type as available: torch 2.9's
    FakeTensor then tries to initialise the (absent) real device."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    return FakeTensor(FakeTensorMode(), torch.empty(n, device="meta"), torch.device(device))
