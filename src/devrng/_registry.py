"""The backend registry: one object per device type that knows its RNG state.

Built-in backends are stored as ``"module:attr"`` strings and imported on first
use, so ``import devrng`` never imports torch_xla, JAX or IPEX.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol, runtime_checkable

__all__ = [
    "Backend",
    "available_backends",
    "get_backend",
    "register_backend",
    "registry",
]


@runtime_checkable
class Backend(Protocol):
    """What devrng needs from a device type to fork, snapshot and seed it.

    A backend may offer more (``is_initialized()``, ``in_use()``,
    ``current_device()``, ``set_deterministic(flag)``), which devrng looks up
    with ``getattr`` and does without when absent.

    Example:
        >>> class MyBackend:
        ...     name = "mydev"
        ...     def is_available(self): return True
        ...     def device_count(self): return 1
        ...     def get_rng_state(self, index): return my_lib.get_state(index)
        ...     def set_rng_state(self, state, index): my_lib.set_state(state, index)
        ...     def manual_seed(self, seed): my_lib.seed_all(seed)
        >>> devrng.register_backend("mydev", MyBackend())
    """

    name: str

    def is_available(self) -> bool: ...

    def device_count(self) -> int: ...

    def get_rng_state(self, index: int) -> Any: ...

    def set_rng_state(self, state: Any, index: int) -> None: ...

    def manual_seed(self, seed: int) -> None: ...


class _Lazy(NamedTuple):
    """A backend not imported yet: where it lives and what it needs installed."""

    target: str  # "module:attr"
    requires: str | None  # top-level package that must be importable
    extra: str | None  # pip extra that installs it


_BUILTIN: dict[str, _Lazy] = {
    "cpu": _Lazy("devrng.backends.cpu:backend", None, None),
    "cuda": _Lazy("devrng.backends.cuda:backend", None, None),
    "xpu": _Lazy("devrng.backends.xpu:backend", None, None),
    "mps": _Lazy("devrng.backends.mps:backend", None, None),
    "xla": _Lazy("devrng.backends.xla:backend", "torch_xla", "xla"),
    "jax": _Lazy("devrng.backends.jax:backend", "torchax", "torchax"),
}

_lock = threading.RLock()
_entries: dict[str, Backend | _Lazy] = dict(_BUILTIN)
_resolved: dict[str, Backend] = {}
_entry_points_loaded = False

#: Read-only view of the registry: name -> backend object or lazy entry.
registry: Mapping[str, object] = MappingProxyType(_entries)


def register_backend(name: str, backend: Backend | str, *, clobber: bool = False) -> None:
    """Register ``backend`` for device type ``name``.

    ``backend`` is an object satisfying :class:`devrng.Backend`, or a
    ``"module:attr"`` string imported on first use.

    Example:
        >>> devrng.register_backend("mydev", "my_package.rng:backend")
    """
    if not isinstance(name, str) or not name or ":" in name:
        raise ValueError(
            f"Backend name {name!r} is not valid; use a device type such as 'cuda' or 'xla' "
            "(a non-empty string without ':')."
        )
    entry: Backend | _Lazy
    if isinstance(backend, str):
        if backend.count(":") != 1:
            raise ValueError(
                f"Backend target {backend!r} is not of the form 'module:attr', for example "
                "'my_package.rng:backend'."
            )
        entry = _Lazy(backend, None, None)
    elif isinstance(backend, Backend):
        entry = backend
    else:
        missing = [m for m in _REQUIRED if not hasattr(backend, m)]
        raise TypeError(
            f"Backend {backend!r} of type {type(backend).__name__} does not satisfy devrng.Backend: "
            f"it lacks {', '.join(missing)}. Pass an object with {', '.join(_REQUIRED)}, "
            "or a 'module:attr' string."
        )
    with _lock:
        if name in _entries and not clobber:
            raise ValueError(
                f"A backend named {name!r} is already registered; pass clobber=True to replace it."
            )
        _entries[name] = entry
        _resolved.pop(name, None)


_REQUIRED = ("name", "is_available", "device_count", "get_rng_state", "set_rng_state", "manual_seed")


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    from importlib.metadata import entry_points

    for ep in entry_points(group="devrng.backends"):
        with _lock:
            if ep.name not in _entries:
                _entries[ep.name] = _Lazy(ep.value, None, None)


def _privateuse1_name() -> str | None:
    import torch

    name: str = torch._C._get_privateuse1_backend_name()
    return None if name == "privateuseone" else name


def _resolve(name: str, entry: Backend | _Lazy) -> Backend:
    if not isinstance(entry, _Lazy):
        return entry
    module_name, _, attr = entry.target.partition(":")
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except ImportError as err:
        package = entry.requires or module_name.split(".")[0]
        hint = f"pip install 'devrng[{entry.extra}]'" if entry.extra else f"pip install {package}"
        raise ImportError(
            f"The {name!r} backend needs the {package!r} package, which could not be imported "
            f"({err}); install it with: {hint}"
        ) from err
    if not isinstance(obj, Backend):
        raise TypeError(
            f"{entry.target!r}, registered as backend {name!r}, is a {type(obj).__name__} that "
            "does not satisfy devrng.Backend."
        )
    return obj


def get_backend(name: str) -> Backend:
    """The backend for device type ``name`` (``"cuda"``, ``"xla"``, ...).

    Example:
        >>> devrng.get_backend("cpu").device_count()
        1
    """
    backend = _resolved.get(name)
    if backend is not None:
        return backend
    with _lock:
        entry = _entries.get(name)
        if entry is None:
            _load_entry_points()
            entry = _entries.get(name)
        if entry is None and isinstance(name, str) and name == _privateuse1_name():
            from devrng.backends.privateuse1 import DeviceModuleBackend

            entry = DeviceModuleBackend(name)
        if entry is None:
            raise ValueError(
                f"No devrng backend is registered for device type {name!r}; registered: "
                f"{', '.join(sorted(_entries))}. Register one with "
                "devrng.register_backend(name, backend) or the 'devrng.backends' entry point group."
            )
        backend = _resolve(name, entry)
        _resolved[name] = backend
        return backend


def peek_backend(name: str) -> Backend | None:
    """The backend for ``name`` if it can be had without importing a missing package."""
    backend = _resolved.get(name)
    if backend is not None:
        return backend
    entry = _entries.get(name)
    if isinstance(entry, _Lazy) and entry.requires and entry.requires not in sys.modules:
        return None  # not imported by anyone: nothing of this type can exist yet
    try:
        return get_backend(name)
    except (ValueError, ImportError):
        return None


def backend_names() -> list[str]:
    """Every registered name, plus the renamed PrivateUse1 device if there is one."""
    _load_entry_points()
    names = list(_entries)
    pu1 = _privateuse1_name()
    if pu1 is not None and pu1 not in names:
        names.append(pu1)
    return names


def available_backends() -> tuple[str, ...]:
    """Names whose device is usable in this process right now.

    Backends whose package nobody has imported yet (torch_xla, torchax) are not
    imported to find out: they count once the program imports them.

    Example:
        >>> devrng.available_backends()
        ('cpu',)
    """
    out = []
    for name in backend_names():
        backend = peek_backend(name)
        if backend is None:
            continue
        try:
            if backend.is_available():
                out.append(name)
        except Exception:  # a broken third-party backend must not break discovery
            continue
    return tuple(out)


def requirement(name: str) -> str | None:
    """The package a lazily registered backend needs, if it names one."""
    entry = _entries.get(name)
    return entry.requires if isinstance(entry, _Lazy) else None


def package_installed(module: str) -> bool:
    """Whether ``module`` could be imported, without importing it."""
    return module in sys.modules or importlib.util.find_spec(module) is not None
