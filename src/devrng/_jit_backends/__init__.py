"""Compiler glue for :func:`devrng.seeded_jit`, one module per backend.

Each module exposes ``make_runner(fn, compile_kwargs) -> Runner`` and imports
its compiler (dynamo, torch_xla, JAX) at the top, so that importing it is what
fails when the package is missing. Shared, light helpers live here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch
from torch.utils._pytree import tree_leaves

from devrng._fork import restore_all
from devrng._mix import MASK64
from devrng._registry import Backend, get_backend

__all__ = ["HostSeeder", "Runner", "input_tensors", "input_types", "seed_to_int"]

_cpu = torch.default_generator


class Runner(Protocol):
    """A compiled function that runs under a given seed."""

    def __call__(self, seed: int | torch.Tensor, args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> Any: ...

    @property
    def compile_count(self) -> int: ...


MakeRunner = Callable[[Callable[..., Any], dict[str, Any]], Runner]


def seed_to_int(seed: int | torch.Tensor) -> int:
    """A validated seed as a Python int; a tensor is read once (its 64 bits, unsigned)."""
    if isinstance(seed, int):
        return seed
    return int(seed.item()) & MASK64


def input_tensors(args: Any) -> Iterator[torch.Tensor]:
    """Every tensor in ``args``: pytree leaves, and the parameters and buffers of modules."""
    for leaf in tree_leaves(args):
        if isinstance(leaf, torch.Tensor):
            yield leaf
        elif isinstance(leaf, torch.nn.Module):
            yield from leaf.parameters()
            yield from leaf.buffers()


def input_types(args: Any) -> list[str]:
    """Device types of the tensors in ``args``, first-seen order, without cpu and meta."""
    out: list[str] = []
    for t in input_tensors(args):
        kind = t.device.type
        if kind not in ("cpu", "meta") and kind not in out:
            out.append(kind)
    return out


class HostSeeder:
    """Seeds the CPU generator and every generator of the given device types; restores them.

    Used by the backends whose random ops read torch's ordinary generators at
    run time (eager, inductor): seeding them right before the call is what
    makes the seed a runtime value, so a new seed never recompiles.
    """

    __slots__ = ("_backends",)

    def __init__(self, device_types: list[str]) -> None:
        self._backends: list[tuple[Backend, range]] = []
        for kind in device_types:
            backend = get_backend(kind)
            self._backends.append((backend, range(int(backend.device_count()))))

    def run(self, seed: int, fn: Callable[..., Any], args: tuple[Any, ...],
            kwargs: dict[str, Any]) -> Any:
        cpu = _cpu.get_state()
        devices = [(b, i, b.get_rng_state(i)) for b, indices in self._backends for i in indices]
        try:
            _cpu.manual_seed(seed)
            for backend, _ in self._backends:
                backend.manual_seed(seed)
            return fn(*args, **kwargs)
        finally:
            if devices:
                restore_all(cpu, devices, None, None, what="seeded_jit")
            else:
                _cpu.set_state(cpu)
