"""Intel XPU: native ``torch.xpu`` (torch >= 2.4) first, IPEX's module on older torch."""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import Any

import torch

from devrng._backends.torch_module import DeviceModuleBackend

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

    # -- determinism (optional members, used by devrng.deterministic) ----------
    # Native torch.xpu follows torch.backends.mkldnn.deterministic, which
    # devrng.deterministic sets itself; IPEX keeps a oneDNN switch of its own.
    deterministic_note = (
        "IPEX's oneDNN deterministic mode (intel_extension_for_pytorch.xpu.deterministics), "
        "when IPEX is loaded; native torch.xpu follows torch.backends.mkldnn.deterministic"
    )
    _ipex_deterministic = False  # IPEX has no getter: remember what was last set

    def get_deterministic(self) -> bool | None:
        return None if _ipex_deterministics() is None else self._ipex_deterministic

    def set_deterministic(self, flag: bool) -> bool | None:
        switch = _ipex_deterministics()
        if switch is None:
            return None
        previous = self._ipex_deterministic
        if flag:
            switch.enable_onednn_deterministic()
        else:
            switch.disable_onednn_deterministic()
        self._ipex_deterministic = bool(flag)
        return previous


def _ipex_deterministics() -> Any:
    """IPEX's determinism switches, only if the program has imported IPEX itself."""
    if "intel_extension_for_pytorch" not in sys.modules:
        return None
    try:
        mod = importlib.import_module("intel_extension_for_pytorch.xpu.deterministics")
    except Exception:  # a CPU-only IPEX build has no xpu package
        return None
    ok = all(callable(getattr(mod, f, None))
             for f in ("enable_onednn_deterministic", "disable_onednn_deterministic"))
    return mod if ok else None


backend = XPUBackend("xpu")
