"""Exact digests of batches and short fingerprints of generators, for the flight record.

A batch digest must be the same number whichever device computes it and in whatever
order the device adds, so that a batch digested on the CPU where a loader delivered it
equals the same bytes digested on an accelerator: each tensor is read as the integers
that hold its bits (float32 as int32, bfloat16 as int16, ...), and the digest is the
wrapping 64-bit sum of ``value * (2 * position + 1)`` over its elements -- integer
addition modulo 2**64 gives one answer in every order, and the odd weights make it
see samples that trade places. A floating-point reduction would not: its rounding
depends on the order a device chooses.

Tensors of more than ``SAMPLED`` elements are digested on ``SAMPLED`` of them: 64 runs
of 64 consecutive elements, spread evenly over the flattened tensor, so a digest costs a
few microseconds whatever the batch size; augmentation changes most of a sample's
elements and is seen. A digest of a tensor on an accelerator stays there (a 0-d tensor) until the
record is written: no host synchronisation per step.
"""

from __future__ import annotations

import ctypes
import hashlib
import random
import struct
import weakref
import zlib
from collections.abc import Callable, Mapping
from typing import Any

import torch

from devrng._backends import host

__all__ = ["RUN", "RUNS", "SAMPLED", "Pending", "Views", "batch_digest", "batch_parts", "crc",
           "generator_fingerprint", "indices_digest", "numpy_fingerprint", "python_fingerprint",
           "resolve", "state_fingerprint"]

#: Elements digested per tensor at most: in runs of ``RUN`` consecutive ones.
SAMPLED = 4096
RUN = 64
RUNS = SAMPLED // RUN
_MASK64 = (1 << 64) - 1
_INTEGER_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
# CPU tensors NumPy reads as they are (the rest go through torch's integer view first), and
# NumPy's integers of each size: the same bits as _INTEGER_VIEW's, read with fewer calls.
_NUMPY_READS = frozenset({torch.float16, torch.float32, torch.float64, torch.uint8, torch.int8,
                          torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64,
                          torch.complex128})
_NUMPY_INTEGERS: dict[int, Any] = {}


_found_numpy: list[Any] = []  # NumPy, once found (a step reads it several times)


def _numpy() -> Any:
    """NumPy, or None without it (asked of the import system until it is found)."""
    if _found_numpy:
        return _found_numpy[0]
    np = host.numpy_or_none()
    if np is not None:
        _NUMPY_INTEGERS.update({1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64})
        _found_numpy.append(np)
    return np


class Pending:
    """A digest not computed yet (``resolve`` computes many at once, when the record is
    written): its parts are bytes, ints and 0-d int64 tensors on devices."""

    __slots__ = ("parts",)

    def __init__(self, parts: list[Any]) -> None:
        self.parts = parts


def crc(data: Any) -> str:
    """The CRC-32 of ``data`` (bytes, or a contiguous CPU uint8 tensor) as 8 hexadecimal
    digits: a generator's fingerprint."""
    if isinstance(data, torch.Tensor):
        data = data.numpy()
    return f"{zlib.crc32(data) & 0xFFFFFFFF:08x}"


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
        >>> from devrng._checks.digest import batch_digest
        >>> x = torch.arange(6.0).reshape(2, 3)
        >>> batch_digest((x, [1, 2])) == batch_digest((x.clone(), [1, 2]))
        True
        >>> batch_digest((x.flip(0), [1, 2])) == batch_digest((x, [1, 2]))
        False
    """
    found = batch_parts(batch)
    if any(isinstance(p, torch.Tensor) for p in found.parts):
        return found
    return _finish(found.parts)


def batch_parts(batch: Any) -> Pending:
    """What ``batch_digest`` hashes, not hashed yet (``resolve`` does that, for many digests
    at once): a training step pays for reading its batch, not for formatting the digest."""
    parts: list[Any] = []
    _walk(batch, parts, 0)
    return Pending(parts)


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
        np = _numpy()
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


# Weights 2 * position + 1 for the sampled positions, by (device, elements).
_weights: dict[tuple[Any, int], Any] = {}


def _runs(n: int) -> tuple[int, int]:
    """How a tensor of ``n`` elements is sampled: ``RUNS`` runs of ``RUN`` consecutive
    elements, ``stride`` apart (from the first); ``(n, 0)``: all of it.

    Runs, not every k-th element: a batch just made is mostly out of the cache, and every
    k-th element would touch every cache line of it; 64 runs touch 16 KB.
    """
    return (n, 0) if n <= SAMPLED else (RUNS, n // RUNS)


def _sampled(flat: Any, n: int) -> Any:
    """The sampled elements of a flat tensor or array of ``n`` elements (a view)."""
    runs, stride = _runs(n)
    return flat if stride == 0 else flat[:runs * stride].reshape(runs, stride)[:, :RUN]


def _positions(n: int, arange: Any) -> Any:
    """``2 * position + 1`` of each sampled element, through ``arange`` (NumPy's or torch's)."""
    return _sampled(arange(n), n).reshape(-1) * 2 + 1


def _tensor_sum(t: torch.Tensor) -> Any:
    """The wrapping sum of ``value * (2 * position + 1)`` over ``t``'s (sampled) elements:
    an int on the CPU (read now), a 0-d int64 tensor on a device (read when resolved)."""
    t = t.detach()
    # (Quantized dtypes are not among the NumPy reads: the layout is the only check left.)
    if t.is_cpu and t.dtype in _NUMPY_READS and t.layout is torch.strided \
            and _numpy() is not None:  # few calls: a step pays for each
        if t.is_complex():  # a complex number as its two parts
            t = torch.view_as_real(t)
        flat = t.numpy().reshape(-1)
        return _numpy_sum(flat.view(_NUMPY_INTEGERS[flat.itemsize]))
    if t.is_complex():
        t = torch.view_as_real(t)
    size = t.element_size()
    if t.layout is not torch.strided or t.is_quantized or size not in _INTEGER_VIEW:
        return str(t.layout).encode()  # sparse or quantized: described, not digested
    n = t.numel()
    if n == 0:
        return 0
    bits = t.view(_INTEGER_VIEW[size]).reshape(-1)
    if t.is_cpu and _numpy() is not None:
        return _numpy_sum(bits.numpy())
    key = (t.device, n)
    weights = _weights.get(key)
    if weights is None:
        weights = _cached(key, _positions(n, lambda k: torch.arange(k, dtype=torch.int64,
                                                                     device=t.device)))
    total = (_sampled(bits, n).reshape(-1).to(torch.int64) * weights).sum()
    return int(total) & _MASK64 if t.is_cpu else total


def _numpy_sum(flat: Any) -> int:
    """``_tensor_sum`` of a flat NumPy array of a CPU tensor's integer bits: read now."""
    return _weighted_sum(*_numpy_sample(flat))


def _numpy_sample(flat: Any) -> tuple[Any, Any]:
    """The sampled elements of ``flat`` (a view) and their weights (made once per size, in
    the sample's shape)."""
    n = flat.size
    weights = _weights.get(("cpu", n))
    if weights is None:
        np = _numpy()
        weights = _cached(("cpu", n), _sampled(np.arange(n, dtype=np.int64), n) * 2 + 1)
    return _sampled(flat, n), weights


def _weighted_sum(sample: Any, weights: Any) -> int:
    return int((sample * weights).sum()) & _MASK64 if sample.size else 0


class Views:
    """Digests of tensors that stay where they are (a model's parameters, each step): the
    view of a CPU tensor's sampled elements is made once and read in place at each digest.
    A tensor whose memory, shape or strides changed (``p.data = ...``) is looked at again;
    a tensor that is gone is forgotten. ``digest(tensors)`` equals ``batch_digest(tensors)``.
    """

    def __init__(self) -> None:
        self._found: dict[int, tuple[Any, ...]] = {}

    def digest(self, tensors: list[torch.Tensor]) -> str | Pending:
        """``batch_digest(tensors)``, for a list of tensors."""
        parts: list[Any] = [b"[%d" % len(tensors)]
        device = False  # a part is a device tensor's sum, read later
        for t in tensors:
            entry = self._found.get(id(t))
            if entry is None or entry[0]() is not t or entry[1] != (t.data_ptr(), t.shape,
                                                                    t.stride()):
                entry = self._look(t)
            if entry is None:  # (not a CPU tensor NumPy reads)
                _walk(t, parts, 1)
                device = device or isinstance(parts[-1], torch.Tensor)
            else:
                parts += (entry[2], _weighted_sum(entry[3], entry[4]))
        return Pending(parts) if device else _finish(parts)

    def clear(self) -> None:
        self._found.clear()

    def _look(self, t: torch.Tensor) -> tuple[Any, ...] | None:
        self._found.pop(id(t), None)
        # (A tensor that is not contiguous would be read through a copy: not one to keep.)
        if not (isinstance(t, torch.Tensor) and t.is_cpu and t.dtype in _NUMPY_READS
                and t.layout is torch.strided and t.is_contiguous() and _numpy() is not None):
            return None
        alias = t.detach()  # (the view holds the memory, not the tensor: it can go)
        flat = (torch.view_as_real(alias) if alias.is_complex() else alias).numpy().reshape(-1)
        found, key = self._found, id(t)
        entry = (weakref.ref(t, lambda _: found.pop(key, None)),
                 (t.data_ptr(), t.shape, t.stride()), _header(t),
                 *_numpy_sample(flat.view(_NUMPY_INTEGERS[flat.itemsize])))
        found[key] = entry
        return entry


def _cached(key: tuple[Any, int], weights: Any) -> Any:
    if len(_weights) > 64:  # shapes vary (the last batch of an epoch): stay small
        _weights.clear()
    _weights[key] = weights
    return weights


def indices_digest(indices: Any) -> str:
    """Sample indices (ints; or a step's batches, each what a batch sampler yields: a list of
    ints, or anything else) as 16 hexadecimal digits."""
    try:
        if isinstance(indices, list) and indices and type(indices[0]) in (list, tuple):
            # a step's batches, each a list of ints: each with its length
            data = b"l" + b"".join([_packed(batch, len(batch)) for batch in indices])
        else:
            data = b"q" + _packed(indices)
    except (TypeError, struct.error):
        data = b"r" + repr(indices).encode()
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def _numpy_kind(values: Any) -> str:
    dtype = getattr(values, "dtype", None)
    return getattr(dtype, "kind", "-") or "-"


def _packed(values: Any, *prefix: int) -> bytes:
    """``prefix`` and ``values`` (a list or tuple of ints, or a 1-d tensor or array of them)
    as 8-byte little-endian signed integers; TypeError or struct.error for anything else."""
    if not isinstance(values, (list, tuple, torch.Tensor)) and _numpy_kind(values) not in "iub":
        raise TypeError("not a sequence of ints")
    return struct.pack(f"<{len(prefix) + len(values)}q", *prefix, *values)


# -- fingerprints of generators: 8 hexadecimal digits each -------------------------------

def generator_fingerprint(generator: torch.Generator) -> str:
    """A torch CPU generator's state (``get_state`` makes the copy)."""
    return crc(generator.get_state())


def state_fingerprint(state: Any) -> str | Pending:
    """Any generator state (a tensor, an int, a JAX key, nested plain data): ``state`` is
    a copy the caller owns (what a backend's ``get_rng_state`` returns)."""
    if isinstance(state, torch.Tensor) and state.device.type == "cpu" \
            and state.dtype == torch.uint8 and state.is_contiguous():
        return crc(state)
    return batch_parts(_plain_state(state))


def _plain_state(state: Any) -> Any:
    if hasattr(state, "__jax_array__") or type(state).__module__.startswith("jax"):
        np = _numpy()
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
        return crc(ctypes.string_at(id(rng) + header, 4 + 624 * 4) + gauss.hex().encode())

    return fast


def numpy_fingerprint() -> Callable[[], str] | None:
    """A function giving NumPy's global generator's fingerprint, or None without NumPy.

    NumPy's ``get_state`` builds its 624-word key in Python (about 30 us); the legacy
    generator's Mersenne Twister keeps its state in one C struct (624 words and a
    position, 2,500 bytes), which NumPy exposes through ``bit_generator.ctypes``: read
    there, the fingerprint costs about 1 us. Checked once against ``get_state``; any
    other generator or layout takes the slow road.
    """
    np = _numpy()
    if np is None:
        return None

    def slow() -> str:
        _, key, pos, has_gauss, _ = np.random.get_state()
        return crc(key.tobytes() + bytes((pos & 0xFF, pos >> 8, has_gauss)))

    def fast() -> str:
        bits = np.random.mtrand._rand._bit_generator
        if bits is not checked:
            return slow()
        return crc(ctypes.string_at(address, 2500))

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
