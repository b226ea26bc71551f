"""CUDA (and ROCm, which torch exposes as CUDA) through ``torch.cuda``."""

from __future__ import annotations

from devrng.backends._device_module import DeviceModuleBackend

__all__ = ["backend"]

backend = DeviceModuleBackend("cuda")
