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

from devrng import _sigint

__version__ = "0.1.0"

# A Ctrl-C that lands inside a devrng call is raised when the call ends (devrng._sigint).
_sigint.install()

if TYPE_CHECKING:  # the public names, for type checkers (``X as X``: re-exported)
    from devrng import distributed as distributed
    from devrng import testing as testing
    from devrng._determinism import (
        DeterministicHandle as DeterministicHandle,
    )
    from devrng._determinism import (
        deterministic as deterministic,
    )
    from devrng._errors import DevRNGError as DevRNGError
    from devrng._errors import DevRNGWarning as DevRNGWarning
    from devrng._fork import fork_rng as fork_rng
    from devrng._infer import infer_device_types as infer_device_types
    from devrng._jit import SeededFunction as SeededFunction
    from devrng._jit import seeded_jit as seeded_jit
    from devrng._patch import patch_torch as patch_torch
    from devrng._patch import unpatch_torch as unpatch_torch
    from devrng._portable import PortableRNG as PortableRNG
    from devrng._portable import portable as portable
    from devrng._registry import (
        Backend as Backend,
    )
    from devrng._registry import (
        available_backends as available_backends,
    )
    from devrng._registry import (
        get_backend as get_backend,
    )
    from devrng._registry import (
        register_backend as register_backend,
    )
    from devrng._restore import set_rng_state as set_rng_state
    from devrng._seeding import manual_seed as manual_seed
    from devrng._state import RNGState as RNGState
    from devrng._state import get_rng_state as get_rng_state
    from devrng._streams import RNGStreams as RNGStreams
    from devrng._training import TrainingRNG as TrainingRNG
    from devrng._workers import sample_rng as sample_rng
    from devrng._workers import seed_worker as seed_worker

# name -> (module, attribute; None for the module itself)
_LAZY: dict[str, tuple[str, str | None]] = {
    "Backend": ("devrng._registry", "Backend"),
    "DeterministicHandle": ("devrng._determinism", "DeterministicHandle"),
    "DevRNGError": ("devrng._errors", "DevRNGError"),
    "DevRNGWarning": ("devrng._errors", "DevRNGWarning"),
    "PortableRNG": ("devrng._portable", "PortableRNG"),
    "RNGState": ("devrng._state", "RNGState"),
    "RNGStreams": ("devrng._streams", "RNGStreams"),
    "SeededFunction": ("devrng._jit", "SeededFunction"),
    "TrainingRNG": ("devrng._training", "TrainingRNG"),
    "available_backends": ("devrng._registry", "available_backends"),
    "deterministic": ("devrng._determinism", "deterministic"),
    "distributed": ("devrng.distributed", None),
    "fork_rng": ("devrng._fork", "fork_rng"),
    "get_backend": ("devrng._registry", "get_backend"),
    "get_rng_state": ("devrng._state", "get_rng_state"),
    "infer_device_types": ("devrng._infer", "infer_device_types"),
    "manual_seed": ("devrng._seeding", "manual_seed"),
    "patch_torch": ("devrng._patch", "patch_torch"),
    "portable": ("devrng._portable", "portable"),
    "register_backend": ("devrng._registry", "register_backend"),
    "sample_rng": ("devrng._workers", "sample_rng"),
    "seed_worker": ("devrng._workers", "seed_worker"),
    "seeded_jit": ("devrng._jit", "seeded_jit"),
    "set_rng_state": ("devrng._restore", "set_rng_state"),
    "testing": ("devrng.testing", None),
    "unpatch_torch": ("devrng._patch", "unpatch_torch"),
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
