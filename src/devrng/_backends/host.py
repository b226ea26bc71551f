"""The host generators -- torch's CPU generator, Python's ``random``, NumPy's global
generator: get, set, seed, and check a state.

NumPy is imported only when a caller asks for its state, and only if present.
The checks refuse every state these generators would accept and then break
on: NumPy does not range-check its MT19937 position (a large one reads out of
bounds on the next draw), Python keeps any object as its Gaussian cache, and
torch takes any uint8 tensor of the right size as a CPU state.
"""

from __future__ import annotations

import math
import os
import random
import sys
from typing import Any

import torch

from devrng._base.plain import describe

__all__ = ["check_cpu_state", "check_numpy_state", "check_python_state", "cpu_state_numel",
           "draw_seed", "get_cpu_state", "get_numpy_state", "get_python_state", "numpy_or_none",
           "seed_cpu", "seed_numpy", "set_cpu_state", "set_numpy_state", "set_python_state"]

get_cpu_state = torch.default_generator.get_state
set_cpu_state = torch.default_generator.set_state
seed_cpu = torch.default_generator.manual_seed
get_python_state = random.getstate
set_python_state = random.setstate

_MT_WORDS = 624


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
_scratch = random.Random(0)  # states are tried here first, never on the global generator
_scratch_cpu = torch.Generator()  # likewise for torch's CPU generator
_cpu_numel: list[int] = []  # the size of this torch's CPU generator state, read once


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


def check_python_state(state: Any) -> None:
    """Raise ``ValueError`` unless ``random.setstate(state)`` would install a working generator.

    Examples:
        >>> check_python_state(random.getstate())
    """
    if not (isinstance(state, tuple) and len(state) == 3 and state[0] == 3
            and isinstance(state[1], tuple) and len(state[1]) == _MT_WORDS + 1):
        raise ValueError("it is not a tuple (3, 625 ints, gauss) as random.getstate() returns")
    gauss = state[2]
    if gauss is not None and (type(gauss) is not float or not math.isfinite(gauss)):
        raise ValueError(f"its Gaussian cache is {gauss!r}; it must be a finite float or None")
    if not any(state[1][:_MT_WORDS]):
        raise ValueError("its MT19937 key is all zeros, which generates nothing but zeros")
    try:
        _scratch.setstate(state)  # checks every word and the position
    except (TypeError, ValueError, OverflowError) as err:
        raise ValueError(f"random.setstate refuses it ({err})") from None


def check_numpy_state(state: Any) -> None:
    """Raise ``ValueError`` unless NumPy's global generator can take ``state`` and keep working.

    Examples:
        >>> check_numpy_state(get_numpy_state())
    """
    np = numpy_or_none()
    if np is None:
        raise ValueError("it is a NumPy state and NumPy is not installed here")
    name = state.get("bit_generator") if isinstance(state, dict) else None
    if name != "MT19937":
        raise ValueError(f"its bit generator is {name!r}; NumPy's global generator is 'MT19937'")
    try:
        inner = state["state"]
        key, pos = inner["key"], inner["pos"]
        has_gauss, gauss = state["has_gauss"], state["gauss"]
    except (KeyError, TypeError, IndexError):
        raise ValueError("it is not the dict np.random.get_state(legacy=False) returns") from None
    if not (isinstance(key, np.ndarray) and key.dtype == np.uint32
            and key.shape == (_MT_WORDS,)):
        raise ValueError("its key is not 624 uint32 words")
    if not key.any():
        raise ValueError("its MT19937 key is all zeros, which generates nothing but zeros")
    if type(pos) is not int or not 0 <= pos <= _MT_WORDS:
        raise ValueError(f"its position is {pos!r}; it must be an int from 0 to 624")
    if has_gauss not in (0, 1) or type(has_gauss) is bool:
        raise ValueError(f"its has_gauss is {has_gauss!r}; it must be 0 or 1")
    if type(gauss) is not float or not math.isfinite(gauss):
        raise ValueError(f"its Gaussian cache is {gauss!r}; it must be a finite float")


def cpu_state_numel() -> int:
    """How many bytes this torch's CPU generator state has."""
    if not _cpu_numel:
        _cpu_numel.append(get_cpu_state().numel())
    return _cpu_numel[0]


def check_cpu_state(state: Any) -> None:
    """Raise ``ValueError`` unless ``state`` is a CPU generator state this torch can take.

    Used for the CPU state of snapshots, of streams and of DataLoader generators.

    Examples:
        >>> check_cpu_state(torch.get_rng_state())
    """
    if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8 or state.dim() != 1 \
            or state.numel() != cpu_state_numel() or state.device.type != "cpu":
        raise ValueError(
            f"its CPU state is {describe(state)}; this torch needs a uint8 CPU tensor of "
            f"{cpu_state_numel()} elements"
        )
    try:
        _scratch_cpu.set_state(state)  # checks the MT19937 position and key
    except RuntimeError as err:
        raise ValueError(f"its CPU state is not a valid MT19937 state ({err})") from None


def put_env(name: str, value: str | None) -> None:
    """Set environment variable ``name`` to ``value``; ``None`` removes it."""
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
