"""``backend="eager"``: no compilation; the generators of the inputs' devices are seeded per call."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from devrng._jit_backends import HostSeeder, input_types, seed_to_int

__all__ = ["EagerRunner", "make_runner"]


class EagerRunner:
    """Calls ``fn`` directly with the CPU and device generators seeded and restored around it."""

    compile_count = 0  # nothing is ever compiled

    def __init__(self, fn: Callable[..., Any]) -> None:
        self._fn = fn
        self._seeder: HostSeeder | None = None

    def __call__(self, seed: int | torch.Tensor, args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> Any:
        seeder = self._seeder
        if seeder is None:
            seeder = self._seeder = HostSeeder(input_types((args, kwargs)))
        return seeder.run(seed_to_int(seed), self._fn, args, kwargs)


def make_runner(fn: Callable[..., Any], compile_kwargs: dict[str, Any]) -> EagerRunner:
    if compile_kwargs:
        raise TypeError(
            f"backend='eager' compiles nothing and takes no compile options, but got "
            f"{sorted(compile_kwargs)}; drop them or choose a compiling backend."
        )
    return EagerRunner(fn)
