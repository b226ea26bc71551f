"""``patch_torch`` / ``unpatch_torch``: make torch's own RNG sites use devrng."""

from __future__ import annotations

from typing import Any

import torch
import torch.random

from devrng._backends.device_modules import register_all, unregister_all
from devrng._base.locks import ForkSafeLock
from devrng._base.sigint import deliver, guard
from devrng._generators.fork import fork_rng

__all__ = ["patch_torch", "unpatch_torch"]

_lock = ForkSafeLock()
_saved: dict[str, Any] = {}


@guard
def patch_torch() -> None:
    """Point ``torch.random.fork_rng`` and ``torch.fork_rng`` at ``devrng.fork_rng``.

    Third-party code that calls torch's fork_rng then forks every device type
    it hands over. Also registers a ``torch.<type>`` device module for every
    devrng backend torch has none for (XLA above all), so that
    ``torch.utils.checkpoint`` and torch's other RNG sites save and restore
    that device's state (the guide's "Checkpointing on XLA" page says how).
    Idempotent; ``unpatch_torch`` undoes it.

    Examples:
        >>> devrng.patch_torch()
        >>> torch.random.fork_rng is devrng.fork_rng
        True
    """
    try:
        with _lock:
            if "fork_rng" in _saved:
                # Device modules are idempotent too; registering again picks up a backend
                # imported since the first call (torchax renames PrivateUse1 on import).
                register_all()
                return
            saved = {"fork_rng": torch.random.fork_rng,
                     "torch.fork_rng": getattr(torch, "fork_rng", None)}
            try:
                torch.random.fork_rng = fork_rng  # type: ignore[assignment]
                torch.fork_rng = fork_rng  # type: ignore[attr-defined]
                register_all()
                _saved.update(saved)  # recorded once applied: unpatch undoes what is recorded
            except BaseException:
                _put_back(saved)
                raise
    finally:
        deliver()


@guard
def unpatch_torch() -> None:
    """Undo ``patch_torch``: torch's own ``fork_rng`` and device modules come back. Idempotent.

    Examples:
        >>> devrng.unpatch_torch()
    """
    try:
        with _lock:
            if "fork_rng" not in _saved:
                return
            _put_back(_saved)
            _saved.clear()  # after everything is back: an interrupted unpatch can run again
    finally:
        deliver()


def _put_back(saved: dict[str, Any]) -> None:
    """torch's own fork_rng and device modules, as ``saved`` recorded them (idempotent)."""
    torch.random.fork_rng = saved["fork_rng"]
    original = saved["torch.fork_rng"]
    if original is None:
        if hasattr(torch, "fork_rng"):
            del torch.fork_rng  # type: ignore[attr-defined]
    else:
        torch.fork_rng = original  # type: ignore[attr-defined]
    unregister_all()
