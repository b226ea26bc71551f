"""The host generators -- torch's CPU generator, Python's ``random``, NumPy's global
generator: get, set and seed them.

NumPy is imported only when a caller asks for its state, and only if present.
Whether a saved state is one these generators can take is checked in
``devrng._generators.saved``.
"""

from __future__ import annotations

import random
from typing import Any

import torch

from devrng._base.lazy import imported

__all__ = ["draw_seed", "get_cpu_state", "get_numpy_state", "get_python_state", "numpy_or_none",
           "seed_cpu", "seed_numpy", "set_cpu_state", "set_numpy_state", "set_python_state"]

get_cpu_state = torch.default_generator.get_state
set_cpu_state = torch.default_generator.set_state
seed_cpu = torch.default_generator.manual_seed
get_python_state = random.getstate
set_python_state = random.setstate



def draw_seed() -> int:
    """A 64-bit seed drawn from torch's CPU generator: what ``seeded_jit`` and ``portable``
    take without a seed of their own, so that ``torch.manual_seed`` at program start fixes
    them too.

    Examples:
        >>> _ = torch.manual_seed(0); a = draw_seed()
        >>> _ = torch.manual_seed(0); a == draw_seed()
        True
    """
    hi, lo = torch.randint(0, 1 << 32, (2,), dtype=torch.int64).tolist()
    return int((hi << 32) | lo)


def numpy_or_none() -> Any:
    np = imported("numpy")  # an import under way in another thread: wait for it
    if np is None:
        try:
            import numpy as np
        except ImportError:
            return None
    return np


def get_numpy_state() -> Any:
    """NumPy's global state as a dict (``legacy=False``), or None without NumPy."""
    np = numpy_or_none()
    return None if np is None else np.random.get_state(legacy=False)


def set_numpy_state(state: Any) -> None:
    if state is not None:
        numpy_or_none().random.set_state(state)


def seed_numpy(seed: int) -> None:
    """Seed NumPy's global generator with all 64 bits of ``seed``.

    Seeds below 2**32 are passed as they are, so ``seed_numpy(s)`` equals
    ``np.random.seed(s)`` for every seed NumPy accepts itself.
    """
    np = numpy_or_none()
    if np is None:
        return
    np.random.seed(seed if seed < 2**32 else [seed & 0xFFFFFFFF, seed >> 32])

