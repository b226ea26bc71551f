"""Python's ``random`` and NumPy's global generator: get, set, seed.

NumPy is imported only when a caller asks for its state, and only if present.
"""

from __future__ import annotations

import random
import sys
from typing import Any

__all__ = ["get_numpy_state", "get_python_state", "numpy_or_none", "seed_numpy",
           "set_numpy_state", "set_python_state"]

get_python_state = random.getstate
set_python_state = random.setstate


def numpy_or_none() -> Any:
    np = sys.modules.get("numpy")
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
