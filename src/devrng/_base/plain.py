"""States as plain data: what a weights-only file can hold, canonical bytes to hash, and shapes.

Generator states travel through ``torch.save`` / ``torch.load(weights_only=True)``
and are compared across processes by hash, so three facts are kept here once:
which values count as plain data, how a nesting of them becomes canonical
bytes, and how an unsigned 64-bit integer (XLA's seed) travels as a tensor.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from typing import Any

import torch

from devrng._base.errors import DevRNGError, short_repr

__all__ = ["MAX_STATE_BYTES", "check_depth", "check_header", "check_loaded", "check_plain", "describe", "hash_into",
           "signature", "tensor_bytes", "tensor_to_uint64",
           "uint64_to_tensor"]

_PLAIN_LEAVES = (torch.Tensor, bool, int, float, str, type(None))
#: No generator state devrng knows is larger (the CPU's is 5 KB, a TPU's seed 8 bytes):
#: a bigger tensor in a loaded file is a mistake or an attack, not a state.
MAX_STATE_BYTES = 1 << 20
#: Lists and dicts in a state nest a few levels deep; a file nesting them deeper is hostile.
MAX_DEPTH = 32


def _walk(state: Any, what: str) -> Iterator[Any]:
    """Every value nested in ``state`` (lists, tuples, dicts), without recursion; a nesting
    deeper than ``MAX_DEPTH`` is refused (no state devrng writes nests more than a few)."""
    stack = [(state, 0)]
    while stack:
        item, depth = stack.pop()
        yield item
        if isinstance(item, (list, tuple, dict)):
            if depth >= MAX_DEPTH:
                raise DevRNGError(
                    f"{what} nests lists and dicts more than {MAX_DEPTH} deep; devrng's states "
                    "nest a few levels, so this was not written by devrng."
                )
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)


def check_depth(state: Any, what: str) -> None:
    """Raise ``DevRNGError`` if ``state`` nests more than ``MAX_DEPTH`` deep."""
    for _ in _walk(state, what):
        pass


def check_plain(state: Any, what: str) -> None:
    """Raise ``DevRNGError`` unless ``state`` is tensors, numbers, strings, lists and dicts."""
    for item in _walk(state, what):
        if not isinstance(item, (*_PLAIN_LEAVES, list, tuple, dict)):
            raise DevRNGError(
                f"{what} is a {type(item).__name__}, which a weights-only file cannot hold; its "
                "backend must return tensors, numbers, strings, lists or dicts."
            )


def check_loaded(state: Any, what: str) -> None:
    """``check_plain``, and every tensor a compact, plausibly sized state.

    A file can hold a tensor that claims 10**12 elements over a few bytes of
    storage (stride 0): comparing or hashing it later would allocate all of
    them. Such tensors are refused when the file is read.
    """
    check_plain(state, what)
    for item in _walk(state, what):
        if isinstance(item, torch.Tensor):
            size = item.numel() * item.element_size()
            if size > MAX_STATE_BYTES or not item.is_contiguous():
                raise DevRNGError(
                    f"{what} holds a tensor of shape {tuple(item.shape)} "
                    + ("that is not laid out contiguously" if size <= MAX_STATE_BYTES
                       else f"({size} bytes)")
                    + f"; generator states are compact tensors of at most {MAX_STATE_BYTES} "
                    "bytes, so this file was not written by devrng."
                )


def check_header(data: Any, *, tag: str, versions: Collection[int], what: str, made_by: str,
                 source: str | None = None) -> int:
    """The version of a saved state tagged ``tag`` (``{"format": tag, "version": v, ...}``),
    or one ``DevRNGError`` sentence naming what ``data`` is instead: every
    ``load_state_dict`` and ``load`` reads its header here. ``source`` names a file
    ``data`` came from.

    Examples:
        >>> check_header({"format": "devrng.RNGState", "version": 1}, tag="devrng.RNGState",
        ...              versions=(1,), what="RNGState.from_dict", made_by="RNGState.to_dict()")
        1
    """
    if not isinstance(data, Mapping) or data.get("format") != tag:
        got = (f"its format tag is {short_repr(data.get('format'))}, not {tag!r}"
               if isinstance(data, Mapping) else "it is None" if data is None
               else f"it is {short_repr(data)} (of type {type(data).__name__})")
        if source is not None:
            raise DevRNGError(f"{source} is not a valid devrng state for {what}: {got}. Write it "
                              f"with {made_by}.")
        raise DevRNGError(f"{what} takes the dict that {made_by} returns; {got}.")
    version = data.get("version")
    if type(version) is not int or version not in versions:
        known = sorted(versions)
        raise DevRNGError(f"{what}: {source or 'the state'} is version {short_repr(version)}; "
                          f"this devrng reads version{'s' if len(known) > 1 else ''} "
                          f"{', '.join(map(str, known))}.")
    return version


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


def signature(state: Any) -> Any:
    """Type, shape and dtype of a state, to compare a saved state with this process's."""
    if isinstance(state, torch.Tensor):
        return ("tensor", state.dtype, tuple(state.shape))
    if isinstance(state, bool):
        return "bool"
    if isinstance(state, int):
        return "int"
    if isinstance(state, dict):
        return {k: signature(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return [signature(v) for v in state]
    return type(state).__name__


def describe(state: Any) -> str:
    """A state's kind in words: ``"a torch.uint8 tensor of shape (5056,)"``, ``"an int"``."""
    if isinstance(state, torch.Tensor):
        return f"a {state.dtype} tensor of shape {tuple(state.shape)}"
    if isinstance(state, bool):
        return "a bool"
    if isinstance(state, int):
        return "an int"
    if isinstance(state, (dict, list, tuple)):
        return f"a {type(state).__name__} shaped {signature(state)!r}"
    return f"a {type(state).__name__}"


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
