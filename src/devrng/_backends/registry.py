"""The backend registry, and the backend contract: one object per device type that knows its RNG.

Built-in backends are stored as ``"module:attr"`` strings and imported on first
use, so ``import devrng`` never imports torch_xla, JAX or IPEX. Third-party
backends come from ``devrng.register_backend`` or the ``devrng.backends`` entry
point group; one that fails to load is skipped with a warning by everything
that does not name it.

Every question devrng asks a backend beyond the six required members goes
through a function here (``device_count``, ``current_index``,
``is_initialized``), so each has one answer and one fallback.
"""

from __future__ import annotations

import importlib.util
import sys
import warnings
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol, runtime_checkable

import torch

from devrng._base.lazy import install_hint, load
from devrng._base.locks import ForkSafeLock

__all__ = [
    "SIDE_TYPES",
    "Backend",
    "CurrentDevice",
    "DeterminismSwitch",
    "InitializedCheck",
    "PerDeviceSeed",
    "StateCodec",
    "available_backends",
    "backend_names",
    "broken_backends",
    "cached_backend",
    "current_accelerator",
    "current_index",
    "default_types",
    "device_count",
    "device_indices",
    "get_backend",
    "install_command",
    "install_extra",
    "is_initialized",
    "loaded_backend",
    "package_installed",
    "package_loaded",
    "register_backend",
    "registry",
    "requirement",
    "started_types",
    "unregister_backend",
]


# --------------------------------------------------------------------------- the contract
@runtime_checkable
class Backend(Protocol):
    """What devrng needs from a device type to fork, snapshot and seed it.

    These six members are all a backend must have. It may also offer optional
    ones, which devrng looks up with ``getattr`` and does without when absent:
    ``is_initialized()``, ``current_device()``, ``manual_seed_device(seed,
    index)``, ``state_to_tensor(state)`` / ``tensor_to_state(tensor)`` and
    ``get_deterministic()`` / ``set_deterministic(flag)`` (the Devices page of
    the docs describes each).

    Attributes:
        name: The device type, as in ``torch.device`` (``"cuda"``, ``"xla"``).

    Examples:
        >>> class ToyBackend:  # two devices, each a torch.Generator here
        ...     name = "toy"
        ...     def __init__(self): self.gens = [torch.Generator(), torch.Generator()]
        ...     def is_available(self): return True
        ...     def device_count(self): return len(self.gens)
        ...     def get_rng_state(self, index): return self.gens[index].get_state()
        ...     def set_rng_state(self, state, index): self.gens[index].set_state(state)
        ...     def manual_seed(self, seed):
        ...         for g in self.gens: g.manual_seed(seed)
        >>> devrng.register_backend("toy", ToyBackend())
        >>> devrng.infer_device_types(["toy:1"])
        ('toy',)
    """

    name: str

    def is_available(self) -> bool: ...

    def device_count(self) -> int: ...

    def get_rng_state(self, index: int) -> Any: ...

    def set_rng_state(self, state: Any, index: int) -> None: ...

    def manual_seed(self, seed: int) -> None: ...


class InitializedCheck(Protocol):
    """Optional: whether the device runtime has started.

    devrng never reads the state of a device that has not started unless the
    caller named it (reading it would start it, pytorch/pytorch#41970). Without
    this member a backend counts as started whenever it is available.
    """

    def is_initialized(self) -> bool: ...


class CurrentDevice(Protocol):
    """Optional: the index that ``"<type>"`` without an index means (default 0)."""

    def current_device(self) -> int: ...


class PerDeviceSeed(Protocol):
    """Optional: seed one device only (``torch.<type>.manual_seed`` with several devices)."""

    def manual_seed_device(self, seed: int, index: int) -> None: ...


class StateCodec(Protocol):
    """Optional: how a state that is not a tensor travels through torch's RNG sites.

    ``torch.utils.checkpoint`` and ``torch.random.fork_rng`` carry states as
    tensors. Without these members, tensor states pass as they are and int
    states travel as 8 little-endian bytes.
    """

    def state_to_tensor(self, state: Any) -> torch.Tensor: ...

    def tensor_to_state(self, tensor: torch.Tensor) -> Any: ...


class DeterminismSwitch(Protocol):
    """Optional: the device's own determinism switch, set by ``devrng.deterministic()``.

    ``get_deterministic()`` returns the switch, or ``None`` when there is none
    in this process; ``set_deterministic(flag)`` sets it and returns the value
    before (``None``: no switch). ``deterministic_note`` is one line for the
    report.
    """

    deterministic_note: str

    def get_deterministic(self) -> bool | None: ...

    def set_deterministic(self, flag: bool) -> bool | None: ...


_REQUIRED = ("name", "is_available", "device_count", "get_rng_state", "set_rng_state", "manual_seed")
_MAX_DEVICES = 1 << 16  # more devices of one type than any machine has: a lying backend


def device_count(backend: Backend) -> int:
    """``backend.device_count()``, checked: a backend that fails or returns nonsense gets a
    clear error that names it."""
    try:
        count = backend.device_count()
    except Exception as err:
        raise RuntimeError(
            f"The devrng backend {_described(backend)} failed to count its devices "
            f"({type(err).__name__}: {err}); fix or uninstall the package that provides it."
        ) from err
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= _MAX_DEVICES:
        raise TypeError(
            f"The devrng backend {getattr(backend, 'name', backend)!r} reported "
            f"device_count() = {count!r} (a {type(count).__name__}); a backend must return an "
            f"int from 0 to {_MAX_DEVICES}."
        )
    return count


def _described(backend: Backend) -> str:
    """``'name'``, and where a plugin backend comes from."""
    name = getattr(backend, "name", backend)
    entry = _entries.get(name) if isinstance(name, str) else None
    origin = entry.origin if isinstance(entry, _Lazy) else None
    return f"{name!r}" + (f" ({origin})" if origin else "")


def current_index(backend: Backend) -> int:
    """The backend's current device index (its ``current_device()``, else 0)."""
    current = getattr(backend, "current_device", None)
    return int(current()) if current is not None else 0


def is_initialized(backend: Backend) -> bool:
    """Whether the backend's device runtime has started; never starts it.

    A backend without ``is_initialized()`` counts as started when it is
    available. A backend that raises counts as not started.
    """
    check = getattr(backend, "is_initialized", None)
    try:
        return bool(check()) if check is not None else bool(backend.is_available())
    except Exception:
        return False


# --------------------------------------------------------------------------- the registry
class _Lazy(NamedTuple):
    """A backend not imported yet: where it lives and what it needs installed."""

    target: str  # "module:attr"
    requires: str | None  # top-level package that must be importable
    extra: str | None  # pip extra that installs it
    origin: str | None = None  # for entry points: which one, from which distribution


_BUILTIN: dict[str, _Lazy] = {
    "cpu": _Lazy("devrng._backends.cpu:backend", None, None),
    "cuda": _Lazy("devrng._backends.cuda:backend", None, None),
    "xpu": _Lazy("devrng._backends.xpu:backend", None, None),
    "mps": _Lazy("devrng._backends.mps:backend", None, None),
    "xla": _Lazy("devrng._backends.xla:backend", "torch_xla", "xla"),
    "jax": _Lazy("devrng._backends.jax:backend", "torchax", "torchax"),
}

_lock = ForkSafeLock()
_entries: dict[str, Backend | _Lazy] = dict(_BUILTIN)
_resolved: dict[str, Backend] = {}
_broken: dict[str, str] = {}  # name -> why it could not be loaded (warned once)
_entry_points_loaded = False

#: Read-only view of the registry: name -> backend object or lazy entry.
registry: Mapping[str, object] = MappingProxyType(_entries)


def register_backend(name: str, backend: Backend | str, *, clobber: bool = False) -> None:
    """Register ``backend`` for device type ``name``.

    Args:
        name: The device type, as ``torch.device`` spells it (no ``":"``).
        backend: An object satisfying ``devrng.Backend`` (its ``name`` must be
            ``name``), or a ``"module:attr"`` string imported on first use.
        clobber: Replace a backend already registered as ``name``.

    Raises:
        ValueError: ``name`` is not a device type, is taken (without
            ``clobber``), or differs from the backend's ``name``; or the
            string is not ``"module:attr"``.
        TypeError: ``backend`` lacks members ``devrng.Backend`` requires.

    Examples:
        >>> devrng.register_backend("mydev", "my_package.rng:backend")  # imported on first use
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
        _check_name(name, backend)
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
        _broken.pop(name, None)


def _check_name(name: str, backend: Backend) -> None:
    # States are keyed by backend.name: a backend registered under another name would
    # save states that its own registry entry cannot find again.
    if getattr(backend, "name", None) != name:
        raise ValueError(
            f"The backend {backend!r} says its name is {getattr(backend, 'name', None)!r} but is "
            f"registered as {name!r}; its name attribute must be the device type it is "
            "registered for."
        )


def unregister_backend(name: str) -> None:
    """Remove the backend registered as ``name``; a built-in one comes back as shipped.

    Examples:
        >>> register_backend("mydev", "my_package.rng:backend")
        >>> unregister_backend("mydev")
        >>> "mydev" in registry
        False
    """
    with _lock:
        if name not in _entries:
            raise ValueError(f"No devrng backend is registered as {name!r}; nothing to remove.")
        if name in _BUILTIN:
            _entries[name] = _BUILTIN[name]
        else:
            del _entries[name]
        _resolved.pop(name, None)
        _broken.pop(name, None)


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    from importlib.metadata import entry_points

    for ep in entry_points(group="devrng.backends"):
        dist = getattr(ep, "dist", None)
        origin = (f"entry point '{ep.name} = {ep.value}' of the distribution "
                  f"{getattr(dist, 'name', '?')} {getattr(dist, 'version', '')}".rstrip())
        with _lock:
            if ep.name not in _entries:
                _entries[ep.name] = _Lazy(ep.value, None, None, origin)


def _privateuse1_name() -> str | None:
    name: str = torch._C._get_privateuse1_backend_name()
    return None if name == "privateuseone" else name


def _resolve(name: str, entry: Backend | _Lazy) -> Backend:
    if not isinstance(entry, _Lazy):
        return entry
    what = f"The {name!r} backend" + (f" ({entry.origin})" if entry.origin else "")
    try:
        obj = load(entry.target, what=what, extra=entry.extra)
    except ImportError:
        raise
    except (Exception, SystemExit) as err:  # a plugin module that raises (or exits) on import
        raise ImportError(
            f"{what} failed while importing {entry.target!r} ({type(err).__name__}: {err}); fix "
            "or uninstall the package that provides it."
        ) from err
    if not isinstance(obj, Backend):
        missing = [m for m in _REQUIRED if not hasattr(obj, m)]
        raise TypeError(
            f"{entry.target!r}, registered as backend {name!r}"
            + (f" by the {entry.origin}" if entry.origin else "")
            + f", is a {type(obj).__name__} that does not satisfy devrng.Backend (it lacks "
            f"{', '.join(missing)})."
        )
    _check_name(name, obj)
    return obj


def get_backend(name: str) -> Backend:
    """The backend for device type ``name``, imported on first use.

    Args:
        name: A device type: ``"cpu"``, ``"cuda"``, ``"xpu"``, ``"mps"``,
            ``"xla"``, ``"jax"`` (torchax), a PrivateUse1 device, or a
            registered one.

    Returns:
        The object satisfying ``devrng.Backend`` that devrng uses for it.

    Raises:
        ValueError: No backend is registered for ``name`` (the message lists
            those that are).
        ImportError: Its package (torch_xla, torchax) is not installed; the
            message says what to install.

    Examples:
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
            from devrng._backends.torch_module import DeviceModuleBackend

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


#: ``cached_backend(name)``: the backend for ``name`` if it has been resolved already, else
#: None. It is the resolved dict's own ``get``, for hot paths.
cached_backend: Callable[[str], Backend | None] = _resolved.get


def package_loaded(name: str) -> bool:
    """Whether the package backend ``name`` needs (torch_xla, torchax) has been imported.

    Until then no tensor of that type can exist, so there is nothing to fork.
    """
    entry = _entries.get(name)
    return not (isinstance(entry, _Lazy) and entry.requires and entry.requires not in sys.modules)


def loaded_backend(name: str) -> Backend | None:
    """The backend for ``name`` if it can be had without importing a package nobody imported.

    None for unknown names and for backends that fail to load; a third-party
    backend that fails is reported once with a warning naming it.
    """
    backend = _resolved.get(name)
    if backend is not None:
        return backend
    if name in _broken or not package_loaded(name):
        return None
    try:
        return get_backend(name)
    except ValueError:
        return None
    except Exception as err:
        entry = _entries.get(name)
        if isinstance(entry, _Lazy) and entry.requires is not None:
            return None  # a built-in backend whose package is missing: not a plugin problem
        _skip(name, f"could not be loaded: {err}")
        return None


def _skip(name: str, why: str) -> None:
    """Leave the broken backend ``name`` out of everything that does not name it; warn once."""
    _broken[name] = why
    warnings.warn(
        f"devrng skips the backend {name!r}, which {why} Everything that does not name it goes "
        "on without it.",
        RuntimeWarning,
        stacklevel=4,
    )


def broken_backends() -> dict[str, str]:
    """Backends that failed to load, with the reason (for ``devrng doctor``)."""
    return dict(_broken)


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

    Returns:
        Device type names, ``"cpu"`` first.

    Examples:
        >>> "cpu" in devrng.available_backends()
        True
    """
    out = []
    for name in backend_names():
        backend = loaded_backend(name)
        if backend is None:
            continue
        try:
            if backend.is_available():
                device_count(backend)  # a backend that cannot count its devices is broken
                out.append(name)
        except Exception as err:  # a broken third-party backend must not break discovery
            _skip(name, f"failed when asked about its devices: {err}")
    return tuple(out)


def started_types() -> list[str]:
    """Device types (not the CPU) that are available and whose runtime has started here.

    Their states exist and can be read without starting anything
    (pytorch/pytorch#41970); devrng saves and reseeds exactly these.
    """
    return [name for name in available_backends()
            if name != "cpu" and is_initialized(get_backend(name))]


# The types that can be "in use" without being the accelerator.
SIDE_TYPES = ("xla", "jax")

# The accelerator type is fixed for a process; it is kept per lookup function, so
# that a replaced one (a simulated device in tests) is asked again.
_accelerator: dict[Any, str | None] = {}


def current_accelerator() -> str | None:
    """The accelerator's device type if one is usable here (CUDA, XPU, MPS, ...), else None."""
    fn = torch.accelerator.current_accelerator
    if fn not in _accelerator:
        dev = fn()
        _accelerator.clear()
        _accelerator[fn] = None if dev is None else str(dev.type)
    name = _accelerator[fn]
    # A CUDA build reports "cuda" on a machine without a GPU: not an accelerator here.
    backend = loaded_backend(name) if name else None
    return name if backend is not None and backend.is_available() else None


def default_types() -> list[str]:
    """Types forked when the caller names none: the accelerator and XLA / torchax,
    each only if already initialised in this process (never initialise a device
    the caller did not ask for; see pytorch/pytorch#41970)."""
    out = []
    acc = current_accelerator()
    for name in ((acc,) if acc else ()) + SIDE_TYPES:
        backend = loaded_backend(name)
        if backend is not None and is_initialized(backend) and name not in out:
            out.append(name)
    return out


def device_indices(backend: Backend, indices: list[int | None]) -> tuple[Backend, tuple[int, ...]]:
    """``(backend, indices)`` with each index checked to exist; ``None`` and -1 mean the
    current device."""
    count = device_count(backend)
    resolved: list[int] = []
    for index in indices:
        if not count:
            shown = backend.name if index is None or index == -1 else f"{backend.name}:{index}"
            raise ValueError(
                f"Device {shown!r} does not exist: this process has no {backend.name} device. "
                "Name only devices this process has (devrng.available_backends() lists the "
                "device types), or leave the device out."
            )
        # -1 is "the current device", as for torch.cuda.device(-1); Tensor.get_device() gives
        # it for torchax tensors, and torch.utils.checkpoint passes those ids to fork_rng.
        if index is None or index == -1:
            index = current_index(backend)
        elif not 0 <= index < count:
            raise ValueError(
                f"Device {backend.name}:{index} does not exist: this process has "
                f"{count} {backend.name} device(s), indices 0 to {count - 1}."
            )
        if index not in resolved:
            resolved.append(index)
    return backend, tuple(resolved)


def requirement(name: str) -> str | None:
    """The package a lazily registered backend needs, if it names one."""
    entry = _entries.get(name)
    return entry.requires if isinstance(entry, _Lazy) else None


def install_extra(name: str) -> str | None:
    """The extra of devrng that installs what backend ``name`` needs, if it names one."""
    entry = _entries.get(name)
    return entry.extra if isinstance(entry, _Lazy) else None


def install_command(name: str) -> str | None:
    """The pip command that installs what backend ``name`` needs, if it needs a package."""
    entry = _entries.get(name)
    if not isinstance(entry, _Lazy) or entry.requires is None:
        return None
    return install_hint(entry.requires, entry.extra)


def package_installed(module: str) -> bool:
    """Whether ``module`` could be imported, without importing it."""
    try:
        return module in sys.modules or importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
