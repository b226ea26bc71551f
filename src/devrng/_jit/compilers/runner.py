"""What every compiler module of ``seeded_jit`` shares: the runner, the seeder, seed conversion.

Each compiler module (``devrng._jit.compilers.<name>``) exposes
``make_runner(fn, compile_kwargs) -> Runner`` and imports its compiler
(dynamo, torch_xla, JAX) at the top, so that importing it is what fails when
the package is missing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

from devrng._backends.host import seed_cpu
from devrng._backends.registry import Backend, device_count, get_backend
from devrng._base.lazy import load
from devrng._base.locks import ForkSafeLock
from devrng._base.seeds import MASK64
from devrng._generators.infer import arg_devices
from devrng._generators.undo import Undo, around_cpu

__all__ = ["HostSeeder", "MakeRunner", "Runner", "SeededRunner", "Seeder", "input_types",
           "seed_lock", "seed_to_int"]

#: Held while a seeded call sets the global generators, runs and puts them back: those
#: generators are process-wide, so two threads must not interleave there. Reentrant,
#: so that a seeded function may call another.
seed_lock = ForkSafeLock()


class Runner(Protocol):
    """A compiled function that runs under a given seed.

    ``portable`` is None, or the ``strict`` flag of the ``devrng.portable``
    stream active at the call: then the function's random ops draw from the
    portable stream of the call's seed (``with portable(seed): fn(...)``).
    """

    def __call__(self, seed: int | torch.Tensor, args: tuple[Any, ...],
                 kwargs: dict[str, Any], portable: bool | None = None) -> Any: ...

    @property
    def compile_count(self) -> int: ...


MakeRunner = Callable[[Callable[..., Any], dict[str, Any]], Runner]


def seed_to_int(seed: int | torch.Tensor) -> int:
    """A validated seed as a Python int; a tensor is read once (its 64 bits, unsigned)."""
    if isinstance(seed, int):
        return seed
    return int(seed.item()) & MASK64


def input_types(args: Any) -> list[str]:
    """Device types of the tensors and modules in ``args``, first-seen order, without cpu and meta."""
    return list(arg_devices(args).indices)


class Seeder(Protocol):
    """Sets the generators a compiled function reads to a seed, runs it, restores them."""

    def run(self, seed: int, fn: Callable[..., Any], args: tuple[Any, ...],
            kwargs: dict[str, Any]) -> Any: ...


class SeededRunner:
    """Runs ``compiled`` under a seed: the runner of eager, inductor, torch_xla and openxla.

    ``make_seeder`` builds the ``Seeder`` from the first call's ``(args, kwargs)``;
    ``compiles``, a process-wide count read from the compiler, is sampled around each
    call to count this function's compilations (None: it never compiles).
    ``key_device(args)`` says where a portable stream's key must live for this
    compiler (None: on the host, read by the graph through devrng's own op).
    """

    __slots__ = ("_compiled", "_compiles", "_counter", "_key_device", "_make_seeder", "_seeder")

    def __init__(self, compiled: Callable[..., Any], make_seeder: Callable[[Any], Seeder],
                 compiles: Callable[[], int] | None = None, *,
                 key_device: Callable[[Any], torch.device] | None = None) -> None:
        self._compiled = compiled
        self._make_seeder = make_seeder
        self._counter = compiles
        self._key_device = key_device
        self._seeder: Seeder | None = None
        self._compiles = 0

    @property
    def compile_count(self) -> int:
        return self._compiles

    def __call__(self, seed: int | torch.Tensor, args: tuple[Any, ...],
                 kwargs: dict[str, Any], portable: bool | None = None) -> Any:
        seeder = self._seeder
        if seeder is None:
            seeder = self._seeder = self._make_seeder((args, kwargs))
        value = seed_to_int(seed)
        fn = self._compiled
        if portable is not None:
            fn = self._in_portable(fn, value, portable, (args, kwargs))
        counter = self._counter
        with seed_lock:
            if counter is None:
                return seeder.run(value, fn, args, kwargs)
            before = counter()
            try:
                return seeder.run(value, fn, args, kwargs)
            finally:
                # Resetting the compiler (torch._dynamo.reset()) clears its counts: never
                # count backwards.
                self._compiles += max(0, counter() - before)

    def _in_portable(self, fn: Callable[..., Any], seed: int, strict: bool, inputs: Any
                     ) -> Callable[..., Any]:
        """``fn`` called inside the portable stream of ``seed`` (entered outside the
        compiled region: dynamo reads the stream's state as graph inputs)."""
        call_stream = load("devrng._portable.rng:call_stream", what="devrng.portable")
        key_device = None if self._key_device is None else self._key_device(inputs)
        stream = call_stream(seed, strict, key_device)

        def inside(*args: Any, **kwargs: Any) -> Any:
            with stream:
                return fn(*args, **kwargs)

        return inside


class HostSeeder:
    """Seeds the CPU generator and every generator of the arguments' device types; restores them.

    Used by the backends whose random ops read torch's ordinary generators at
    run time (eager, inductor): seeding them right before the call is what
    makes the seed a runtime value, so a new seed never recompiles.
    """

    __slots__ = ("_backends",)

    def __init__(self, args: Any) -> None:
        self._backends: list[tuple[Backend, range]] = []
        for kind in input_types(args):
            backend = get_backend(kind)
            self._backends.append((backend, range(device_count(backend))))

    def run(self, seed: int, fn: Callable[..., Any], args: tuple[Any, ...],
            kwargs: dict[str, Any]) -> Any:
        if not self._backends:  # CPU inputs: the common eager call
            return around_cpu(self._seeded, seed, fn, args, kwargs)
        undo = Undo.of_plan("seeded_jit", self._backends)
        return undo.around(self._seeded, seed, fn, args, kwargs)

    def _seeded(self, seed: int, fn: Callable[..., Any], args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> Any:
        seed_cpu(seed)
        for backend, _ in self._backends:
            backend.manual_seed(seed)
        return fn(*args, **kwargs)
