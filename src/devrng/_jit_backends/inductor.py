"""``backend="inductor"``: ``torch.compile`` with the seed entering at run time.

Inductor's generated code draws its random seeds from torch's default
generator (and the device generators) when it runs, not when it compiles, and
dynamo puts the global RNG state back after tracing. So seeding those
generators right before each call makes the seed a runtime value: equal seeds
give equal outputs from the very first call, and a new seed never recompiles.
Compilations are read from dynamo's own counters.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch._dynamo
from torch._dynamo.utils import counters

from devrng._jit_backends import HostSeeder, input_types, seed_to_int

__all__ = ["DynamoRunner", "make_runner"]


def _graphs() -> int:
    # Every graph dynamo hands to a backend, recompilations included.
    return int(counters["stats"]["unique_graphs"])


class DynamoRunner:
    """``torch.compile(fn, **compile_kwargs)`` called with the host generators seeded."""

    def __init__(self, fn: Callable[..., Any], compile_kwargs: dict[str, Any]) -> None:
        self._compiled = torch.compile(fn, **compile_kwargs)
        self._seeder: HostSeeder | None = None
        self._compiles = 0

    @property
    def compile_count(self) -> int:
        return self._compiles

    def __call__(self, seed: int | torch.Tensor, args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> Any:
        seeder = self._seeder
        if seeder is None:
            seeder = self._seeder = HostSeeder(input_types((args, kwargs)))
        before = _graphs()
        try:
            return seeder.run(seed_to_int(seed), self._compiled, args, kwargs)
        finally:
            # torch._dynamo.reset() clears the counters; never count backwards.
            self._compiles += max(0, _graphs() - before)


def make_runner(fn: Callable[..., Any], compile_kwargs: dict[str, Any]) -> DynamoRunner:
    return DynamoRunner(fn, compile_kwargs)
