"""devrng: random number generation in PyTorch that is correct on every device.

Every public name is loaded on first use, so ``import devrng`` costs nothing
until one is touched (and ``devrng --help`` never waits for torch); using one
imports torch and nothing heavier.

Examples:
    >>> import torch, devrng
    >>> with devrng.fork_rng(devices=[torch.ones(2)]):   # the devices' types are inferred
    ...     a = torch.rand(2)
    >>> torch.equal(a, torch.rand(2))
    True
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from devrng._base import sigint
from devrng._base.version import VERSION

__version__ = VERSION

# A Ctrl-C that lands inside a devrng call is raised when the call ends (devrng._base.sigint).
sigint.install()

if TYPE_CHECKING:  # the public names, for type checkers (``X as X``: re-exported)
    from devrng import distributed as distributed
    from devrng import testing as testing
    from devrng._backends.registry import (
        Backend as Backend,
    )
    from devrng._backends.registry import (
        available_backends as available_backends,
    )
    from devrng._backends.registry import (
        get_backend as get_backend,
    )
    from devrng._backends.registry import (
        register_backend as register_backend,
    )
    from devrng._base.errors import DevRNGError as DevRNGError
    from devrng._base.errors import DevRNGWarning as DevRNGWarning
    from devrng._checks.record import FlightRecord as FlightRecord
    from devrng._generators.fork import fork_rng as fork_rng
    from devrng._generators.infer import infer_device_types as infer_device_types
    from devrng._generators.patch import patch_torch as patch_torch
    from devrng._generators.patch import unpatch_torch as unpatch_torch
    from devrng._generators.seeding import manual_seed as manual_seed
    from devrng._generators.snapshot import RNGState as RNGState
    from devrng._generators.snapshot import get_rng_state as get_rng_state
    from devrng._generators.snapshot import set_rng_state as set_rng_state
    from devrng._generators.streams import RNGStreams as RNGStreams
    from devrng._jit.seeded import SeededFunction as SeededFunction
    from devrng._jit.seeded import seeded_jit as seeded_jit
    from devrng._portable.rng import PortableRNG as PortableRNG
    from devrng._portable.rng import portable as portable
    from devrng._training.determinism import (
        DeterministicHandle as DeterministicHandle,
    )
    from devrng._training.determinism import (
        deterministic as deterministic,
    )
    from devrng._training.training_rng import TrainingRNG as TrainingRNG
    from devrng._training.workers import sample_rng as sample_rng
    from devrng._training.workers import seed_worker as seed_worker

# name -> (module, attribute; None for the module itself)
_LAZY: dict[str, tuple[str, str | None]] = {
    "Backend": ("devrng._backends.registry", "Backend"),
    "DeterministicHandle": ("devrng._training.determinism", "DeterministicHandle"),
    "DevRNGError": ("devrng._base.errors", "DevRNGError"),
    "DevRNGWarning": ("devrng._base.errors", "DevRNGWarning"),
    "FlightRecord": ("devrng._checks.record", "FlightRecord"),
    "PortableRNG": ("devrng._portable.rng", "PortableRNG"),
    "RNGState": ("devrng._generators.snapshot", "RNGState"),
    "RNGStreams": ("devrng._generators.streams", "RNGStreams"),
    "SeededFunction": ("devrng._jit.seeded", "SeededFunction"),
    "TrainingRNG": ("devrng._training.training_rng", "TrainingRNG"),
    "available_backends": ("devrng._backends.registry", "available_backends"),
    "deterministic": ("devrng._training.determinism", "deterministic"),
    "distributed": ("devrng.distributed", None),
    "fork_rng": ("devrng._generators.fork", "fork_rng"),
    "get_backend": ("devrng._backends.registry", "get_backend"),
    "get_rng_state": ("devrng._generators.snapshot", "get_rng_state"),
    "infer_device_types": ("devrng._generators.infer", "infer_device_types"),
    "manual_seed": ("devrng._generators.seeding", "manual_seed"),
    "patch_torch": ("devrng._generators.patch", "patch_torch"),
    "portable": ("devrng._portable.rng", "portable"),
    "register_backend": ("devrng._backends.registry", "register_backend"),
    "sample_rng": ("devrng._training.workers", "sample_rng"),
    "seed_worker": ("devrng._training.workers", "seed_worker"),
    "seeded_jit": ("devrng._jit.seeded", "seeded_jit"),
    "set_rng_state": ("devrng._generators.snapshot", "set_rng_state"),
    "testing": ("devrng.testing", None),
    "unpatch_torch": ("devrng._generators.patch", "unpatch_torch"),
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'devrng' has no attribute {name!r}")
    module = importlib.import_module(target[0])
    value = module if target[1] is None else getattr(module, target[1])
    globals()[name] = value  # later lookups are plain module attributes
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
