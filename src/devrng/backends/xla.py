"""XLA devices through torch_xla: one unsigned 64-bit seed per device.

XLA derives every random op's seed from the device's running seed, so that
integer is the whole state (``xm.get_rng_state`` / ``xm.set_rng_state``).
``torch.manual_seed`` does not reach it.
"""

from __future__ import annotations

import torch_xla
import torch_xla.core.xla_model as xm

__all__ = ["XLABackend", "backend"]


class XLABackend:
    """torch_xla's per-device RNG seeds.

    Example:
        >>> devrng.get_backend("xla").get_rng_state(0)
        101
    """

    name = "xla"

    def is_available(self) -> bool:
        return True  # importing torch_xla succeeded; PJRT picks a device (CPU at worst)

    def is_initialized(self) -> bool:
        return bool(torch_xla._XLAC._xla_runtime_is_initialized())

    def device_count(self) -> int:
        return int(torch_xla.device_count())

    def current_device(self) -> int:
        name = str(torch_xla._XLAC._xla_get_default_device())
        return int(name.rpartition(":")[2] or 0)

    def get_rng_state(self, index: int) -> int:
        return int(xm.get_rng_state(f"xla:{index}"))

    def set_rng_state(self, state: int, index: int) -> None:
        xm.set_rng_state(int(state), f"xla:{index}")

    def manual_seed(self, seed: int) -> None:
        for index in range(self.device_count()):
            xm.set_rng_state(seed, f"xla:{index}")


backend = XLABackend()
