"""The host generators -- torch's CPU generator, Python's ``random``, NumPy's global
generator: get, set and seed them.

NumPy is imported only when a caller asks for its state, and only if present.
Whether a saved state is one these generators can take is checked in
``devrng._generators.saved``.
"""

from __future__ import annotations

import random
import struct
from typing import Any

import torch

from devrng._base.errors import DevRNGError
from devrng._base.lazy import imported

__all__ = ["draw_seed", "get_cpu_state", "get_numpy_state", "get_python_state", "numpy_or_none",
           "seed_cpu", "seed_numpy", "set_cpu_state", "set_numpy_state", "set_python_state"]

get_cpu_state = torch.default_generator.get_state
set_cpu_state = torch.default_generator.set_state
get_python_state = random.getstate
set_python_state = random.setstate

# torch's CPU state (``CPUGeneratorImplState``): the initial seed (8 bytes), ``left`` and
# ``seeded`` (4 each), ``next`` (8), then the 624 MT19937 words, each as a uint64.
_MT_WORDS = struct.Struct("=624Q")
_MT_OFFSET = 24
_layout: list[bool] = []  # whether this torch's state is laid out so: probed once


def seed_cpu(seed: int, generator: torch.Generator = torch.default_generator) -> None:
    """Seed torch's CPU generator (``generator``) with all 64 bits of a checked ``seed``.

    MT19937 keeps only the low 32 bits of what ``torch.manual_seed`` gives it: ``s`` and
    ``s + 2**32`` would give the same numbers. Seeds below 2**32 are seeded by torch, so
    ``seed_cpu(s)`` equals ``torch.manual_seed(s)`` for them; a larger seed fills the 624
    words from both of its 32-bit halves (MT19937's ``init_by_array([low, high])``, as
    ``random.seed(seed)`` and ``np.random.seed([low, high])`` do), and
    ``torch.initial_seed()`` still says ``seed``.

    Examples:
        >>> seed_cpu(7); a = torch.rand(1)
        >>> _ = torch.manual_seed(7); torch.equal(a, torch.rand(1))
        True
        >>> seed_cpu(7 + 2**32); torch.equal(a, torch.rand(1))
        False
    """
    generator.manual_seed(seed)
    if seed >= 1 << 32:
        state = generator.get_state()
        _check_layout(state)
        # (Python's random.seed is init_by_array over the seed's 32-bit words, low first.)
        words = bytearray(_MT_WORDS.pack(*random.Random(seed).getstate()[1][:624]))
        state[_MT_OFFSET:_MT_OFFSET + _MT_WORDS.size] = torch.frombuffer(words, dtype=torch.uint8)
        generator.set_state(state)


def _check_layout(state: torch.Tensor) -> None:
    """Raise ``DevRNGError`` unless this torch's CPU state holds the MT19937 words where
    ``seed_cpu`` writes them (probed once: the words torch seeds 5489 with, MT19937's
    reference seed)."""
    if not _layout:
        probe = torch.Generator().manual_seed(5489).get_state()
        words = probe[_MT_OFFSET:_MT_OFFSET + 16].view(torch.int64).tolist()
        _layout.append(probe.numel() == state.numel() and words == [5489, 1301868182])
    if not _layout[0]:
        raise DevRNGError(
            f"torch {torch.__version__} lays out its CPU generator's state in a way devrng "
            "does not know, so a seed of 2**32 or more cannot reach it with all its bits; "
            "seed with a value below 2**32, or install a torch devrng supports.")


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

