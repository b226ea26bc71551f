"""Intel XPU: native ``torch.xpu`` (torch >= 2.4) first, IPEX's module on older torch."""

from __future__ import annotations

from types import ModuleType

import torch

from devrng.backends._device_module import DeviceModuleBackend

__all__ = ["XPUBackend", "backend"]


def _has_rng(mod: object) -> bool:
    return all(hasattr(mod, f) for f in ("get_rng_state", "set_rng_state", "device_count"))


class XPUBackend(DeviceModuleBackend):
    """``torch.xpu`` when torch has it; otherwise ``intel_extension_for_pytorch.xpu``."""

    @property
    def module(self) -> ModuleType:
        native = getattr(torch, "xpu", None)
        if native is not None and _has_rng(native):
            return native  # type: ignore[no-any-return]
        try:
            import intel_extension_for_pytorch as ipex
        except ImportError as err:
            raise ImportError(
                f"This torch {torch.__version__} has no torch.xpu RNG functions and IPEX is not "
                "installed; upgrade to torch >= 2.4 or run: pip install 'devrng[ipex]'"
            ) from err
        return ipex.xpu  # type: ignore[no-any-return]

    def is_available(self) -> bool:
        native = getattr(torch, "xpu", None)
        if native is not None and _has_rng(native):
            return bool(native.is_available())
        try:
            return bool(self.module.is_available())
        except ImportError:
            return False


backend = XPUBackend("xpu")
