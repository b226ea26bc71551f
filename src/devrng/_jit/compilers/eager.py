"""``backend="eager"``: no compilation; the generators of the inputs' devices are seeded per call."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from devrng._jit.compilers.runner import HostSeeder, SeededRunner

__all__ = ["make_runner"]


def make_runner(fn: Callable[..., Any], compile_kwargs: dict[str, Any]) -> SeededRunner:
    if compile_kwargs:
        raise TypeError(
            f"backend='eager' compiles nothing and takes no compile options, but got "
            f"{sorted(compile_kwargs)}; drop them or choose a compiling backend."
        )
    # Calls fn directly with the host generators seeded; nothing is ever compiled.
    return SeededRunner(fn, HostSeeder)
