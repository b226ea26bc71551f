"""Exact digests of batches and short fingerprints of generators, for the flight record.

A batch digest must be the same number whichever device computes it and in whatever
order the device adds, so that a batch digested on the CPU where a loader delivered it
equals the same bytes digested on an accelerator: each tensor is read as the integers
that hold its bits (float32 as int32, bfloat16 as int16, ...), and the digest is the
wrapping 64-bit sum of ``value * (2 * position + 1)`` over its elements -- integer
addition modulo 2**64 gives one answer in every order, and the odd weights make it
see samples that trade places. A floating-point reduction would not: its rounding
depends on the order a device chooses.

Tensors of more than ``SAMPLED`` elements are digested on ``SAMPLED`` evenly spaced
elements (every k-th of the flattened tensor, k odd), so a digest costs a few
microseconds whatever the batch size; augmentation changes most of a sample's elements
and is seen. A digest of a tensor on an accelerator stays there (a 0-d tensor) until the
record is written: no host synchronisation per step.
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import random
import zlib
from collections.abc import Callable, Mapping
from typing import Any

import torch

from devrng._backends import host

__all__ = ["SAMPLED", "Pending", "batch_digest", "generator_fingerprint", "indices_digest",
           "numpy_fingerprint", "python_fingerprint", "resolve", "state_fingerprint"]

#: Elements digested per tensor at most.
SAMPLED = 4096
_MASK64 = (1 << 64) - 1
_INTEGER_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class Pending:
    """A digest whose parts are partly 0-d int64 tensors on a device: resolved when written."""

    __slots__ = ("parts",)

    def __init__(self, parts: list[Any]) -> None:
        self.parts = parts


def resolve(value: Any) -> Any:
    """``value`` with every ``Pending`` digest in it turned into its 16 hexadecimal digits.

    The device parts of all of them are copied to the host together (one transfer per
    device), not one by one.
    """
    pending: list[torch.Tensor] = []
    _collect(value, pending)
    host_values: dict[int, int] = {}
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for t in pending:
        by_device.setdefault(t.device, []).append(t)
    for tensors in by_device.values():
        for t, v in zip(tensors, torch.stack(tensors).cpu().tolist(), strict=True):
            host_values[id(t)] = int(v) & _MASK64
    return _substitute(value, host_values)


def _collect(value: Any, out: list[torch.Tensor]) -> None:
    if isinstance(value, Pending):
        out.extend(p for p in value.parts if isinstance(p, torch.Tensor))
    elif isinstance(value, (list, tuple)):
        for v in value:
            _collect(v, out)
    elif isinstance(value, dict):
        for v in value.values():
            _collect(v, out)


def _substitute(value: Any, host_values: Mapping[int, int]) -> Any:
    if isinstance(value, Pending):
        return _finish([host_values[id(p)] if isinstance(p, torch.Tensor) else p
                        for p in value.parts])
    if isinstance(value, list):
        return [_substitute(v, host_values) for v in value]
    if isinstance(value, tuple):
        return tuple(_substitute(v, host_values) for v in value)
    if isinstance(value, dict):
        return {k: _substitute(v, host_values) for k, v in value.items()}
    return value


def _finish(parts: list[Any]) -> str:
    h = hashlib.blake2b(digest_size=8)
    for part in parts:
        h.update(part if isinstance(part, bytes) else part.to_bytes(8, "little"))
    return h.hexdigest()


def batch_digest(batch: Any) -> str | Pending:
    """The digest of everything in ``batch``: tensors (any device, any dtype), NumPy
    arrays, numbers and strings, nested in lists, tuples and dicts (a dict's keys too).

    Returns:
        16 hexadecimal digits, or a ``Pending`` digest while device values are not read.

    Examples:
        >>> from devrng._training.digest import batch_digest
        >>> x = torch.arange(6.0).reshape(2, 3)
        >>> batch_digest((x, [1, 2])) == batch_digest((x.clone(), [1, 2]))
        True
        >>> batch_digest((x.flip(0), [1, 2])) == batch_digest((x, [1, 2]))
        False
    """
    parts: list[Any] = []
    _walk(batch, parts, 0)
    if any(isinstance(p, torch.Tensor) for p in parts):
        return Pending(parts)
    return _finish(parts)


def _walk(obj: Any, parts: list[Any], depth: int) -> None:
    # The common kinds first, by exact type (an abstract Mapping check costs a microsecond).
    kind = type(obj)
    if isinstance(obj, torch.Tensor):
        parts.append(_header(obj))
        parts.append(_tensor_sum(obj))
    elif depth > 32:  # a batch is not nested this deep: say so rather than recurse
        parts.append(b"<deep>")
    elif kind is tuple or kind is list or isinstance(obj, (list, tuple)):
        parts.append(b"[%d" % len(obj))
        for value in obj:
            _walk(value, parts, depth + 1)
    elif kind is dict or isinstance(obj, Mapping):
        mapping: Mapping[Any, Any] = obj
        parts.append(b"{%d" % len(mapping))
        for key, value in mapping.items():
            _walk(key, parts, depth + 1)
            _walk(value, parts, depth + 1)
    elif kind is int or kind is bool or isinstance(obj, int):
        parts.append(b"i" + str(int(obj)).encode())
    elif isinstance(obj, float):
        parts.append(b"f" + obj.hex().encode())
    elif isinstance(obj, str):
        parts.append(b"s" + obj.encode("utf-8", "surrogatepass"))
    elif isinstance(obj, bytes):
        parts.append(b"b" + obj)
    elif obj is None:
        parts.append(b"N")
    else:
        np = host.numpy_or_none()
        if np is not None and isinstance(obj, np.ndarray) and obj.dtype.kind in "biufc":
            _walk(torch.from_numpy(np.ascontiguousarray(obj)), parts, depth)
        else:  # an object of the user's: its type is what can be compared
            parts.append(b"o" + type(obj).__qualname__.encode())


_headers: dict[tuple[torch.dtype, torch.Size], bytes] = {}


def _header(t: torch.Tensor) -> bytes:
    key = (t.dtype, t.shape)
    header = _headers.get(key)
    if header is None:
        if len(_headers) > 256:
            _headers.clear()
        header = _headers[key] = f"T{t.dtype}{tuple(t.shape)}".encode()
    return header


# Weights 2 * position + 1 for the sampled positions, by (device, elements, step).
_weights: dict[tuple[Any, int, int], Any] = {}


def _tensor_sum(t: torch.Tensor) -> Any:
    """The wrapping sum of ``value * (2 * position + 1)`` over ``t``'s (sampled) elements:
    an int on the CPU, a 0-d int64 tensor on a device."""
    t = t.detach()
    if t.is_complex():
        t = torch.view_as_real(t)
    size = t.element_size()
    if t.layout is not torch.strided or t.is_quantized or size not in _INTEGER_VIEW:
        return str(t.layout).encode()  # sparse or quantized: described, not digested
    n = t.numel()
    if n == 0:
        return 0
    bits = t.view(_INTEGER_VIEW[size]).reshape(-1)
    step = 1 if n <= SAMPLED else math.ceil(n / SAMPLED) | 1
    if t.is_cpu:
        np = host.numpy_or_none()
        if np is not None:
            weights = _weights.get(("cpu", n, step))
            if weights is None:
                weights = _cached(("cpu", n, step), np.arange(0, n, step, dtype=np.int64) * 2 + 1)
            values = bits.numpy()
            return int((values[::step].astype(np.int64) * weights).sum()) & _MASK64
    if step > 1:
        bits = bits[::step]
    key = (t.device, n, step)
    weights = _weights.get(key)
    if weights is None:
        weights = _cached(key, torch.arange(0, n, step, dtype=torch.int64, device=t.device) * 2 + 1)
    total = (bits.to(torch.int64) * weights).sum()
    return int(total) & _MASK64 if t.is_cpu else total


def _cached(key: tuple[Any, int, int], weights: Any) -> Any:
    if len(_weights) > 64:  # shapes vary (the last batch of an epoch): stay small
        _weights.clear()
    _weights[key] = weights
    return weights


def indices_digest(indices: Any) -> str:
    """A batch's sample indices (what a batch sampler yields: ints, or anything else) as
    16 hexadecimal digits."""
    try:
        data = b"q" + b"".join(int(i).to_bytes(8, "little", signed=True) for i in indices)
    except (TypeError, ValueError, OverflowError):
        data = b"r" + repr(indices).encode()
    return hashlib.blake2b(data, digest_size=8).hexdigest()


# -- fingerprints of generators: 8 hexadecimal digits each -------------------------------

def _crc(data: Any) -> str:
    return f"{zlib.crc32(data) & 0xFFFFFFFF:08x}"


def generator_fingerprint(generator: torch.Generator) -> str:
    """A torch CPU generator's state."""
    return _crc(generator.get_state().numpy())


def state_fingerprint(state: Any) -> str | Pending:
    """Any generator state (a tensor, an int, a JAX key, nested plain data)."""
    if isinstance(state, torch.Tensor) and state.device.type == "cpu" \
            and state.dtype == torch.uint8 and state.is_contiguous():
        return _crc(state.numpy())
    return batch_digest(_plain_state(state))


def _plain_state(state: Any) -> Any:
    if hasattr(state, "__jax_array__") or type(state).__module__.startswith("jax"):
        np = host.numpy_or_none()
        jax_random = __import__("jax.random", fromlist=["key_data"])
        data = jax_random.key_data(state) if "key" in str(getattr(state, "dtype", "")) \
            else state
        return np.asarray(data) if np is not None else repr(data)
    return state


def python_fingerprint() -> str:
    """Python's ``random`` generator (the module's own).

    ``random.getstate()`` builds a tuple of 625 ints (about 6 us); CPython keeps the state
    in the generator object itself (an int and 624 words after the object's header), which
    is read there in about 1 us -- once checked against ``getstate()``, for this interpreter.
    """
    if not _python_reader:
        _python_reader.append(_python_fast() or _python_slow)
    return _python_reader[0]()


_python_reader: list[Callable[[], str]] = []


def _python_slow() -> str:
    _, words, gauss = random._inst.getstate()  # type: ignore[attr-defined]
    # A tuple of ints hashes the same in every process (only str and bytes hashes are
    # salted); hash(None) is not stable before Python 3.12, so the Gaussian cache apart.
    return f"{(hash(words) ^ hash(gauss or 0.0)) & 0xFFFFFFFF:08x}"


def _python_fast() -> Callable[[], str] | None:
    checked = random._inst  # type: ignore[attr-defined]
    header = object.__basicsize__  # what precedes the generator's own fields
    try:
        raw = ctypes.string_at(id(checked) + header, 4 + 624 * 4)
        words = checked.getstate()[1]
        expected = (words[624].to_bytes(4, "little", signed=True)
                    + b"".join(w.to_bytes(4, "little") for w in words[:624]))
    except Exception:  # another interpreter, or another layout
        return None
    if raw != expected:
        return None

    def fast() -> str:
        rng = random._inst  # type: ignore[attr-defined]
        if rng is not checked:  # replaced since: only getstate is safe
            return _python_slow()
        gauss = getattr(rng, "gauss_next", None) or 0.0
        return _crc(ctypes.string_at(id(rng) + header, 4 + 624 * 4) + gauss.hex().encode())

    return fast


def numpy_fingerprint() -> Callable[[], str] | None:
    """A function giving NumPy's global generator's fingerprint, or None without NumPy.

    NumPy's ``get_state`` builds its 624-word key in Python (about 30 us); the legacy
    generator's Mersenne Twister keeps its state in one C struct (624 words and a
    position, 2,500 bytes), which NumPy exposes through ``bit_generator.ctypes``: read
    there, the fingerprint costs about 1 us. Checked once against ``get_state``; any
    other generator or layout takes the slow road.
    """
    np = host.numpy_or_none()
    if np is None:
        return None

    def slow() -> str:
        _, key, pos, has_gauss, _ = np.random.get_state()
        return _crc(key.tobytes() + bytes((pos & 0xFF, pos >> 8, has_gauss)))

    def fast() -> str:
        bits = np.random.mtrand._rand._bit_generator
        if bits is not checked:
            return slow()
        return _crc(ctypes.string_at(address, 2500))

    try:
        checked = np.random.mtrand._rand._bit_generator
        if type(checked).__name__ != "MT19937":
            return slow
        address = checked.ctypes.state_address
        state = checked.state["state"]
        raw = ctypes.string_at(address, 2500)
        expected = state["key"].astype("<u4").tobytes() + int(state["pos"]).to_bytes(4, "little")
        return fast if raw == expected else slow
    except Exception:  # an older NumPy without .ctypes, or another layout
        return slow
