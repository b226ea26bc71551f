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

from devrng._jit_backends import SeededRunner, input_tensors

__all__ = ["XLASeeder", "make_runner", "xla_compiles", "xla_devices", "xla_runner"]

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
    """Seeds CPU and the arguments' XLA devices (the default one if none), runs, restores.

    XLA takes its seed as a host integer: a seed tensor costs one transfer.
    """

    __slots__ = ("devices",)

    def __init__(self, args: Any) -> None:
        self.devices = xla_devices(args)

    def run(self, seed: int, fn: Callable[..., Any], args: tuple[Any, ...],
            kwargs: dict[str, Any]) -> Any:
        cpu = _cpu.get_state()
        saved = [(d, int(_get_seed(d))) for d in self.devices]
        try:
            _cpu.manual_seed(seed)
            for d in self.devices:
                _set_seed(seed, d)
            return fn(*args, **kwargs)
        finally:
            for d, state in saved:
                _set_seed(state, d)
            _cpu.set_state(cpu)


def xla_runner(compiled: Callable[..., Any]) -> SeededRunner:
    """Runs a compiled XLA callable under a seed; shared by torch_xla and openxla."""
    return SeededRunner(compiled, XLASeeder, xla_compiles)


def make_runner(fn: Callable[..., Any], compile_kwargs: dict[str, Any]) -> SeededRunner:
    return xla_runner(torch_xla.compile(fn, **compile_kwargs))
