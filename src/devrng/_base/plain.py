"""States as plain data: canonical bytes to hash, and 64-bit seeds as tensors.

Generator states are compared across processes by hash, so two facts are kept
here once: how a nesting of tensors, numbers and strings becomes canonical
bytes, and how an unsigned 64-bit integer (XLA's seed) travels as a tensor.
Which data a saved state may hold is decided in ``devrng._generators.saved``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from devrng._base.errors import DevRNGError

__all__ = ["hash_into", "tensor_bytes", "tensor_to_uint64", "uint64_to_tensor"]

def tensor_bytes(t: torch.Tensor) -> bytes:
    """The raw bytes of a tensor's elements (copied to the CPU, made contiguous)."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if not t.is_contiguous():
        t = t.contiguous()
    if t.dtype is not torch.uint8:
        t = t.reshape(-1).view(torch.uint8) if t.numel() else t.new_empty(0, dtype=torch.uint8)
    try:
        return bytes(t.numpy().tobytes())
    except RuntimeError:  # torch without NumPy
        return bytes(t.reshape(-1).tolist())


def hash_into(h: Any, obj: Any) -> None:
    """Feed the canonical bytes of a nesting of tensors, arrays, numbers and strings to hash ``h``.

    Raises ``DevRNGError`` for anything else (its ``repr`` may hold an address).

    Examples:
        >>> import hashlib
        >>> h = hashlib.sha256(); hash_into(h, {"a": [1, torch.zeros(2)]}); len(h.hexdigest())
        64
    """
    if isinstance(obj, torch.Tensor):
        h.update(f"T{obj.dtype}{tuple(obj.shape)}".encode())
        h.update(tensor_bytes(obj))
    elif isinstance(obj, Mapping):
        h.update(b"{")
        for k in sorted(obj, key=str):
            hash_into(h, str(k))
            hash_into(h, obj[k])
        h.update(b"}")
    elif isinstance(obj, (list, tuple)):
        h.update(f"[{len(obj)}".encode())
        for item in obj:
            hash_into(h, item)
    elif type(obj).__module__ == "numpy" and hasattr(obj, "tobytes"):  # arrays and scalars
        h.update(f"A{obj.dtype}{obj.shape}".encode())
        h.update(obj.tobytes())
    elif obj is None or isinstance(obj, (bool, int, float, str, bytes)):
        h.update(f"{type(obj).__name__}:{obj!r};".encode())
    else:
        # repr() of an arbitrary object can hold a memory address: no stable bytes.
        raise DevRNGError(
            f"A {type(obj).__name__} state cannot be fingerprinted: it is not plain data "
            "(tensors, numbers, strings, lists, dicts), so equal states could hash apart. "
            "Its backend must return plain data."
        )


def uint64_to_tensor(value: int) -> torch.Tensor:
    """An unsigned 64-bit int as 8 little-endian uint8 bytes (it overflows an int64 tensor)."""
    return torch.frombuffer(bytearray(int(value).to_bytes(8, "little")), dtype=torch.uint8)


def tensor_to_uint64(tensor: Any, where: str) -> int:
    """Inverse of ``uint64_to_tensor``; also takes an int in [0, 2**64)."""
    if isinstance(tensor, int) and not isinstance(tensor, bool):
        if not 0 <= tensor < 2**64:
            raise ValueError(
                f"{where} got the seed {tensor}, which is out of range; an int state must be in "
                "[0, 2**64)."
            )
        return tensor
    if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.uint8 or tensor.numel() != 8:
        got = (f"a {tensor.dtype} tensor of shape {tuple(tensor.shape)}"
               if isinstance(tensor, torch.Tensor) else f"{tensor!r} (a {type(tensor).__name__})")
        raise TypeError(
            f"{where} got {got}; it accepts the 8-element uint8 tensor that get_rng_state() "
            "returns (the 64-bit seed as little-endian bytes) or an int in [0, 2**64)."
        )
    return int.from_bytes(tensor_bytes(tensor), "little")
