"""States as plain data: canonical bytes to hash, and 64-bit seeds as tensors.

Generator states are compared across processes by hash, so two facts are kept
here once: how a nesting of tensors, numbers and strings becomes canonical
bytes, and how an unsigned 64-bit integer (XLA's seed) travels as a tensor.
Which data a saved state may hold is decided in ``devrng._generators.saved``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from typing import Any

import torch

from devrng._base.errors import DevRNGError

__all__ = ["exact_bytes", "hash_into", "tensor_bytes", "tensor_to_uint64", "uint64_to_tensor"]

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

    ``exact=True`` feeds ``exact_bytes(obj)``, in which distinct values always differ;
    the default form stays as it was, so that fingerprints compare across devrng
    versions. Raises ``DevRNGError`` for anything that is not plain data (its ``repr``
    may hold an address).

    Examples:
        >>> import hashlib
        >>> h = hashlib.sha256(); hash_into(h, {"a": [1, torch.zeros(2)]}); len(h.hexdigest())
        64
    """
    if exact:
        h.update(exact_bytes(obj))
    elif isinstance(obj, torch.Tensor):
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
    elif type(obj) is int and obj.bit_length() > _REPR_BITS:
        h.update(f"int:{obj:#x};".encode())  # repr refuses ints of over 4,300 digits
    elif obj is None or isinstance(obj, (bool, int, float, str, bytes)):
        h.update(f"{type(obj).__name__}:{obj!r};".encode())
    else:
        raise _not_plain(obj)


def exact_bytes(obj: Any, *, stand_in: Callable[[Mapping[Any, Any]], bytes | None] | None = None,
                max_depth: int = 64, leave_out: Any = None) -> bytes:
    """Canonical bytes of plain data in which every distinct value differs: dict keys keep
    their type (``0`` and ``"0"`` differ), floats their bits (every NaN, -0.0), tuples
    differ from lists, every piece is typed and length-prefixed. Saved states' digests
    are taken over these bytes. ``stand_in(d)``, for each dict nested in ``obj``, may
    give bytes that stand for it (a nested state's own digest) instead of its content;
    ``leave_out`` is a key of ``obj`` itself to leave out (the digest being checked).

    Safe on any loaded state: raises ``ValueError`` (a phrase: "holds a ...") for
    anything that is not plain data (tensors, numbers, strings, bytes, lists, tuples,
    dicts), for nesting deeper than ``max_depth`` and for a tensor whose elements do not
    lie in its own storage (stride 0 over a few bytes: hashing it would allocate all of
    them), before any cost beyond the bytes the state holds.

    Examples:
        >>> exact_bytes({"a": [1, 2.0]}) != exact_bytes({"a": (1, 2.0)}) != exact_bytes({"a": [1, 2]})
        True
    """
    pieces: list[bytes] = []
    put = pieces.append

    def into(obj: Any, depth: int) -> None:
        kind = type(obj)
        scalar = _SCALARS.get(kind)
        if scalar is not None:  # the exact built-in types first: most of a state is these
            put(scalar(obj))
            return
        if depth > max_depth:
            raise ValueError(f"nests lists and dicts more than {max_depth} deep")
        if kind is dict or isinstance(obj, Mapping):
            instead = None if stand_in is None or not depth else stand_in(obj)
            if instead is not None:
                put(instead)
                return
            keys = _sorted_keys(obj)
            if not depth and leave_out in obj:
                keys = [pair for pair in keys if pair[1] != leave_out]
            put(b"{%d:" % len(keys))
            for raw, k in keys:
                put(raw)
                value = obj[k]
                scalar = _SCALARS.get(type(value))  # (a scalar without a call of into)
                put(scalar(value)) if scalar is not None else into(value, depth + 1)
            put(b"}")
        elif kind is list or kind is tuple or isinstance(obj, (list, tuple)):
            put((b"(%d" if isinstance(obj, tuple) else b"[%d") % len(obj))
            for item in obj:
                scalar = _SCALARS.get(type(item))
                put(scalar(item)) if scalar is not None else into(item, depth + 1)
        elif isinstance(obj, torch.Tensor):
            raw = _tensor_bytes_checked(obj)
            put(f"T{obj.dtype}{tuple(obj.shape)}:".encode())
            put(raw)
        else:
            put(_scalar_bytes(obj))

    into(obj, 0)
    return b"".join(pieces)


def _sorted_keys(obj: Mapping[Any, Any]) -> list[tuple[bytes, Any]]:
    """A dict's keys with their exact bytes, in the order of those bytes (distinct keys
    have distinct bytes: the sort never compares the keys themselves). A state's dicts
    have the same keys at every save: their order is kept, for a few thousand key sets."""
    names = tuple(obj)
    order = _KEY_ORDERS.get(names) if len(names) <= 64 else None
    if order is None:
        order = sorted([(_SCALARS.get(type(k), _scalar_bytes)(k), k) for k in names])
        if len(names) <= 64 and len(_KEY_ORDERS) < 4096 and all(type(k) is str for k in names):
            _KEY_ORDERS[names] = order
    return order


_KEY_ORDERS: dict[tuple[Any, ...], list[tuple[bytes, Any]]] = {}


def _float_bytes(obj: float) -> bytes:
    return b"f" + struct.pack("<d", obj)


def _str_bytes(obj: str) -> bytes:
    known = _KNOWN_STRINGS.get(obj)
    if known is not None:
        return known
    raw = obj.encode("utf-8", errors="surrogatepass")
    out = b"s%d:" % len(raw) + raw
    if len(obj) <= 40 and len(_KNOWN_STRINGS) < 4096:  # the keys every state repeats
        _KNOWN_STRINGS[obj] = out
    return out


_KNOWN_STRINGS: dict[str, bytes] = {}


def _int_bytes(obj: int) -> bytes:
    small = _SMALL_INTS.get(obj)
    if small is not None:
        return small
    raw = obj.to_bytes(obj.bit_length() // 8 + 1, "little", signed=True)
    return b"i%d:" % len(raw) + raw


_SMALL_INTS: dict[int, bytes] = {}
_SMALL_INTS.update((i, _int_bytes(i)) for i in range(-1, 1025))


_SCALARS: dict[type, Any] = {
    str: _str_bytes, int: _int_bytes, float: _float_bytes, bool: lambda b: b"T" if b else b"F",
    type(None): lambda _: b"N", bytes: lambda b: b"b%d:" % len(b) + b,
}


def _scalar_bytes(obj: Any) -> bytes:
    """A scalar's exact bytes: its type, then its value, length-prefixed where it varies
    (subclasses of the built-in types as their base)."""
    for kind in (bool, str, int, float, bytes, type(None)):  # bool before int: it is one
        if isinstance(obj, kind):
            return _SCALARS[kind](obj)  # type: ignore[no-any-return]
    raise ValueError(f"holds a {type(obj).__name__}, which is not plain data")


def _tensor_bytes_checked(t: torch.Tensor) -> bytes:
    """``tensor_bytes`` of a dense tensor whose elements lie in its own storage, without
    its copies for the CPU tensors a loaded state holds; ``ValueError`` for others."""
    if t.device.type == "cpu":
        size = t.numel() * t.element_size()
        try:
            stored = t.untyped_storage().nbytes() if t.layout is torch.strided else -1
        except Exception:  # no storage to measure (a tensor subclass)
            stored = -1
        if size > stored:
            raise ValueError(f"holds a tensor of shape {tuple(t.shape)} ({size} bytes) that is "
                             "not a dense tensor whose elements lie in its own storage (it is "
                             "expanded over fewer bytes)")
        if t.is_contiguous() and not t.requires_grad:
            try:
                return t.numpy().tobytes()  # type: ignore[no-any-return]
            except (TypeError, RuntimeError):  # a dtype NumPy lacks (bfloat16, ...)
                pass
    return tensor_bytes(t)


def _not_plain(obj: Any) -> DevRNGError:
    # repr() of an arbitrary object can hold a memory address: no stable bytes.
    return DevRNGError(
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
