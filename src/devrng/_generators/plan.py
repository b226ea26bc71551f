"""Which generators a call covers: device types and indices from ``devices`` / ``device_type``.

Every call that takes ``devices`` / ``device_type`` (fork_rng, get_rng_state,
manual_seed, RNGStreams, the distributed helpers) makes its plan here, so that all
of them read their arguments the same way.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

import torch

from devrng._backends.registry import (
    Backend,
    cached_backend,
    current_index,
    default_types,
    device_count,
    device_indices,
    get_backend,
)
from devrng._generators.infer import indices_by_type, parse_device

__all__ = ["Plan", "make_plan", "normalize_device_type"]

#: ((backend, indices), ...) in device-type order; CPU is implied and never listed.
#: Plans are tuples because they are cached and shared between calls.
Plan = tuple[tuple[Backend, tuple[int, ...]], ...]

_warned: set[str] = set()


def normalize_device_type(device_type: object) -> list[str]:
    """``device_type`` as a list of types: None, a type string, a torch.device, or a sequence."""
    if device_type is None:
        return []
    if isinstance(device_type, (str, torch.device)):
        items: Iterable[object] = (device_type,)
    elif isinstance(device_type, (list, tuple, set, frozenset)):
        items = device_type
    else:
        raise TypeError(
            f"device_type={device_type!r} (a {type(device_type).__name__}) is not accepted; pass "
            "a device type such as 'cuda' or 'xla', a torch.device, or a list of them."
        )
    out: list[str] = []
    for item in items:
        if not isinstance(item, (str, torch.device)):
            raise TypeError(
                f"device_type contains {item!r} (a {type(item).__name__}); every entry must be a "
                "device type string such as 'xpu' or a torch.device."
            )
        try:
            name, index = parse_device(item)
        except ValueError as err:
            raise ValueError(
                f"device_type={item!r} is not a device type; use one such as 'cuda', 'xpu', "
                "'mps', 'xla' or 'jax', or the name of a registered devrng backend."
            ) from err
        if index is not None:
            raise ValueError(
                f"device_type={str(item)!r} names a device, not a device type; pass "
                f"device_type={name!r} and the device in devices, as in devices=[{index}]."
            )
        if name not in out:
            out.append(name)
    return out


def _warn_many(name: str, count: int, caller: str, devices_kw: str) -> None:
    # Same text as torch.random.fork_rng, so existing warning filters keep working.
    if name in _warned:
        return
    _warned.add(name)
    up = name.upper()
    warnings.warn(
        f"{up} reports that you have {count} available devices, and "
        f"you have used {caller} without explicitly specifying which devices are being used. "
        f"For safety, we initialize *every* {up} device by default, which can "
        f"be quite slow if you have a lot of {up}s. If you know that you are only"
        f" making use of a few {up} devices, set the environment variable "
        f"{up}_VISIBLE_DEVICES or the '{devices_kw}' keyword argument of {caller} "
        "with the set of devices you are actually using. For example, if you are using CPU only, "
        "set device.upper()_VISIBLE_DEVICES= or devices=[]; if you are using device 0 only, "
        f"set {up}_VISIBLE_DEVICES=0 or devices=[0].  To initialize all devices "
        f"and suppress this warning, set the '{devices_kw}' keyword argument to "
        f"`range(torch.{name}.device_count())`.",
        stacklevel=4,
    )


def make_plan(
    devices: Any,
    device_type: Any,
    *,
    caller: str = "fork_rng",
    devices_kw: str = "devices",
    warn: bool = True,
) -> Plan:
    """Resolve ``devices`` / ``device_type`` into backends and device indices.

    The two call shapes that run once per layer or step take fast paths:
    ``devices=[tensor, ...]`` and ``devices=[index, ...], device_type="xla"``
    (what ``torch.utils.checkpoint`` passes through ``patch_torch()``).

    Examples:
        >>> make_plan([], None)
        ()
    """
    if devices.__class__ is list or devices.__class__ is tuple:
        if device_type is None:
            plan = _plan_tensors(devices)
        elif device_type.__class__ is str:
            plan = _plan_indices(devices, device_type)
        else:
            plan = None
        if plan is not None:
            return plan
    types = normalize_device_type(device_type)
    named = [t for t in types if t not in ("cpu", "meta")]
    if devices is None:
        # device_type names the types to cover (an empty list: none); without it, the
        # types in use.
        return _plan_whole_types(named if device_type is not None else None, caller,
                                 devices_kw, warn)
    bare = bool(named) or not types  # device_type="cpu": bare indices are the CPU, forked anyway
    return tuple(device_indices(get_backend(name), indices)
                 for name, indices in indices_by_type(devices, named, bare, devices_kw).items()
                 if indices)  # a type named by device_type alone, with devices=[...] for others


def _plan_whole_types(named: list[str] | None, caller: str, devices_kw: str, warn: bool) -> Plan:
    """Every device of the named types, or, with none named (None), of the types in use."""
    plan = []
    for name in default_types() if named is None else named:
        backend = get_backend(name)
        count = device_count(backend)
        if count > 1 and warn:
            _warn_many(name, count, caller, devices_kw)
        plan.append((backend, tuple(range(count))))
    return tuple(plan)


# Plans of single-tensor device lists, by device; checked against the registry on use
# (a backend registered again with clobber=True is a new object).
_single: dict[torch.device, Plan] = {}


def _plan_tensors(devices: list[Any] | tuple[Any, ...]) -> Plan | None:
    """``devices=[tensor, ...]`` without the general walk; None when ``devices`` holds anything
    but plain tensors on indexed devices. A single tensor's plan is kept per device."""
    if len(devices) == 1:
        x = devices[0]
        if x.__class__ is torch.Tensor or x.__class__ is torch.nn.Parameter:
            dev = x.device
            kept = _single.get(dev)
            if kept is not None and cached_backend(dev.type) is kept[0][0]:
                return kept
    found: dict[str, list[int]] = {}
    for x in devices:
        if x.__class__ is not torch.Tensor and x.__class__ is not torch.nn.Parameter:
            return None
        dev = x.device
        name = dev.type
        if name == "cpu" or name == "meta":
            continue
        index = dev.index
        if index is None:
            return None
        indices = found.get(name)
        if indices is None:
            found[name] = [index]
        elif index not in indices:
            indices.append(index)
    # A tensor's own device exists: no range check needed. A backend not resolved yet is
    # resolved once by the general path.
    plan: list[tuple[Backend, tuple[int, ...]]] = []
    for name, indices in found.items():
        backend = cached_backend(name)
        if backend is None:
            return None
        plan.append((backend, tuple(indices)))
    out = tuple(plan)
    if len(devices) == 1 and len(out) == 1 and len(_single) < 64:
        _single[devices[0].device] = out
    return out


def _plan_indices(devices: list[Any] | tuple[Any, ...], name: str) -> Plan | None:
    """``devices=[0], device_type="xla"`` without parsing; None for anything unusual.

    Plans are kept per (type, indices). A kept plan is used only while the registry
    still holds the same backend and it reports the same device count as when the
    plan was made; indices of -1 (the current device) are never kept.
    """
    key = (name, tuple(devices))
    hit = _by_index.get(key)
    if hit is not None:
        plan, count = hit
        if cached_backend(name) is plan[0][0] and plan[0][0].device_count() == count:
            return plan
    backend = cached_backend(name)
    if backend is None or name == "cpu" or not devices:
        return None  # the general path resolves the backend and says what is wrong
    count = device_count(backend)
    out: list[int] = []
    keep = True
    for index in devices:
        if index.__class__ is not int:
            return None
        if index == -1:
            index, keep = current_index(backend), False
        elif not 0 <= index < count:
            return None
        if index not in out:
            out.append(index)
    plan = ((backend, tuple(out)),)
    if keep and len(_by_index) < 256:
        _by_index[key] = (plan, count)
    return plan


# Plans of (device type, index list) calls, with the device count they were made for.
_by_index: dict[tuple[str, tuple[Any, ...]], tuple[Plan, int]] = {}
