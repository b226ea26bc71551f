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

from devrng._jit.compilers.runner import HostSeeder, SeededRunner

__all__ = ["make_runner"]


def _graphs() -> int:
    # Every graph dynamo hands to a backend, recompilations included.
    return int(counters["stats"]["unique_graphs"])


def make_runner(fn: Callable[..., Any], compile_kwargs: dict[str, Any]) -> SeededRunner:
    """``torch.compile(fn, **compile_kwargs)`` called with the host generators seeded."""
    return SeededRunner(torch.compile(fn, **compile_kwargs), HostSeeder, _graphs)
