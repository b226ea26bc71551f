"""``deterministic()``: every reproducibility switch in one call, from one table of settings.

Each setting is a small object that knows its name, what it does, whether this
torch has it, how to read it, what ``deterministic()`` wants it to be, and how
to set it (pushing how to undo that onto an ``Undo`` stack first). Applying,
restoring and reporting are three loops over ``settings``. Device backends add their own switch through
the optional ``DeterminismSwitch`` members (see ``devrng._backends.registry``).

Handles nest as a stack: restoring a handle first restores every handle
applied after it that is still active, newest first, so that once all are
restored -- in any order -- every setting is back where the program had it.
"""

from __future__ import annotations

import functools
import inspect
import os
import re
import sys
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple

import torch
import torch.utils.deterministic

from devrng._backends.registry import backend_names, loaded_backend
from devrng._base.bytecode import with_of_a_name
from devrng._base.errors import DevRNGError, check_flags, warn_and_log
from devrng._base.lazy import imported
from devrng._base.locks import ForkSafeLock
from devrng._base.seeds import check_seed
from devrng._base.sigint import deliver, guard
from devrng._generators.seeding import reseed
from devrng._generators.undo import Undo, put_env
from devrng._training.workers import dataloader_kwargs

__all__ = ["CUBLAS_DETERMINISTIC", "DeterministicHandle", "Setting", "current_settings", "deterministic",
           "settings"]

_CUBLAS = "CUBLAS_WORKSPACE_CONFIG"
# The two values with which cuBLAS picks the same reduction order every time
# (torch checks for exactly these before a cuBLAS op in deterministic mode).
CUBLAS_DETERMINISTIC = (":4096:8", ":16:8")
_CUBLAS_FORMAT = re.compile(r"(:\d+:\d+)+")
_INDUCTOR_ENV = "TORCHINDUCTOR_DETERMINISTIC"
_INDUCTOR_MODULE = "torch._inductor.config"


class Options(NamedTuple):
    """The arguments of ``deterministic()`` that decide the settings' targets."""

    warn_only: bool
    fill_uninitialized_memory: bool
    cublas_workspace_config: str | None


# --------------------------------------------------------------------------- settings
class Setting:
    """One global setting: its name, a note, how to read it and how to set it.

    Subclasses override ``read``, ``target`` and ``put``, or
    ``apply`` when setting it is more than a write and its inverse.
    ``apply`` pushes what puts the current value back onto the undo stack
    before it changes anything, so that an interrupt right after the change
    still finds it there.
    """

    name: str = ""
    note: str = ""

    def available(self) -> bool:
        return True

    def read(self) -> Any:
        raise NotImplementedError

    def target(self, options: Options) -> Any:
        raise NotImplementedError

    def put(self, value: Any) -> None:
        raise NotImplementedError

    def apply(self, value: Any, undo: Undo) -> None:
        """Set ``value``, having pushed onto ``undo`` what puts the current value back."""
        undo.push(self.name, self.put, self.read())
        self.put(value)

    def entry(self, options: Options) -> dict[str, Any]:
        """This setting in a report: value now, availability, target, value before, note."""
        available = self.available()
        return {"value": self.read() if available else None, "available": available,
                "target": self.target(options) if available else None, "previous": None,
                "note": self.note}


class _Flag(Setting):
    """A boolean attribute of a torch object (``torch.backends.cudnn.benchmark``)."""

    def __init__(self, name: str, owner: Callable[[], Any], attr: str, want: Any,
                 note: str) -> None:
        self.name, self.note = name, note
        self._owner, self._attr, self._want = owner, attr, want

    def available(self) -> bool:
        return hasattr(self._owner(), self._attr)

    def read(self) -> bool:
        return bool(getattr(self._owner(), self._attr))

    def put(self, value: Any) -> None:
        setattr(self._owner(), self._attr, bool(value))

    def target(self, options: Options) -> Any:
        return self._want(options) if callable(self._want) else self._want


class _Algorithms(Setting):
    """``torch.use_deterministic_algorithms``: the mode and ``warn_only`` are one setting."""

    name = "torch.use_deterministic_algorithms"
    note = ("(enabled, warn_only): ops with a deterministic variant use it; the others raise "
            "(or warn, with warn_only)")

    def read(self) -> tuple[bool, bool]:
        return (bool(torch.are_deterministic_algorithms_enabled()),
                bool(torch.is_deterministic_algorithms_warn_only_enabled()))

    def put(self, value: tuple[bool, bool]) -> None:
        # torch 2.13's use_deterministic_algorithms (not 2.9's) also imports inductor's
        # config (seconds, ~800 modules) to set its flag; devrng sets that flag through
        # its own setting, so it calls the setter underneath.
        torch._C._set_deterministic_algorithms(value[0], warn_only=value[1])

    def target(self, options: Options) -> tuple[bool, bool]:
        return (True, options.warn_only)


class _Inductor(Setting):
    """``torch._inductor.config.deterministic``, or the variable it reads when imported."""

    name = "torch._inductor.config.deterministic"
    note = ("torch.compile (inductor) skips on-device benchmarking that could change numerics; "
            "read from TORCHINDUCTOR_DETERMINISTIC when inductor is first imported")

    def available(self) -> bool:
        return _inductor_has_deterministic()

    def read(self) -> bool:
        module = imported(_INDUCTOR_MODULE)
        if module is not None:
            return bool(getattr(module, "deterministic", False))
        return os.environ.get(_INDUCTOR_ENV) == "1"

    def target(self, options: Options) -> bool:
        return True

    def apply(self, value: Any, undo: Undo) -> None:
        module = imported(_INDUCTOR_MODULE)
        if module is not None:
            undo.push(self.name, setattr, module, "deterministic",
                      bool(getattr(module, "deterministic", False)))
            setattr(module, "deterministic", bool(value))  # noqa: B010
            return
        # Not imported yet: inductor reads the variable when it is.
        undo.push(self.name, _undo_inductor_module, os.environ.get(_INDUCTOR_ENV))
        undo.set_env(_INDUCTOR_ENV, "1" if value else "0")


def _undo_inductor_module(previous_env: str | None) -> None:
    loaded = imported(_INDUCTOR_MODULE)
    if loaded is not None and hasattr(loaded, "deterministic"):
        # Imported inside the block, so it read our value: put its old one back.
        setattr(loaded, "deterministic", previous_env == "1")  # noqa: B010


class _Cublas(Setting):
    """``CUBLAS_WORKSPACE_CONFIG``: read by cuBLAS once, when CUDA starts."""

    name = _CUBLAS

    @property
    def note(self) -> str:  # type: ignore[override]
        started = "already" if _cuda_initialized() else "not"
        return (f"read by cuBLAS when CUDA starts; set it before the first CUDA call; CUDA is "
                f"{started} initialised here")

    def read(self) -> str | None:
        return os.environ.get(_CUBLAS)

    def target(self, options: Options) -> str | None:
        return options.cublas_workspace_config

    def apply(self, value: Any, undo: Undo) -> None:
        previous = os.environ.get(_CUBLAS)
        # Once CUDA runs, a new value would only silence torch's own check while
        # cuBLAS keeps the old one: leave it as it is (deterministic() warned).
        if value is None or _cuda_initialized() or previous == value:
            return
        undo.set_env(_CUBLAS, value)


class _BackendSwitch(Setting):
    """A device backend's own switch (its optional ``DeterminismSwitch`` members)."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend
        self.name = f"backend.{backend.name}.deterministic"
        self.note = str(getattr(backend, "deterministic_note", "the backend's own switch"))

    def available(self) -> bool:
        return self.read() is not None

    def read(self) -> bool | None:
        try:
            return self._backend.get_deterministic()  # type: ignore[no-any-return]
        except Exception:  # a broken third-party hook must not break the report
            return None

    def target(self, options: Options) -> bool:
        return True

    def apply(self, value: Any, undo: Undo) -> None:
        env_before = dict(os.environ)
        changed: list[list[str]] = []  # the variables the switch set, once it has returned
        undo.push(self.name, self._undo, self.read(), env_before, changed)
        self._backend.set_deterministic(bool(value))
        changed.append([k for k in set(env_before) | set(os.environ)
                        if env_before.get(k) != os.environ.get(k)])

    def _undo(self, previous: bool | None, env_before: dict[str, str],
              changed: list[list[str]]) -> None:
        if previous is not None:
            self._backend.set_deterministic(previous)
        # Interrupted before the switch returned: compare every variable (no user code
        # ran since, so every difference is the switch's).
        keys = changed[0] if changed else set(env_before) | set(os.environ)
        for key in keys:  # put variables back byte for byte
            if env_before.get(key) != os.environ.get(key):
                put_env(key, env_before.get(key))


def _cudnn() -> Any:
    return getattr(torch.backends, "cudnn", None)


def _mkldnn() -> Any:
    return getattr(torch.backends, "mkldnn", None)


def _fill_owner() -> Any:
    return torch.utils.deterministic


_TORCH_SETTINGS: tuple[Setting, ...] = (
    _Flag("torch.backends.cudnn.benchmark", _cudnn, "benchmark", False,
          "off: cuDNN does not time algorithms and pick the fastest, which can differ from run "
          "to run"),
    _Flag("torch.backends.cudnn.deterministic", _cudnn, "deterministic", True,
          "cuDNN convolutions use deterministic algorithms only"),
    _Algorithms(),
    _Flag("torch.utils.deterministic.fill_uninitialized_memory", _fill_owner,
          "fill_uninitialized_memory", lambda o: o.fill_uninitialized_memory,
          "torch.empty and friends fill new memory with NaN / the largest int, when "
          "deterministic algorithms are on"),
    _Flag("torch.backends.mkldnn.deterministic", _mkldnn, "deterministic", True,
          "oneDNN primitives (XPU conv, deconv, matmul) ask oneDNN for deterministic kernels"),
    _Inductor(),
    _Cublas(),
)


def settings() -> list[Setting]:
    """Every setting ``deterministic()`` manages: torch's, then each loaded backend's own switch."""
    out = list(_TORCH_SETTINGS)
    for name in backend_names():
        backend = loaded_backend(name)
        if backend is not None and callable(getattr(backend, "set_deterministic", None)):
            out.append(_BackendSwitch(backend))
    return out


@functools.lru_cache(maxsize=1)
def _inductor_has_deterministic() -> bool:
    # Importing inductor's config costs seconds and hundreds of modules, so
    # look for the switch in its source instead.
    module = imported(_INDUCTOR_MODULE)
    if module is not None:
        return hasattr(module, "deterministic")
    path = Path(torch.__file__).parent / "_inductor" / "config.py"
    try:
        return _INDUCTOR_ENV in path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False


def _cuda_initialized() -> bool:
    cuda = getattr(torch, "cuda", None)
    check = getattr(cuda, "is_initialized", None)
    try:
        return bool(check()) if check is not None else False
    except Exception:
        return False


def _default_options() -> Options:
    """``deterministic()``'s own defaults, read from its signature (one place for them)."""
    params = inspect.signature(deterministic).parameters
    return Options(*(params[name].default for name in Options._fields))


def current_settings() -> dict[str, dict[str, Any]]:
    """Every determinism setting, read without changing anything.

    Each entry maps a setting's name to ``{"value", "available", "target",
    "previous", "note"}``: its current value, whether this torch has it, what
    ``deterministic()`` with default arguments sets it to, ``None`` for
    ``previous`` (only a handle knows it), and a one-line explanation.

    Examples:
        >>> current_settings()["torch.backends.cudnn.deterministic"]["target"]
        True
    """
    options = _default_options()
    return {s.name: s.entry(options) for s in settings()}


# --------------------------------------------------------------------------- the handle
_stack_lock = ForkSafeLock()
_active: list[DeterministicHandle] = []  # applied and not yet restored, oldest first
_made = threading.local()  # .handle: the last handle this thread activated


class DeterministicHandle:
    """What ``deterministic()`` returns: the settings it applied and how to undo them.

    ``with deterministic(...):`` restores everything it changed at the block's
    exit, also when the body raises. A handle kept from a bare call
    (``handle = deterministic()``) holds its settings until ``handle.restore()``:
    a later ``with handle:`` ends with them as they were when it started, on.
    Entries count: the outermost one (the bare call, or the ``with`` that made
    the handle) restores. Handles nest as a stack: restoring one first restores
    the handles applied after it that are still active, so restoring in any
    order ends where the program started.

    Examples:
        >>> with devrng.deterministic(seed=0) as handle:
        ...     kwargs = handle.dataloader_kwargs()
        >>> sorted(kwargs)
        ['generator', 'worker_init_fn']
    """

    def __init__(self, seed: int | None, options: Options) -> None:
        """Made by ``devrng.deterministic()``, which applies it."""
        self.seed = seed
        self.options = options
        self._undo = Undo("deterministic()", kind="setting", wrap=False)
        self._previous: dict[str, Any] = {}
        self._depth = 0
        self._active = False
        self._apply()

    @property
    def active(self) -> bool:
        """Whether the settings are applied (True until ``restore``)."""
        return self._active

    # -- applying ---------------------------------------------------------------
    def _apply(self) -> None:
        self._check_cublas()  # may raise: before anything changes
        undo = self._undo
        with _stack_lock:
            try:
                # Pushed first, so run last when undone: the handle leaves the stack of
                # active handles only once all its settings are back.
                undo.push("the handle", _deactivate, self)
                for setting in settings():
                    if setting.available():
                        self._previous[setting.name] = setting.read()
                        setting.apply(setting.target(self.options), undo)
                if self.seed is not None:
                    reseed(undo, self.seed)
                _active.append(self)
                self._active = True
                _made.handle = self
            except BaseException as err:
                undo.roll_back(err)
                self._previous.clear()
                raise

    def _check_cublas(self) -> None:
        want = self.options.cublas_workspace_config
        if want is None or not _cuda_initialized():
            return
        have = os.environ.get(_CUBLAS)
        if have == want:
            return
        shown = "not set" if have is None else f"{have!r}"
        fix = (f"Set it before the first CUDA call: call devrng.deterministic() at the very start "
               f"of the program, or start it with the variable in the environment, as in "
               f"`{_CUBLAS}={want} python train.py`.")
        if have in CUBLAS_DETERMINISTIC:
            warnings.warn(
                f"{_CUBLAS} is {shown}, not {want!r}, and CUDA is already initialised, so cuBLAS "
                f"keeps {have!r}; that value is deterministic too, so results stay reproducible. "
                + fix, UserWarning, stacklevel=4)
            return
        message = (
            f"{_CUBLAS} is {shown} and CUDA is already initialised in this process, so cuBLAS "
            f"cannot pick up {want!r} any more and CUDA matrix products may differ from run to "
            f"run. {fix}"
        )
        if not self.options.warn_only:
            raise DevRNGError(message + " Or pass warn_only=True to go on with a warning.")
        warnings.warn(message, UserWarning, stacklevel=4)

    # -- restoring --------------------------------------------------------------
    @guard
    def restore(self) -> None:
        """Put back every flag, environment variable and RNG state this handle changed.

        Handles applied after this one and still active are restored first,
        newest first, with a ``DevRNGWarning`` naming them: code that counts on
        them runs without their settings from then on. Restoring a handle twice
        does nothing the second time.

        Examples:
            >>> handle = devrng.deterministic()
            >>> handle.restore()
            >>> handle.active
            False
        """
        shown = repr(self)
        try:
            try:
                failures, inner = self._restore()
            except BaseException as err:  # interrupted: finish the job (idempotent), go on
                if isinstance(err, Exception):
                    raise
                self._restore()
                raise
            if inner:
                # Its owner (a with-block, a TrainingRNG) still counts on it: say so, once.
                warn_and_log(
                    f"Restoring {shown} first restored {len(inner)} handle(s) applied after "
                    f"it and still active ({', '.join(inner)}): their settings are off from "
                    "here on. Restore handles newest first (with-blocks do) to keep each "
                    "one's settings while its code runs.", stacklevel=2)
            if failures:
                raise DevRNGError(
                    "deterministic() could not restore " + "; ".join(failures)
                    + ". The other settings were restored."
                )
        finally:
            deliver()

    def _restore(self) -> tuple[list[str], list[str]]:
        """Restore this handle and those applied after it: (failures, the others' reprs)."""
        failures: list[str] = []
        inner: list[str] = []
        with _stack_lock:
            while self._active and _active:
                newest = _active[-1]
                if newest is not self:
                    inner.append(repr(newest))
                try:
                    newest._undo.run()  # its last entry takes it off the stack
                except DevRNGError as err:  # everything else of it was put back
                    failures.append(str(err).removeprefix("deterministic() could not restore "))
                _deactivate(newest)
        return failures, inner

    @guard
    def __enter__(self) -> DeterministicHandle:
        try:
            if not self._active:  # re-entering a handle that was restored
                self._apply()
            elif self._depth == 0 and with_of_a_name(sys._getframe(1)):
                self._depth = 1  # `with handle:` after a bare call: the call's entry is outermost
            self._depth += 1
            deliver()  # a Ctrl-C noted meanwhile is raised here, and undone below
            return self
        except BaseException:
            self.restore()  # the block is not entered: leave nothing applied
            deliver()
            raise

    @guard
    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            if self._depth > 1:
                self._depth -= 1
                return
            self.restore()
        except BaseException as err:
            if not isinstance(err, Exception):
                self.restore()  # interrupted on the way out: leave nothing applied
            raise
        finally:
            deliver()

    # -- DataLoader and report -----------------------------------------------------
    def dataloader_kwargs(self) -> dict[str, Any]:
        """``generator`` and ``worker_init_fn`` for ``torch.utils.data.DataLoader``.

        The generator is seeded with the handle's seed (or, without one, with a
        seed drawn from torch's CPU generator, so an earlier ``manual_seed``
        fixes it); it decides shuffling and each epoch's worker seeds.

        Returns:
            ``{"generator": ..., "worker_init_fn": ...}`` (the initialiser
            calls ``seed_worker``): pass it as ``DataLoader(..., **kwargs)``.

        Examples:
            >>> with devrng.deterministic(seed=0) as handle:
            ...     loader = torch.utils.data.DataLoader(range(8), shuffle=True,
            ...                                          **handle.dataloader_kwargs())
            ...     first = [int(x) for x in next(iter(loader))]
            >>> len(first)
            1
        """
        return dataloader_kwargs(self.seed)

    def report(self) -> dict[str, dict[str, Any]]:
        """Every setting with its current value, availability, target and value before.

        Returns:
            Setting name -> ``{"value", "available", "target", "previous",
            "note"}``; ``devrng doctor`` prints the same table.

        Examples:
            >>> with devrng.deterministic(seed=0) as handle:
            ...     entry = handle.report()["torch.backends.cudnn.deterministic"]
            >>> entry["value"], entry["target"]
            (True, True)
        """
        out = {s.name: s.entry(self.options) for s in settings()}
        for name, previous in self._previous.items():
            if name in out:
                out[name]["previous"] = previous
        out["seed"] = {"value": self.seed, "available": True, "target": self.seed,
                       "previous": None, "note": "devrng.manual_seed(seed) when given"}
        return out

    def __repr__(self) -> str:
        state = "active" if self._active else "restored"
        return f"<devrng.deterministic seed={self.seed!r} warn_only={self.options.warn_only} {state}>"


def _deactivate(handle: DeterministicHandle) -> None:
    """Take ``handle`` off the stack of active handles (nothing if it is not there)."""
    with _stack_lock:
        if handle in _active:
            _active.remove(handle)
        handle._active = False
        handle._depth = 0
        handle._previous.clear()


@guard
def deterministic(seed: int | None = None, *, warn_only: bool = False,
                  cublas_workspace_config: str | None = ":4096:8",
                  fill_uninitialized_memory: bool = True) -> DeterministicHandle:
    """Turn on every reproducibility switch now; as a context manager, undo them on exit.

    Sets cuDNN benchmark off and deterministic on, ``torch.use_deterministic_algorithms(True,
    warn_only=warn_only)``, ``torch.utils.deterministic.fill_uninitialized_memory``, oneDNN's
    deterministic flag, inductor's deterministic mode, ``CUBLAS_WORKSPACE_CONFIG`` (unless
    ``None``), each loaded backend's own switch, and, with ``seed``, ``devrng.manual_seed(seed)``.
    If CUDA already runs without a deterministic ``CUBLAS_WORKSPACE_CONFIG``, it raises
    ``DevRNGError`` (with ``warn_only=True``: warns) and changes nothing.

    Args:
        seed: Also call ``devrng.manual_seed(seed)`` (an int in ``[0, 2**64)``).
        warn_only: Passed to ``torch.use_deterministic_algorithms``: an op
            without a deterministic implementation warns instead of raising.
        cublas_workspace_config: The value for ``CUBLAS_WORKSPACE_CONFIG``
            (``":4096:8"`` or ``":16:8"`` are deterministic); ``None`` leaves
            the variable alone.
        fill_uninitialized_memory: Fill uninitialised memory (``torch.empty``)
            with a known value, as torch's deterministic mode can.

    Returns:
        A ``DeterministicHandle``: a context manager that restores every
        setting on exit, with ``dataloader_kwargs()`` and ``report()``.

    Raises:
        TypeError: ``seed`` is not an int (a bool is refused: it is not a
            switch), or a flag is not ``True`` / ``False``.
        ValueError: ``seed`` is out of range, or ``cublas_workspace_config``
            is not a ``":SIZE:COUNT"`` string.
        DevRNGError: CUDA already runs with another ``CUBLAS_WORKSPACE_CONFIG``
            (and ``warn_only=False``); nothing was changed.

    Examples:
        >>> with devrng.deterministic(seed=0):     # for one block; or call it at program start
        ...     on = torch.are_deterministic_algorithms_enabled()
        >>> on, torch.are_deterministic_algorithms_enabled()
        (True, False)
    """
    if isinstance(seed, bool):
        raise TypeError(
            f"deterministic()'s first argument is the seed, not a switch: got {seed!r}. Call "
            "devrng.deterministic() to turn determinism on, or deterministic(seed=0) to also seed."
        )
    if seed is not None:
        seed = check_seed(seed)
    check_flags(warn_only=warn_only, fill_uninitialized_memory=fill_uninitialized_memory)
    if cublas_workspace_config is not None and (
            not isinstance(cublas_workspace_config, str)
            or not _CUBLAS_FORMAT.fullmatch(cublas_workspace_config)):
        raise ValueError(
            f"cublas_workspace_config={cublas_workspace_config!r} is not a cuBLAS workspace "
            "setting; pass ':4096:8' or ':16:8' (the deterministic ones), another ':SIZE:COUNT' "
            "string (no spaces or newlines), or None to leave CUBLAS_WORKSPACE_CONFIG alone."
        )
    options = Options(warn_only, fill_uninitialized_memory, cublas_workspace_config)
    _made.handle = None
    try:
        made = DeterministicHandle(seed, options)
        deliver()  # a Ctrl-C noted while applying is raised here, and undone below
        return made
    except BaseException:
        # An interrupt after the handle was applied, before the caller got it: undo it.
        handle = _made.handle
        if handle is not None:
            handle.restore()
        deliver()
        raise
