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

from devrng._backends.xla import get_seed, set_seed
from devrng._generators.infer import arg_devices
from devrng._jit.compilers.runner import SeededRunner

__all__ = ["XLASeeder", "make_runner", "xla_compiles", "xla_devices", "xla_runner"]

_cpu = torch.default_generator


def xla_compiles() -> int:
    """XLA compilations in this process so far, from torch_xla's metrics."""
    data = met.metric_data("CompileTime")
    return int(data[0]) if data else 0


def xla_devices(args: Any) -> list[str]:
    """The XLA devices of the tensors in ``args``; the default XLA device if there are none."""
    indices = arg_devices(args).indices.get("xla")
    if not indices:
        return [str(torch_xla.device())]
    return [f"xla:{index}" if index is not None else str(torch_xla.device())
            for index in indices]


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
        saved = [(d, int(get_seed(d))) for d in self.devices]
        try:
            _cpu.manual_seed(seed)
            for d in self.devices:
                set_seed(seed, d)
            return fn(*args, **kwargs)
        finally:
            for d, state in saved:
                set_seed(state, d)
            _cpu.set_state(cpu)


def xla_runner(compiled: Callable[..., Any],
               key_device: Callable[[Any], torch.device] | None = None) -> SeededRunner:
    """Runs a compiled XLA callable under a seed; shared by torch_xla and openxla."""
    return SeededRunner(compiled, XLASeeder, xla_compiles, key_device=key_device)


def make_runner(fn: Callable[..., Any], compile_kwargs: dict[str, Any]) -> SeededRunner:
    return xla_runner(torch_xla.compile(fn, **compile_kwargs))
