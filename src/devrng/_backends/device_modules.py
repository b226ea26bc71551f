"""Device modules that give torch's own RNG sites a way into devrng backends.

torch reaches a device's RNG through ``getattr(torch, device_type)``:
``torch.utils.checkpoint`` (``_initialized``, ``device(i)``, ``get_rng_state()``,
``set_rng_state(state)``), ``torch.random.fork_rng`` (``device_count()``,
``get_rng_state(i)``, ``set_rng_state(state, i)``), pipelining schedules (through
``fork_rng``) and the DTensor RNG tracker. torch has no such module for XLA, so
those sites crash with ``AttributeError: module 'torch' has no attribute 'xla'``.

``register_all`` (called by ``devrng.patch_torch()``) registers a
``DeviceRNGModule`` for every devrng backend whose device type torch has
no module for; ``unregister_all`` removes them. States handed to torch are
tensors that carry the full value: XLA's unsigned 64-bit seed travels as eight
little-endian bytes, since it overflows an ``int64``.

One module torch already has is replaced on purpose: torchax's placeholder
for device type ``jax`` (``torchax.device_module``), whose ``get_rng_state``
returns ``[]`` and whose ``set_rng_state`` does nothing. With it,
``torch.utils.checkpoint`` silently recomputes different dropout masks. The
replacement keeps every other member of torchax's module and is swapped back
by ``unregister_all``. Any other existing module is never touched.
"""

from __future__ import annotations

import sys
import threading
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from devrng._backends.registry import (
    Backend,
    backend_names,
    current_index,
    device_count,
    get_backend,
    is_initialized,
    package_installed,
    package_loaded,
    registry,
    requirement,
)
from devrng._backends.torch_module import DeviceModuleBackend
from devrng._base.locks import ForkSafeLock
from devrng._base.plain import tensor_to_uint64, uint64_to_tensor
from devrng._base.seeds import MASK64, check_seed

__all__ = ["DeviceRNGModule", "register_all", "registered_types", "unregister_all"]

_lock = ForkSafeLock()
# device type -> (our module, the module torch had before us or None)
_installed: dict[str, tuple[DeviceRNGModule, types.ModuleType | None]] = {}


# --- states as tensors ------------------------------------------------------------------------


class _Codec:
    """How one backend's state travels through torch as a tensor.

    A backend with ``state_to_tensor`` / ``tensor_to_state`` says itself how
    (XLA, torchax); otherwise tensor states pass as they are and int states
    travel as eight little-endian bytes.
    """

    __slots__ = ("_backend", "_int_states", "_methods", "_probe")

    def __init__(self, backend: Any, probe: Callable[[], Any]) -> None:
        self._backend = backend
        self._probe = probe
        self._methods = callable(getattr(backend, "state_to_tensor", None)) and callable(
            getattr(backend, "tensor_to_state", None))
        self._int_states: bool | None = None

    def _ints(self) -> bool:
        if self._int_states is None:
            self._int_states = _is_int(self._probe())
        return self._int_states

    def encode(self, state: Any, where: str) -> torch.Tensor:
        if self._methods:
            return self._backend.state_to_tensor(state)  # type: ignore[no-any-return]
        if isinstance(state, torch.Tensor):
            self._int_states = False
            return state
        if _is_int(state):
            self._int_states = True
            return uint64_to_tensor(int(state))
        raise TypeError(
            f"{where}: the backend returned a {type(state).__name__} state, which torch's RNG "
            "sites cannot carry; they need tensors. Give the backend state_to_tensor(state) and "
            "tensor_to_state(tensor) methods, or return a tensor or an int."
        )

    def decode(self, tensor: Any, where: str) -> Any:
        if self._methods:
            return self._backend.tensor_to_state(tensor)
        if self._ints():
            return tensor_to_uint64(tensor, where)
        return tensor


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# --- the module -------------------------------------------------------------------------------


class DeviceRNGModule(types.ModuleType):
    """``torch.<type>`` for a device type torch has no module for, backed by a devrng backend.

    Offers what torch's RNG sites use: ``get_rng_state(device=None)``,
    ``set_rng_state(new_state, device=None)``, ``get_rng_state_all()``,
    ``set_rng_state_all(states)``, ``manual_seed``, ``manual_seed_all``,
    ``device_count()``, ``current_device()``, ``device(i)`` (a context
    manager), ``_initialized``, ``is_initialized()`` and ``is_available()``.
    Members it does not define are looked up on ``fallback`` (the module
    torch had before, if any).

    Examples:
        >>> import torch_xla
        >>> devrng.patch_torch()
        >>> state = torch.xla.get_rng_state(0)   # the 64-bit seed as 8 bytes
        >>> state.dtype, tuple(state.shape)
        (torch.uint8, (8,))
    """

    def __init__(self, device_type: str, fallback: types.ModuleType | None = None) -> None:
        super().__init__(f"torch.{device_type}", f"devrng's RNG module for device type {device_type!r}.")
        self.device_type = device_type
        self._fallback = fallback
        self._local = threading.local()
        self._codec: _Codec | None = None

    def __getattr__(self, name: str) -> Any:
        # Only called for names this module lacks: hand over to the module we replaced.
        fallback = self.__dict__.get("_fallback")
        if fallback is not None and not name.startswith("__"):
            return getattr(fallback, name)
        raise AttributeError(
            f"module 'torch.{self.__dict__.get('device_type', '?')}' (registered by devrng) has no "
            f"attribute {name!r}."
        )

    def __repr__(self) -> str:
        return f"<devrng RNG module torch.{self.device_type}>"

    # -- plumbing

    @property
    def backend(self) -> Backend:
        """The devrng backend, resolved on first use (so torch_xla is imported only then)."""
        return get_backend(self.device_type)

    def _get_codec(self) -> _Codec:
        if self._codec is None:
            backend = self.backend
            self._codec = _Codec(backend, lambda: backend.get_rng_state(self.current_device()))
        return self._codec

    def _index(self, device: Any, where: str) -> int:
        """A device index from None / int / "xla:1" / torch.device; -1 and None mean current."""
        if device is None:
            return self.current_device()
        if isinstance(device, (str, torch.device)):
            try:
                d = torch.device(device)
            except (RuntimeError, ValueError) as err:
                raise ValueError(
                    f"{where} got device {device!r}, which is not a device; pass an index, "
                    f"'{self.device_type}:N' or a torch.device of type {self.device_type!r}."
                ) from err
            if d.type != self.device_type:
                raise ValueError(
                    f"{where} got device {device!r} of type {d.type!r}; torch.{self.device_type} "
                    f"only handles devices of type {self.device_type!r}."
                )
            if d.index is None:
                return self.current_device()
            device = d.index
        elif isinstance(device, bool) or not isinstance(device, int):
            raise TypeError(
                f"{where} got {device!r} (a {type(device).__name__}) as device; pass an int index, "
                f"'{self.device_type}:N', a torch.device or None for the current device."
            )
        elif device < 0:  # torch.cuda.device(-1) and Tensor.get_device() == -1: the current device
            return self.current_device()
        count = self.device_count()
        if device >= count:
            raise ValueError(
                f"{where} got device index {device}, but this process has "
                + (f"{count} {self.device_type} device(s), indices 0 to {count - 1}."
                   if count else f"no {self.device_type} device.")
            )
        return int(device)

    # -- what torch's sites call

    def is_available(self) -> bool:
        """Whether the backend's device is usable (False if its package is not loaded)."""
        if not package_loaded(self.device_type):
            return False
        try:
            return bool(self.backend.is_available())
        except Exception:
            return False

    def is_initialized(self) -> bool:
        """Whether the device runtime is up; never starts it (nothing to save before that)."""
        if not package_loaded(self.device_type):
            return False  # nobody imported the device's package: no tensor of this type exists
        try:
            return is_initialized(self.backend)
        except Exception:
            return False

    @property
    def _initialized(self) -> bool:
        # torch.utils.checkpoint saves and restores device state only when this is true;
        # without it the recomputation draws a different dropout mask.
        return self.is_initialized()

    def device_count(self) -> int:
        """Number of devices of this type."""
        return device_count(self.backend) if self.is_available() else 0

    def current_device(self) -> int:
        """The innermost ``device(i)`` context's index, else the backend's current device."""
        stack: list[int] | None = getattr(self._local, "stack", None)
        if stack:
            return stack[-1]
        return current_index(self.backend)

    def device(self, device: Any) -> _DeviceContext:
        """Context manager: ``get_rng_state()`` / ``set_rng_state(s)`` without a device use ``device``.

        It changes nothing else (not the backend's default device).
        """
        return _DeviceContext(self, device)

    def get_rng_state(self, device: Any = None) -> torch.Tensor:
        """The RNG state of ``device`` (default: current) as a CPU tensor."""
        where = f"torch.{self.device_type}.get_rng_state"
        index = self._index(device, where)
        return self._get_codec().encode(self.backend.get_rng_state(index), where)

    def set_rng_state(self, new_state: Any, device: Any = None) -> None:
        """Set ``device``'s (default: current) RNG state from a ``get_rng_state`` tensor."""
        where = f"torch.{self.device_type}.set_rng_state"
        index = self._index(device, where)
        self.backend.set_rng_state(self._get_codec().decode(new_state, where), index)

    def get_rng_state_all(self) -> list[torch.Tensor]:
        """Every device's RNG state, by index."""
        return [self.get_rng_state(i) for i in range(self.device_count())]

    def set_rng_state_all(self, new_states: Sequence[Any]) -> None:
        """Set every device's RNG state from ``get_rng_state_all()``'s list."""
        count = self.device_count()
        if len(new_states) != count:
            raise ValueError(
                f"torch.{self.device_type}.set_rng_state_all got {len(new_states)} state(s) for "
                f"{count} {self.device_type} device(s); pass one state per device."
            )
        for index, state in enumerate(new_states):
            self.set_rng_state(state, index)

    def manual_seed(self, seed: int) -> None:
        """Seed the current device (XLA: its seed becomes ``seed``)."""
        value = _torch_seed(seed, f"torch.{self.device_type}.manual_seed")
        seed_one = getattr(self.backend, "manual_seed_device", None)
        if seed_one is not None:
            seed_one(value, self.current_device())
        elif self.device_count() <= 1:
            self.backend.manual_seed(value)
        else:
            raise NotImplementedError(
                f"The devrng backend for {self.device_type!r} can only seed all its devices at "
                f"once; call torch.{self.device_type}.manual_seed_all({value}) instead."
            )

    def manual_seed_all(self, seed: int) -> None:
        """Seed every device of this type (negative seeds wrap like ``torch.manual_seed``)."""
        self.backend.manual_seed(_torch_seed(seed, f"torch.{self.device_type}.manual_seed_all"))


def _torch_seed(seed: object, where: str) -> int:
    """A seed as ``torch.manual_seed`` takes it: an int in [-2**63, 2**64), negatives wrapped."""
    if isinstance(seed, int) and not isinstance(seed, bool):
        if -(1 << 63) <= seed <= MASK64:
            return seed & MASK64
        raise ValueError(
            f"{where} got the seed {seed}, which is out of range; torch seeds are ints in "
            "[-2**63, 2**64) (negative ones wrap around)."
        )
    return check_seed(seed, f"{where}'s seed")


class _DeviceContext:
    """``with torch.<type>.device(i):`` selects the index RNG calls without a device use."""

    __slots__ = ("_index", "_module")

    def __init__(self, module: DeviceRNGModule, device: Any) -> None:
        self._module = module
        self._index = module._index(device, f"torch.{module.device_type}.device")

    def __enter__(self) -> None:
        local = self._module._local
        if not hasattr(local, "stack"):
            local.stack = []
        local.stack.append(self._index)

    def __exit__(self, *exc_info: object) -> None:
        self._module._local.stack.pop()


# --- registration -----------------------------------------------------------------------------


def _is_torchax_placeholder(module: object) -> bool:
    # torchax registers a module whose get_rng_state() returns [] and whose set_rng_state
    # does nothing; checkpointing through it is silently wrong. Only that exact module is
    # replaced, and only while it still has no real RNG state.
    return module is not None and module is sys.modules.get("torchax.device_module")


def _candidates() -> Iterator[str]:
    """Backend names worth a module: package installed and a device type torch knows."""
    for name in backend_names():
        if name in ("cpu", "meta"):
            continue
        entry = registry.get(name)
        if entry is None or isinstance(entry, DeviceModuleBackend):
            # A renamed PrivateUse1 device without a backend of its own keeps torch's module;
            # a backend that reads torch.<name> must not get a module that calls itself.
            continue
        required = requirement(name)
        if required is not None and not package_installed(required):
            continue
        yield name


def _valid_device_type(name: str) -> bool:
    try:
        return torch.device(name).type == name
    except (RuntimeError, ValueError):
        return False  # e.g. 'jax' before torchax renames PrivateUse1


def _clear_torch_caches() -> None:
    # torch.get_device_module is functools.cache'd: a lookup made while our module was
    # installed (or before we replaced torchax's) would otherwise outlive the change.
    clear = getattr(torch.get_device_module, "cache_clear", None)
    if clear is not None:
        clear()


def register_all() -> list[str]:
    """Register a ``DeviceRNGModule`` for every devrng backend torch has no module for.

    Returns the device types registered by this call. Idempotent.

    Examples:
        >>> import torch_xla
        >>> _ = register_all()
        >>> "xla" in registered_types()
        True
    """
    added: list[str] = []
    with _lock:
        for name in _candidates():
            if name in _installed or not _valid_device_type(name):
                continue
            existing = getattr(torch, name, None)
            if existing is not None and not _is_torchax_placeholder(existing):
                continue  # torch (or a plugin) has a real module: never touch it
            module = DeviceRNGModule(name, fallback=existing)
            if existing is None:
                torch._register_device_module(name, module)  # type: ignore[no-untyped-call]
            else:
                # _register_device_module refuses a type that has a module already.
                setattr(torch, name, module)
                sys.modules[f"torch.{name}"] = module
            _installed[name] = (module, existing)
            added.append(name)
        if added:
            _clear_torch_caches()
    return added


def unregister_all() -> list[str]:
    """Remove every module ``register_all`` added; put back any it replaced. Idempotent.

    Examples:
        >>> _ = unregister_all()
        >>> registered_types()
        ()
    """
    removed: list[str] = []
    with _lock:
        for name, (module, previous) in list(_installed.items()):
            del _installed[name]
            removed.append(name)
            key = f"torch.{name}"
            if getattr(torch, name, None) is module:
                if previous is None:
                    delattr(torch, name)
                else:
                    setattr(torch, name, previous)
            if sys.modules.get(key) is module:
                if previous is None:
                    del sys.modules[key]
                else:
                    sys.modules[key] = previous
        if removed:
            _clear_torch_caches()
    return removed


def registered_types() -> tuple[str, ...]:
    """Device types that currently have a devrng module in torch."""
    with _lock:
        return tuple(_installed)
