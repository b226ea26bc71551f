"""A small random draw on a given device, to check that RNG state round-trips.

Used by ``devrng selftest``; the backends themselves never draw.
"""

from __future__ import annotations

import torch

__all__ = ["draw"]


def draw(device_type: str, index: int = 0, n: int = 8) -> torch.Tensor | None:
    """``n`` uniform numbers drawn on ``device_type:index``, copied to the CPU.

    Returns None for a device type devrng does not know how to draw on (a
    third-party backend): callers then compare states instead of draws.
    """
    if device_type == "cpu":
        return torch.rand(n)
    if device_type == "jax":
        import numpy as np
        import torchax

        with torchax.default_env():
            out = torch.rand(n, device="jax")
        return torch.from_numpy(np.asarray(out.jax()).copy())  # type: ignore[attr-defined]
    if device_type in ("cuda", "xpu", "mps", "xla") or device_type == _privateuse1():
        return torch.rand(n, device=f"{device_type}:{index}").cpu()
    return None


def _privateuse1() -> str:
    return str(torch._C._get_privateuse1_backend_name())
