"""Find the device types (and indices) that an arbitrary nesting of objects lives on.

Nothing here imports torch_xla, JAX or torchax: tensors of those libraries are
torch tensors whose ``.device`` already says ``xla:N`` or ``jax:0``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from devrng._backends.registry import SIDE_TYPES, current_accelerator, default_types, registry
from devrng._base.errors import short_repr

__all__ = [
    "Devices", "arg_devices", "collect_devices", "indices_by_type", "infer_device_types",
    "parse_device",
]

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


_MAX_DEPTH = 10_000  # deeper nestings are mistakes, not device lists
_END = object()


def arg_devices(args: object) -> Devices:
    """The devices of the tensors and modules among a compiled function's arguments.

    Only tensors and modules name devices here (found through torch's pytree,
    so any registered container counts); strings, ints and other leaves are data.

    Examples:
        >>> arg_devices((["xla:0", 1], {"x": torch.ones(1)})).indices
        {}
    """
    out = Devices()
    for leaf in tree_leaves(args):
        if isinstance(leaf, torch.Tensor):
            out.add(*_parse(leaf.device))
        elif isinstance(leaf, torch.nn.Module):
            _add_module(leaf, out.add)
    return out


def collect_devices(obj: object) -> Devices:
    """Walk ``obj`` once and record every device it names.

    Examples:
        >>> collect_devices(["xla:0", 1]).indices
        {'xla': [0]}
    """
    out = Devices()
    add = out.add
    ints = out.ints
    tensor_types: dict[type, bool] = {}
    # An explicit stack of iterators, not recursion: a deep nesting must get a clear
    # error, not a RecursionError. `path` holds the ids of the containers being walked;
    # one met again inside itself is a cycle.
    stack: list[Iterator[Any]] = [iter((obj,))]
    path: list[int] = [0]
    on_path = {0}

    def enter(items: Iterable[Any], container: object) -> None:
        if id(container) in on_path:
            raise ValueError(
                f"devices contains itself ({short_repr(container)}); pass a list that does "
                "not include itself."
            )
        if len(stack) > _MAX_DEPTH:
            raise ValueError(
                f"devices is nested more than {_MAX_DEPTH} levels deep; pass a flat list of "
                "devices, tensors or modules."
            )
        stack.append(iter(items))
        path.append(id(container))
        on_path.add(id(container))

    while stack:
        x = next(stack[-1], _END)
        if x is _END:
            stack.pop()
            on_path.discard(path.pop())
            continue
        tx = type(x)
        if tx is torch.Tensor or tx is torch.nn.Parameter:
            add(*_parse(x.device))  # type: ignore[attr-defined]
        elif tx is int:
            ints.append(x)  # type: ignore[arg-type]
        elif tx is str or tx is torch.device:
            add(*_parse(x))  # type: ignore[arg-type]
        elif tx is list or tx is tuple or tx is set or tx is frozenset:
            enter(x, x)  # type: ignore[arg-type]
        elif tx is dict or isinstance(x, Mapping):
            enter(x.values(), x)  # type: ignore[attr-defined]
        elif tensor_types.get(tx) or isinstance(x, torch.Tensor):
            tensor_types[tx] = True  # tensor subclasses: FakeTensor, torchax, DTensor...
            add(*_parse(x.device))  # type: ignore[attr-defined]
        elif isinstance(x, torch.nn.Module):
            _add_module(x, add)
        elif isinstance(x, torch.Generator):
            add(*_parse(x.device))
        elif isinstance(x, (list, tuple, set, frozenset)):  # namedtuples and other subclasses
            enter(x, x)
        elif isinstance(x, int) and not isinstance(x, bool):
            ints.append(int(x))
        else:
            raise TypeError(
                f"Cannot infer a device from an object of type {tx.__module__}.{tx.__qualname__} "
                f"({short_repr(x)}); accepted are ints, device strings, torch.device, tensors, "
                "nn.Module, torch.Generator and lists, tuples, dicts and sets of these."
            )
    return out


def indices_by_type(devices: object, named: list[str], bare: bool, kw: str
                    ) -> dict[str, list[int | None]]:
    """The device indices ``devices`` names, by type, starting with the ``named`` types.

    Bare ints go to the one type they can mean (``bare=False``: they are dropped);
    ``None`` stands for a type's current device.

    Examples:
        >>> indices_by_type(["xla:1", 0], ["xla"], True, "devices")
        {'xla': [1, 0]}
    """
    found = collect_devices(devices)
    by_type: dict[str, list[int | None]] = {t: [] for t in named}
    for name, indices in found.indices.items():
        by_type.setdefault(name, []).extend(indices)
    if found.ints and bare:
        owner = _owner_of_ints(named, list(found.indices), found.ints, kw)
        by_type.setdefault(owner, []).extend(found.ints)
    return by_type


def _owner_of_ints(named: list[str], inferred: list[str], ints: list[int], kw: str) -> str:
    """Which device type bare integer indices refer to."""
    if len(named) == 1:
        return named[0]
    if not named and len(inferred) == 1:
        return inferred[0]
    if not named and not inferred:
        # As torch: the current accelerator. But when XLA or torchax is what this process
        # uses, bare indices mean that device; when several are in use, say so.
        acc = current_accelerator()
        in_use = default_types()
        if len(in_use) == 1:
            return in_use[0]
        if acc is not None and (not in_use or (acc in in_use and acc not in SIDE_TYPES)):
            return acc
        why = (f"several device types are in use ({', '.join(in_use)})" if in_use else
               "this process has no accelerator to refer them to")
        raise ValueError(
            f"{kw}={short_repr(ints)} holds device indices but no device type, and {why}; pass "
            "device_type='cuda' (or 'xla', 'xpu', ...), or name devices fully, as in "
            f"{kw}=['xla:0']."
        )
    candidates = named or inferred
    raise ValueError(
        f"{kw} holds bare indices {short_repr(ints)} but several device types ({', '.join(candidates)}); "
        "say which type they belong to with device_type='...', or name devices fully, as in "
        f"'{candidates[0]}:{short_repr(ints[0])}'."
    )


def _add_module(module: torch.nn.Module, add: Any) -> None:
    for p in module.parameters():
        add(*_parse(p.device))
    for b in module.buffers():
        add(*_parse(b.device))


def infer_device_types(obj: object) -> tuple[str, ...]:
    """Device types found in ``obj``, in first-seen order, without duplicates.

    ``"cpu"`` and ``"meta"`` are never reported: the CPU is always forked, and
    meta tensors have no generator.

    Args:
        obj: An int (no type), a device string (``"xpu:1"``, ``"cuda"``), a
            ``torch.device``, a tensor (torchax tensors are ``"jax"``), a
            module (its parameters and buffers), a ``torch.Generator``, or any
            nesting of lists, tuples, dicts and sets of these.

    Returns:
        The device type names, such as ``("xla",)`` or ``("cuda", "xpu")``.

    Raises:
        TypeError: Something in ``obj`` has no device; the message names its type.

    Examples:
        >>> devrng.infer_device_types([torch.ones(1, device="meta"), "xpu:1", {"a": "xla:0"}])
        ('xpu', 'xla')
    """
    return tuple(collect_devices(obj).indices)
