"""``backend="torch_xla"``: ``torch_xla.compile`` with the XLA seed set per call.

torch_xla keeps one running seed per device and feeds it to the traced graph
as data, so setting it right before a call changes the random draws without
changing the graph: one compilation serves every seed, and the first call is
as reproducible as the others. The caller's seeds (and CPU state) are put back
after the call. Compilations are read from XLA's ``CompileTime`` metric.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch_xla
import torch_xla.debug.metrics as met

from devrng._jit_backends import input_tensors, seed_to_int

__all__ = ["XLARunner", "XLASeeder", "make_runner", "xla_compiles"]

_get_seed = torch_xla._XLAC._xla_get_rng_seed
_set_seed = torch_xla._XLAC._xla_set_rng_seed
_cpu = torch.default_generator


def xla_compiles() -> int:
    """XLA compilations in this process so far, from torch_xla's metrics."""
    data = met.metric_data("CompileTime")
    return int(data[0]) if data else 0


def xla_devices(args: Any) -> list[str]:
    """The XLA devices of the tensors in ``args``; the default XLA device if there are none."""
    out: list[str] = []
    for t in input_tensors(args):
        if t.device.type == "xla":
            name = str(t.device)
            if name not in out:
                out.append(name)
    return out or [str(torch_xla.device())]


class XLASeeder:
    """Seeds CPU and the given XLA devices, runs, and restores them; counts XLA compilations."""

    __slots__ = ("compiles", "devices")

    def __init__(self, devices: list[str]) -> None:
        self.devices = devices
        self.compiles = 0

    def run(self, seed: int, fn: Callable[..., Any], args: tuple[Any, ...],
            kwargs: dict[str, Any]) -> Any:
        cpu = _cpu.get_state()
        saved = [(d, int(_get_seed(d))) for d in self.devices]
        before = xla_compiles()
        try:
            _cpu.manual_seed(seed)
            for d in self.devices:
                _set_seed(seed, d)
            return fn(*args, **kwargs)
        finally:
            self.compiles += max(0, xla_compiles() - before)
            for d, state in saved:
                _set_seed(state, d)
            _cpu.set_state(cpu)


class XLARunner:
    """Runs a compiled XLA callable under a seed; shared by torch_xla and openxla."""

    def __init__(self, compiled: Callable[..., Any]) -> None:
        self._compiled = compiled
        self._seeder: XLASeeder | None = None

    @property
    def compile_count(self) -> int:
        return 0 if self._seeder is None else self._seeder.compiles

    def __call__(self, seed: int | torch.Tensor, args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> Any:
        seeder = self._seeder
        if seeder is None:
            seeder = self._seeder = XLASeeder(xla_devices((args, kwargs)))
        # XLA takes its seed as a host integer: a seed tensor costs one transfer.
        return seeder.run(seed_to_int(seed), self._compiled, args, kwargs)


def make_runner(fn: Callable[..., Any], compile_kwargs: dict[str, Any]) -> XLARunner:
    return XLARunner(torch_xla.compile(fn, **compile_kwargs))
