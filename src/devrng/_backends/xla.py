"""XLA devices through torch_xla: one unsigned 64-bit seed per device.

XLA derives every random op's seed from the device's running seed, so that
integer is the whole state (``xm.get_rng_state`` / ``xm.set_rng_state``).
``torch.manual_seed`` does not reach it.
"""

from __future__ import annotations

import os
import warnings

import torch
import torch_xla

from devrng._base.plain import tensor_to_uint64, uint64_to_tensor

__all__ = ["XLABackend", "backend", "get_seed", "set_seed"]

_XLAC = torch_xla._XLAC
#: The C++ calls behind xm.get_rng_state / xm.set_rng_state, by device name ("xla:0"):
#: the one place devrng reads and writes XLA seeds (the Python wrappers cost several
#: times the call itself).
get_seed = _XLAC._xla_get_rng_seed
set_seed = _XLAC._xla_set_rng_seed


class XLABackend:
    """torch_xla's per-device RNG seeds.

    Examples:
        >>> import torch_xla
        >>> isinstance(devrng.get_backend("xla").get_rng_state(0), int)
        True
    """

    name = "xla"

    def __init__(self) -> None:
        self._count: int | None = None

    def is_available(self) -> bool:
        return True  # importing torch_xla succeeded; PJRT picks a device (CPU at worst)

    def is_initialized(self) -> bool:
        return bool(_XLAC._xla_runtime_is_initialized())

    def device_count(self) -> int:
        # Fixed once the runtime has started; asking it builds a list of device names.
        if self._count is None:
            count = int(torch_xla.device_count())
            if not self.is_initialized():
                return count
            self._count = count
        return self._count

    def current_device(self) -> int:
        name = str(_XLAC._xla_get_default_device())
        return int(name.rpartition(":")[2] or 0)

    def get_rng_state(self, index: int) -> int:
        return int(get_seed(_names.get(index) or _name(index)))

    def set_rng_state(self, state: int, index: int) -> None:
        set_seed(int(state), _names.get(index) or _name(index))

    def manual_seed(self, seed: int) -> None:
        for index in range(self.device_count()):
            set_seed(seed, _name(index))

    def manual_seed_device(self, seed: int, index: int) -> None:
        # An XLA device's state is its seed: seeding one device is setting its state.
        set_seed(seed, _name(index))

    # -- state encoding (optional members): the unsigned 64-bit seed overflows an
    # int64 tensor, so torch's RNG sites carry it as eight little-endian bytes.
    def state_to_tensor(self, state: int) -> torch.Tensor:
        return uint64_to_tensor(state)

    def tensor_to_state(self, tensor: torch.Tensor) -> int:
        return tensor_to_uint64(tensor, "torch.xla.set_rng_state")

    # -- determinism (optional members, used by devrng.deterministic) ----------
    # XLA on CPU and TPU has no nondeterministic kernels to switch off; XLA:GPU
    # has, behind a flag read from XLA_FLAGS when the runtime starts.
    deterministic_note = (
        "XLA_FLAGS --xla_gpu_deterministic_ops=true: deterministic XLA:GPU kernels; read when "
        "the XLA runtime starts (XLA on CPU and TPU needs no switch)"
    )

    def get_deterministic(self) -> bool:
        return _DETERMINISTIC_FLAG in os.environ.get("XLA_FLAGS", "").split()

    def set_deterministic(self, flag: bool) -> bool:
        previous = self.get_deterministic()
        if bool(flag) == previous:
            return previous
        words = os.environ.get("XLA_FLAGS", "").split()
        if flag:
            words.append(_DETERMINISTIC_FLAG)
        else:
            words = [w for w in words if w != _DETERMINISTIC_FLAG]
        if words:
            os.environ["XLA_FLAGS"] = " ".join(words)
        else:
            os.environ.pop("XLA_FLAGS", None)
        if self.is_initialized() and _runtime_device_type() in ("CUDA", "GPU"):
            warnings.warn(
                f"The XLA runtime is already running, so changing {_DETERMINISTIC_FLAG} in "
                "XLA_FLAGS has no effect in this process; call devrng.deterministic() before the "
                f"first XLA device use, or start the program with XLA_FLAGS={_DETERMINISTIC_FLAG}.",
                UserWarning,
                stacklevel=3,
            )
        return previous


_DETERMINISTIC_FLAG = "--xla_gpu_deterministic_ops=true"
_names: dict[int, str] = {}


def _name(index: int) -> str:
    name = _names.get(index)
    if name is None:
        name = _names[index] = f"xla:{index}"
    return name


def _runtime_device_type() -> str:
    try:
        import torch_xla.runtime as xr

        return str(xr.device_type() or "")
    except Exception:
        return ""


backend = XLABackend()
