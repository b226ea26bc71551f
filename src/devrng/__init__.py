"""devrng: random number generation in PyTorch that is correct on every device.

Example:
    >>> import devrng
    >>> with devrng.fork_rng(devices=[xla_tensor]):   # forks XLA *and* CPU
    ...     out = model(xla_tensor)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from devrng._errors import DevRNGError
from devrng._fork import fork_rng
from devrng._infer import infer_device_types
from devrng._patch import patch_torch, unpatch_torch
from devrng._registry import Backend, available_backends, get_backend, register_backend
from devrng._state import RNGState, get_rng_state, manual_seed, set_rng_state

if TYPE_CHECKING:
    from devrng import distributed, testing
    from devrng._determinism import deterministic
    from devrng._jit import seeded_jit
    from devrng._streams import RNGStreams
    from devrng._workers import seed_worker

__version__ = "0.1.0"

__all__ = [
    "Backend",
    "DevRNGError",
    "RNGState",
    "RNGStreams",
    "available_backends",
    "deterministic",
    "distributed",
    "fork_rng",
    "get_backend",
    "get_rng_state",
    "infer_device_types",
    "manual_seed",
    "patch_torch",
    "register_backend",
    "seed_worker",
    "seeded_jit",
    "set_rng_state",
    "testing",
    "unpatch_torch",
]

# Loaded on first access, so that `import devrng` stays light.
_LAZY = {
    "seeded_jit": ("devrng._jit", "seeded_jit"),
    "deterministic": ("devrng._determinism", "deterministic"),
    "seed_worker": ("devrng._workers", "seed_worker"),
    "RNGStreams": ("devrng._streams", "RNGStreams"),
    "distributed": ("devrng.distributed", None),
    "testing": ("devrng.testing", None),
}


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'devrng' has no attribute {name!r}")
    import importlib

    module = importlib.import_module(target[0])
    value = module if target[1] is None else getattr(module, target[1])
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
