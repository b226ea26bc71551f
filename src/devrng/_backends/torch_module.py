"""Shared logic for device types that torch exposes as ``torch.<type>`` modules.

CUDA, XPU, MPS and PrivateUse1 devices all offer ``get_rng_state(index)``,
``set_rng_state(state, index)`` and ``manual_seed_all(seed)`` on a module;
the module is looked up on every call so that it can be replaced (by tests
that simulate a device, or by a plugin that registers it late).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch

__all__ = ["DeviceModuleBackend"]


class DeviceModuleBackend:
    """A backend over ``torch.get_device_module(name)``.

    Examples:
        >>> DeviceModuleBackend("cuda").is_available()
        False
    """

    def __init__(self, name: str) -> None:
        self.name = name

    @property
    def module(self) -> ModuleType:
        mod = getattr(torch, self.name, None)
        if mod is None:
            raise RuntimeError(
                f"torch has no module for device type {self.name!r}; the device's plugin must "
                f"register one (torch._register_device_module({self.name!r}, module))."
            )
        return mod  # type: ignore[no-any-return]

    def is_available(self) -> bool:
        mod = getattr(torch, self.name, None)
        is_available = getattr(mod, "is_available", None)
        return bool(is_available()) if is_available is not None else False

    def is_initialized(self) -> bool:
        check = getattr(self.module, "is_initialized", None)
        # A module without the notion initialises nothing expensive on RNG access.
        return bool(check()) if check is not None else self.is_available()

    def device_count(self) -> int:
        return int(self.module.device_count())

    def current_device(self) -> int:
        current = getattr(self.module, "current_device", None)
        return int(current()) if current is not None else 0

    def get_rng_state(self, index: int) -> torch.Tensor:
        return self.module.get_rng_state(index)  # type: ignore[no-any-return]

    def set_rng_state(self, state: Any, index: int) -> None:
        self.module.set_rng_state(state, index)

    def manual_seed(self, seed: int) -> None:
        mod = self.module
        seed_all = getattr(mod, "manual_seed_all", None) or mod.manual_seed
        seed_all(seed)

    def __repr__(self) -> str:
        return f"<devrng backend {self.name!r} over torch.{self.name}>"
