"""Any PrivateUse1 device (renamed with ``torch.utils.rename_privateuse1_backend``).

Its plugin registers a device module with ``torch._register_device_module``;
when that module has the usual RNG functions, devrng can fork and seed it.
"""

from __future__ import annotations

from devrng.backends._device_module import DeviceModuleBackend

__all__ = ["DeviceModuleBackend"]
