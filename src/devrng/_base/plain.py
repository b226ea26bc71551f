"""States as plain data: canonical bytes to hash, and 64-bit seeds as tensors.

Generator states are compared across processes by hash, so two facts are kept
here once: how a nesting of tensors, numbers and strings becomes canonical
bytes, and how an unsigned 64-bit integer (XLA's seed) travels as a tensor.
Which data a saved state may hold is decided in ``devrng._generators.saved``.
"""

from __future__ import annotations

import struct
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


_REPR_BITS = 10_000  # ints below this many bits have a decimal repr (about 3,000 digits)


def hash_into(h: Any, obj: Any, *, exact: bool = False) -> None:
    """Feed the canonical bytes of a nesting of tensors, arrays, numbers and strings to hash ``h``.

    ``exact=True`` gives every distinct value distinct bytes: dict keys keep their type
    (``0`` and ``"0"`` differ), floats their bits (every NaN, -0.0), tuples differ from
    lists. Digests of saved states use it; fingerprints use the default, which stays as
    it was so that they compare across devrng versions. Raises ``DevRNGError`` for
    anything that is not plain data (its ``repr`` may hold an address).

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
        if exact:
            keys = sorted((_exact_bytes(k), k) for k in obj)  # (bytes differ for distinct keys)
            h.update(f"{len(keys)}:".encode())
            for raw, k in keys:
                h.update(raw)
                hash_into(h, obj[k], exact=True)
        else:
            for k in sorted(obj, key=str):
                hash_into(h, str(k))
                hash_into(h, obj[k])
        h.update(b"}")
    elif isinstance(obj, (list, tuple)):
        h.update(f"{'(' if exact and isinstance(obj, tuple) else '['}{len(obj)}".encode())
        for item in obj:
            hash_into(h, item, exact=exact)
    elif type(obj).__module__ == "numpy" and hasattr(obj, "tobytes"):  # arrays and scalars
        h.update(f"A{obj.dtype}{obj.shape}".encode())
        h.update(obj.tobytes())
    elif exact and (obj is None or isinstance(obj, (bool, int, float, str, bytes))):
        h.update(_exact_bytes(obj))
    elif type(obj) is int and obj.bit_length() > _REPR_BITS:
        h.update(f"int:{obj:#x};".encode())  # repr refuses ints of over 4,300 digits
    elif obj is None or isinstance(obj, (bool, int, float, str, bytes)):
        h.update(f"{type(obj).__name__}:{obj!r};".encode())
    else:
        # repr() of an arbitrary object can hold a memory address: no stable bytes.
        raise DevRNGError(
            f"A {type(obj).__name__} state cannot be fingerprinted: it is not plain data "
            "(tensors, numbers, strings, lists, dicts), so equal states could hash apart. "
            "Its backend must return plain data."
        )


def _exact_bytes(obj: Any) -> bytes:
    """A scalar's bytes for ``hash_into(exact=True)``: its type, then its value, length-prefixed."""
    if isinstance(obj, float):
        return b"f" + struct.pack("<d", obj)
    if isinstance(obj, str):
        raw = obj.encode("utf-8", errors="surrogatepass")
        return b"s%d:" % len(raw) + raw
    if isinstance(obj, bytes):
        return b"b%d:" % len(obj) + obj
    if obj is None or isinstance(obj, bool):
        return f"{obj};".encode()  # None; True; False;
    if isinstance(obj, int):
        return b"i" + obj.to_bytes(obj.bit_length() // 8 + 1, "little", signed=True) + b";"
    raise DevRNGError(f"A dict key of type {type(obj).__name__} has no canonical bytes; keys of "
                      "plain data are strings, ints, floats, bools or None.")


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
