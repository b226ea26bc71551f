"""Find the device types (and indices) that an arbitrary nesting of objects lives on.

Nothing here imports torch_xla, JAX or torchax: tensors of those libraries are
torch tensors whose ``.device`` already says ``xla:N`` or ``jax:0``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["collect_devices", "infer_device_types", "parse_device"]

# Device types that never have RNG state of their own to fork.
_IGNORED = frozenset({"cpu", "meta"})

# (type, index) per device object and per device string: parsing is the slow part.
_device_cache: dict[Any, tuple[str, int | None]] = {}


def _parse(dev: torch.device | str) -> tuple[str, int | None]:
    hit = _device_cache.get(dev)
    if hit is None:
        hit = parse_device(dev)
        if len(_device_cache) < 4096:
            _device_cache[dev] = hit
    return hit


def parse_device(dev: torch.device | str) -> tuple[str, int | None]:
    """``(type, index)`` of a device; also accepts types torch does not know but devrng has
    a backend for (``"mydev:1"``)."""
    try:
        d = torch.device(dev)
        return d.type, d.index
    except (RuntimeError, ValueError, TypeError) as err:
        if isinstance(dev, str):
            name, _, index = dev.partition(":")
            from devrng._registry import registry

            if name in registry and (not index or index.isdigit()):
                return name, int(index) if index else None
        raise ValueError(
            f"{dev!r} is not a device string; use a device type with an optional index, "
            "such as 'cuda', 'xpu:1' or 'xla:0', or the name of a registered devrng backend."
        ) from err


class Devices:
    """Devices found in an object: type -> indices (``None`` = that type's current device)."""

    __slots__ = ("indices", "ints")

    def __init__(self) -> None:
        self.indices: dict[str, list[int | None]] = {}
        self.ints: list[int] = []

    def add(self, dtype: str, index: int | None) -> None:
        if dtype in _IGNORED:
            return
        found = self.indices.get(dtype)
        if found is None:
            self.indices[dtype] = [index]
        elif index not in found:
            found.append(index)


def collect_devices(obj: object) -> Devices:
    """Walk ``obj`` once and record every device it names.

    Example:
        >>> collect_devices(["xla:0", 1]).indices
        {'xla': [0]}
    """
    out = Devices()
    add = out.add
    ints = out.ints
    tensor_types: dict[type, bool] = {}

    def visit(x: object) -> None:
        tx = type(x)
        if tx is torch.Tensor or tx is torch.nn.Parameter:
            add(*_parse(x.device))  # type: ignore[attr-defined]
        elif tx is list or tx is tuple or tx is set or tx is frozenset:
            for item in x:  # type: ignore[attr-defined]
                visit(item)
        elif tx is int:
            ints.append(x)  # type: ignore[arg-type]
        elif tx is str or tx is torch.device:
            add(*_parse(x))  # type: ignore[arg-type]
        elif tx is dict or isinstance(x, Mapping):
            for item in x.values():  # type: ignore[attr-defined]
                visit(item)
        elif tensor_types.get(tx) or isinstance(x, torch.Tensor):
            tensor_types[tx] = True  # tensor subclasses: FakeTensor, torchax, DTensor...
            add(*_parse(x.device))  # type: ignore[attr-defined]
        elif isinstance(x, torch.nn.Module):
            for p in x.parameters():
                add(*_parse(p.device))
            for b in x.buffers():
                add(*_parse(b.device))
        elif isinstance(x, torch.Generator):
            add(*_parse(x.device))
        elif isinstance(x, (list, tuple, set, frozenset)):  # namedtuples and other subclasses
            for item in x:
                visit(item)
        elif isinstance(x, int) and not isinstance(x, bool):
            ints.append(int(x))
        else:
            raise TypeError(
                f"Cannot infer a device from an object of type {tx.__module__}.{tx.__qualname__} "
                f"({_short_repr(x)}); accepted are ints, device strings, torch.device, tensors, "
                "nn.Module, torch.Generator and lists, tuples, dicts and sets of these."
            )

    visit(obj)
    return out


def _short_repr(x: object) -> str:
    text = repr(x)
    return text if len(text) <= 60 else text[:57] + "..."


def infer_device_types(obj: object) -> tuple[str, ...]:
    """Device types found in ``obj``, in first-seen order, without duplicates.

    ``"cpu"`` and ``"meta"`` are never reported.

    Example:
        >>> devrng.infer_device_types([torch.ones(1, device="meta"), "xpu:1", {"a": "xla:0"}])
        ('xpu', 'xla')
    """
    return tuple(collect_devices(obj).indices)
