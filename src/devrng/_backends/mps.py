"""Apple MPS through ``torch.mps``: one device, whose RNG functions take no index."""

from __future__ import annotations

from typing import Any

import torch

from devrng._backends.torch_module import DeviceModuleBackend

__all__ = ["MPSBackend", "backend"]


class MPSBackend(DeviceModuleBackend):
    """``torch.mps`` has a single device and no per-index RNG calls."""

    def is_available(self) -> bool:
        return bool(torch.backends.mps.is_available())

    def device_count(self) -> int:
        count = getattr(self.module, "device_count", None)
        return int(count()) if count is not None else int(self.is_available())

    def get_rng_state(self, index: int = 0) -> torch.Tensor:
        return self.module.get_rng_state()  # type: ignore[no-any-return]

    def set_rng_state(self, state: Any, index: int = 0) -> None:
        self.module.set_rng_state(state)

    def manual_seed(self, seed: int) -> None:
        self.module.manual_seed(seed)


backend = MPSBackend("mps")
