"""Fixtures: SIMULATED devices (fakes in tests/_fakes.py) and RNG hygiene between tests.

``simulate_device`` swaps the RNG functions of ``torch.cuda`` / ``torch.xpu`` /
``torch.mps`` for a :class:`tests._fakes.SimulatedDeviceModule`, undone after
the test.
"""

from __future__ import annotations

import random
import signal
from collections.abc import Callable, Iterator

import pytest
import torch
from tests._fakes import HAS_XLA, SimulatedDeviceModule, install_simulated


def pytest_configure(config: pytest.Config) -> None:
    # A shell that runs the suite in the background (scripts/test.sh runs two checks at a
    # time) ignores SIGINT in it, and every process it starts inherits that: Python then
    # installs no handler, and neither does devrng. Run as a program run from a terminal
    # is, with Python's handler, devrng's over it, and children that start the same way.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        from tests._internals import sigint

        signal.signal(signal.SIGINT, signal.default_int_handler)
        sigint.install()
    # torch 2.9 + torch_xla 2.9: a CPU backward pass run before the XLA runtime starts
    # makes every later XLA backward fail an internal assert. Start XLA first, as a
    # program that uses XLA does.
    if HAS_XLA:
        import torch_xla

        torch_xla.device()


@pytest.fixture
def simulate_device(monkeypatch: pytest.MonkeyPatch) -> Callable[..., SimulatedDeviceModule]:
    """``simulate_device("xpu", count=2, accelerator=True)`` -> the SIMULATED module."""

    def make(type_name: str, count: int = 1, *, accelerator: bool = False,
             initialized: bool = True) -> SimulatedDeviceModule:
        fake = SimulatedDeviceModule(type_name, count, initialized=initialized)
        install_simulated(fake, getattr(torch, type_name),
                          lambda m, n, v: monkeypatch.setattr(m, n, v, raising=False))
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


