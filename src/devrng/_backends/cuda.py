"""CUDA (and ROCm, which torch exposes as CUDA) through ``torch.cuda``."""

from __future__ import annotations

from devrng._backends.torch_module import DeviceModuleBackend

__all__ = ["backend"]

backend = DeviceModuleBackend("cuda")
