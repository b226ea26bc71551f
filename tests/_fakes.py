"""Test fakes shared by the suite: SIMULATED devices, fake tensors, a minimal backend.

CUDA, XPU and MPS cannot run on these machines. :class:`SimulatedDeviceModule`
stands in for the RNG surface of ``torch.cuda`` / ``torch.xpu`` / ``torch.mps``
with real ``torch.Generator`` objects (one per simulated device), so devrng's
dispatch and restore logic runs for real against a device that is SIMULATED.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator
from typing import Any

import torch
from tests._internals import unregister_backend

import devrng

HAS_XLA = importlib.util.find_spec("torch_xla") is not None
HAS_TORCHAX = importlib.util.find_spec("torchax") is not None


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


SURFACE = ("is_available", "is_initialized", "device_count", "current_device", "get_rng_state",
            "set_rng_state", "manual_seed", "manual_seed_all")


def install_simulated(fake: SimulatedDeviceModule, module: Any, setattr_: Any = setattr) -> None:
    """Put ``fake``'s RNG surface on ``module`` (``torch.cuda``...); ``setattr_`` may be
    ``monkeypatch.setattr`` so that the test undoes it."""
    for name in SURFACE:
        setattr_(module, name, getattr(fake, name))


class MinimalBackend:
    """A third-party backend with exactly the required members, backed by generators."""

    name = "thirdparty"

    def __init__(self, count: int = 2, name: str | None = None) -> None:
        self.gens = [torch.Generator().manual_seed(7 + i) for i in range(count)]
        if name is not None:
            self.name = name

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return len(self.gens)

    def get_rng_state(self, index: int) -> torch.Tensor:
        return self.gens[index].get_state()

    def set_rng_state(self, state: torch.Tensor, index: int) -> None:
        self.gens[index].set_state(state)

    def manual_seed(self, seed: int) -> None:
        for g in self.gens:
            g.manual_seed(seed)


@contextlib.contextmanager
def registered(name: str, backend: Any) -> Iterator[Any]:
    """``backend`` registered as ``name`` for the block (replacing any), removed after."""
    devrng.register_backend(name, backend, clobber=True)
    try:
        yield backend
    finally:
        unregister_backend(name)


def fake_tensor(device: str, n: int = 2) -> torch.Tensor:
    """A FakeTensor whose ``.device`` is ``device`` (e.g. a SIMULATED "xpu:1"); no memory.

    Make it before ``simulate_device`` patches that type as available: torch 2.9's
    FakeTensor then tries to initialise the (absent) real device."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    return FakeTensor(FakeTensorMode(), torch.empty(n, device="meta"), torch.device(device))


class FaultyBackend(MinimalBackend):
    """A backend over real generators that raises on demand: ``faults["set"] = KeyboardInterrupt()``
    makes every ``set_rng_state`` raise it (``"get"``, ``"seed"`` likewise); ``after[kind] = n``
    lets the first ``n`` calls of that kind succeed."""

    def __init__(self, name: str = "faulty", count: int = 2) -> None:
        super().__init__(count, name)
        self.faults: dict[str, BaseException] = {}
        self.after: dict[str, int] = {}
        self.calls: dict[str, int] = {"get": 0, "set": 0, "seed": 0}

    def _maybe_fail(self, kind: str) -> None:
        self.calls[kind] += 1
        fault = self.faults.get(kind)
        if fault is not None and self.calls[kind] > self.after.get(kind, 0):
            raise fault

    def get_rng_state(self, index: int) -> torch.Tensor:
        self._maybe_fail("get")
        return super().get_rng_state(index)

    def set_rng_state(self, state: torch.Tensor, index: int) -> None:
        self._maybe_fail("set")
        super().set_rng_state(state, index)

    def manual_seed(self, seed: int) -> None:
        self._maybe_fail("seed")
        super().manual_seed(seed)

    def states(self) -> list[torch.Tensor]:
        """Every generator's state, read without going through the faults."""
        return [g.get_state() for g in self.gens]
