"""Intel XPU through native ``torch.xpu``, with IPEX's oneDNN switch when IPEX is loaded.

devrng needs torch >= 2.8, whose ``torch.xpu`` has the RNG functions in every
build; IPEX adds only its own determinism switch.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

from devrng._backends.torch_module import DeviceModuleBackend

__all__ = ["XPUBackend", "backend"]


class XPUBackend(DeviceModuleBackend):
    """``torch.xpu``, plus IPEX's oneDNN deterministic mode as a determinism switch."""

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
