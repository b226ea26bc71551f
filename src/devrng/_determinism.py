"""``deterministic()``: every reproducibility switch in one call, and DataLoader worker seeding.

Each switch is looked up in the installed torch before it is touched; one that
this torch lacks is reported as unavailable. Device backends may add their own
switches through two optional members, looked up with ``getattr``:

``get_deterministic() -> bool | None``
    the backend's switch, or ``None`` when it has none in this process;
``set_deterministic(flag) -> bool | None``
    turn it on or off and return the previous value (``None``: no switch here).
"""

from __future__ import annotations

import functools
import os
import random
import re
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

from devrng import _host
from devrng._errors import DevRNGError
from devrng._mix import MASK64, splitmix64
from devrng._registry import available_backends, backend_names, peek_backend
from devrng._state import RNGState, check_seed, get_rng_state, manual_seed, set_rng_state
from devrng.distributed import _env_rank, _rank_from_env

__all__ = ["DeterministicHandle", "current_settings", "deterministic", "seed_worker"]

_CUBLAS = "CUBLAS_WORKSPACE_CONFIG"
# The two values with which cuBLAS picks the same reduction order every time
# (torch checks for exactly these before a cuBLAS op in deterministic mode).
_CUBLAS_DETERMINISTIC = (":4096:8", ":16:8")
_CUBLAS_FORMAT = re.compile(r"^(:\d+:\d+)+$")
_INDUCTOR_ENV = "TORCHINDUCTOR_DETERMINISTIC"
_INDUCTOR_MODULE = "torch._inductor.config"

_NOTES = {
    "torch.backends.cudnn.benchmark": "off: cuDNN does not time algorithms and pick the fastest, "
    "which can differ from run to run",
    "torch.backends.cudnn.deterministic": "cuDNN convolutions use deterministic algorithms only",
    "torch.use_deterministic_algorithms": "(enabled, warn_only): ops with a deterministic variant "
    "use it; the others raise (or warn, with warn_only)",
    "torch.utils.deterministic.fill_uninitialized_memory": "torch.empty and friends fill new "
    "memory with NaN / the largest int, when deterministic algorithms are on",
    "torch.backends.mkldnn.deterministic": "oneDNN primitives (XPU conv, deconv, matmul) ask "
    "oneDNN for deterministic kernels",
    "torch._inductor.config.deterministic": "torch.compile (inductor) skips on-device "
    "benchmarking that could change numerics; read from TORCHINDUCTOR_DETERMINISTIC when "
    "inductor is first imported",
    _CUBLAS: "read by cuBLAS when CUDA starts; set it before the first CUDA call",
}


# --------------------------------------------------------------------------- switches
class _Switch:
    """One global setting: read it, write it, and whether this torch has it."""

    def __init__(self, name: str, getter: Callable[[], Any] | None,
                 setter: Callable[[Any], None] | None) -> None:
        self.name = name
        self.getter = getter
        self.setter = setter

    @property
    def available(self) -> bool:
        return self.getter is not None and self.setter is not None

    def get(self) -> Any:
        return None if self.getter is None else self.getter()

    def set(self, value: Any) -> None:
        assert self.setter is not None
        self.setter(value)


def _attr_switch(name: str, owner: Any, attr: str) -> _Switch:
    if owner is None or not hasattr(owner, attr):
        return _Switch(name, None, None)
    return _Switch(name, lambda: bool(getattr(owner, attr)),
                   lambda v: setattr(owner, attr, bool(v)))


def _cudnn() -> Any:
    return getattr(getattr(torch, "backends", None), "cudnn", None)


def _mkldnn() -> Any:
    return getattr(getattr(torch, "backends", None), "mkldnn", None)


def _fill_owner() -> Any:
    try:
        import torch.utils.deterministic as mod
    except ImportError:  # torch < 2.1
        return None
    return mod


def _algorithms_switch() -> _Switch:
    # Mode and warn_only are one setting in torch; the value is the pair.
    if not hasattr(torch, "use_deterministic_algorithms"):
        return _Switch("torch.use_deterministic_algorithms", None, None)

    def get() -> tuple[bool, bool]:
        warn = getattr(torch, "is_deterministic_algorithms_warn_only_enabled", lambda: False)
        return bool(torch.are_deterministic_algorithms_enabled()), bool(warn())

    def put(value: tuple[bool, bool]) -> None:
        # torch 2.13's use_deterministic_algorithms (not 2.9's) also imports inductor's
        # config (seconds, ~800 modules) to set its flag; devrng sets that flag
        # through its own switch, so go to the underlying setter when it exists.
        setter = getattr(torch._C, "_set_deterministic_algorithms", None)
        if setter is not None:
            setter(value[0], warn_only=value[1])
        else:
            torch.use_deterministic_algorithms(value[0], warn_only=value[1])

    return _Switch("torch.use_deterministic_algorithms", get, put)


@functools.lru_cache(maxsize=1)
def _inductor_has_deterministic() -> bool:
    # Importing inductor's config costs seconds and hundreds of modules, so
    # look for the switch in its source instead.
    module = sys.modules.get(_INDUCTOR_MODULE)
    if module is not None:
        return hasattr(module, "deterministic")
    path = Path(torch.__file__).parent / "_inductor" / "config.py"
    try:
        return _INDUCTOR_ENV in path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False


def _inductor_get() -> bool:
    module = sys.modules.get(_INDUCTOR_MODULE)
    if module is not None:
        return bool(getattr(module, "deterministic", False))
    return os.environ.get(_INDUCTOR_ENV) == "1"


def _set_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def _cuda_initialized() -> bool:
    cuda = getattr(torch, "cuda", None)
    check = getattr(cuda, "is_initialized", None)
    try:
        return bool(check()) if check is not None else False
    except Exception:
        return False


def _hook_backends() -> list[Any]:
    """Loaded backends that offer their own determinism switch."""
    out = []
    for name in backend_names():
        backend = peek_backend(name)
        if backend is not None and callable(getattr(backend, "set_deterministic", None)):
            out.append(backend)
    return out


def _entry(value: Any, available: bool, target: Any, note: str, previous: Any = None
           ) -> dict[str, Any]:
    return {"value": value, "available": available, "target": target, "previous": previous,
            "note": note}


def _torch_switches() -> list[_Switch]:
    cudnn, mkldnn = _cudnn(), _mkldnn()
    return [
        _attr_switch("torch.backends.cudnn.benchmark", cudnn, "benchmark"),
        _attr_switch("torch.backends.cudnn.deterministic", cudnn, "deterministic"),
        _algorithms_switch(),
        _attr_switch("torch.utils.deterministic.fill_uninitialized_memory", _fill_owner(),
                      "fill_uninitialized_memory"),
        _attr_switch("torch.backends.mkldnn.deterministic", mkldnn, "deterministic"),
    ]


def _targets(warn_only: bool, fill: bool) -> dict[str, Any]:
    return {
        "torch.backends.cudnn.benchmark": False,
        "torch.backends.cudnn.deterministic": True,
        "torch.use_deterministic_algorithms": (True, warn_only),
        "torch.utils.deterministic.fill_uninitialized_memory": fill,
        "torch.backends.mkldnn.deterministic": True,
    }


def _settings(warn_only: bool, fill: bool, cublas: str | None) -> dict[str, dict[str, Any]]:
    targets = _targets(warn_only, fill)
    out: dict[str, dict[str, Any]] = {}
    for sw in _torch_switches():
        out[sw.name] = _entry(sw.get(), sw.available, targets[sw.name], _NOTES[sw.name])
    name = "torch._inductor.config.deterministic"
    has = _inductor_has_deterministic()
    out[name] = _entry(_inductor_get() if has else None, has, True if has else None, _NOTES[name])
    cuda_init = _cuda_initialized()
    note = _NOTES[_CUBLAS] + ("; CUDA is already initialised here" if cuda_init else
                              "; CUDA is not initialised yet")
    out[_CUBLAS] = _entry(os.environ.get(_CUBLAS), True, cublas, note)
    for backend in _hook_backends():
        getter = getattr(backend, "get_deterministic", None)
        try:
            value = getter() if callable(getter) else None
        except Exception as err:  # a broken third-party hook must not break the report
            value, extra = None, f"; reading it failed: {err}"
        else:
            extra = ""
        hook_note = str(getattr(backend, "deterministic_note", "the backend's own switch"))
        out[f"backend.{backend.name}.deterministic"] = _entry(
            value, value is not None, True if value is not None else None, hook_note + extra)
    out["torch.initial_seed()"] = _entry(torch.initial_seed(), True, None,
                                         "the seed of torch's CPU generator")
    return out


def current_settings() -> dict[str, dict[str, Any]]:
    """Every determinism setting, read without changing anything.

    Each entry maps a setting's name to ``{"value", "available", "target",
    "previous", "note"}``: its current value, whether this torch has it, what
    ``deterministic()`` with default arguments sets it to, ``None`` for
    ``previous`` (only a handle knows it), and a one-line explanation.

    Example:
        >>> devrng._determinism.current_settings()["torch.backends.cudnn.benchmark"]["value"]
        False
    """
    return _settings(False, True, _CUBLAS_DETERMINISTIC[0])


# --------------------------------------------------------------------------- the handle
class DeterministicHandle:
    """What :func:`deterministic` returns: the settings it applied, and how to undo them.

    Used with ``with``, everything it changed is restored on exit, also when the
    body raises. ``restore()`` does the same by hand.

    Example:
        >>> with devrng.deterministic(seed=0) as handle:
        ...     loader = DataLoader(data, num_workers=2, **handle.dataloader_kwargs())
    """

    def __init__(self, seed: int | None, warn_only: bool, cublas_workspace_config: str | None,
                 fill_uninitialized_memory: bool) -> None:
        self.seed = seed
        self.warn_only = warn_only
        self.cublas_workspace_config = cublas_workspace_config
        self.fill_uninitialized_memory = fill_uninitialized_memory
        self._undo: list[tuple[str, Callable[[], None]]] = []
        self._previous: dict[str, Any] = {}
        self._active = False
        self._apply()

    # -- applying ---------------------------------------------------------------
    def _apply(self) -> None:
        self._check_cublas()  # may raise: before anything changes
        try:
            targets = _targets(self.warn_only, self.fill_uninitialized_memory)
            for sw in _torch_switches():
                if sw.available:
                    self._change(sw.name, sw.get, sw.set, targets[sw.name])
            self._apply_inductor()
            self._apply_cublas()
            for backend in _hook_backends():
                self._apply_hook(backend)
            if self.seed is not None:
                self._apply_seed(self.seed)
        except BaseException:
            self._run_undo()
            raise
        self._active = True

    def _change(self, name: str, get: Callable[[], Any], put: Callable[[Any], None],
                value: Any) -> None:
        previous = get()
        self._previous[name] = previous
        put(value)
        self._undo.append((name, lambda: put(previous)))

    def _apply_inductor(self) -> None:
        name = "torch._inductor.config.deterministic"
        if not _inductor_has_deterministic():
            return
        module = sys.modules.get(_INDUCTOR_MODULE)
        if module is not None:
            self._change(name, lambda: bool(module.deterministic),
                         lambda v: setattr(module, "deterministic", bool(v)), True)
            return
        # Not imported yet: inductor reads the variable when it is.
        previous_env = os.environ.get(_INDUCTOR_ENV)
        self._previous[name] = previous_env == "1"
        os.environ[_INDUCTOR_ENV] = "1"

        def undo() -> None:
            _set_env(_INDUCTOR_ENV, previous_env)
            loaded = sys.modules.get(_INDUCTOR_MODULE)
            if loaded is not None and hasattr(loaded, "deterministic"):
                # Imported inside the block, so it read our value: put its old one back.
                setattr(loaded, "deterministic", previous_env == "1")  # noqa: B010

        self._undo.append((name, undo))

    def _check_cublas(self) -> None:
        want = self.cublas_workspace_config
        if want is None or not _cuda_initialized():
            return
        have = os.environ.get(_CUBLAS)
        if have == want:
            return
        shown = "not set" if have is None else f"{have!r}"
        fix = (f"Set it before the first CUDA call: call devrng.deterministic() at the very start "
               f"of the program, or start it with the variable in the environment, as in "
               f"`{_CUBLAS}={want} python train.py`.")
        if have in _CUBLAS_DETERMINISTIC:
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
        if not self.warn_only:
            raise DevRNGError(message + " Or pass warn_only=True to go on with a warning.")
        warnings.warn(message, UserWarning, stacklevel=4)

    def _apply_cublas(self) -> None:
        want = self.cublas_workspace_config
        previous = os.environ.get(_CUBLAS)
        self._previous[_CUBLAS] = previous
        # Once CUDA runs, a new value would only silence torch's own check
        # while cuBLAS keeps the old one: leave it as it is (warned above).
        if want is None or _cuda_initialized() or previous == want:
            return
        os.environ[_CUBLAS] = want
        self._undo.append((_CUBLAS, lambda: _set_env(_CUBLAS, previous)))

    def _apply_hook(self, backend: Any) -> None:
        name = f"backend.{backend.name}.deterministic"
        env_before = dict(os.environ)
        previous = backend.set_deterministic(True)
        self._previous[name] = previous
        if previous is None:  # no such switch in this process
            return
        changed = {k: env_before.get(k) for k in set(env_before) | set(os.environ)
                   if env_before.get(k) != os.environ.get(k)}

        def undo() -> None:
            backend.set_deterministic(previous)
            for key, value in changed.items():  # put variables back byte for byte
                _set_env(key, value)

        self._undo.append((name, undo))

    def _apply_seed(self, seed: int) -> None:
        # Only initialised devices are snapshotted: reading an uninitialised
        # device's state would start it (pytorch/pytorch#41970).
        types = [n for n in available_backends() if n != "cpu" and _initialized(n)]
        snapshot: RNGState = get_rng_state(device_type=types)
        manual_seed(seed)
        self._undo.append(("rng state", lambda: set_rng_state(snapshot)))

    # -- restoring --------------------------------------------------------------
    def _run_undo(self) -> list[str]:
        failures = []
        while self._undo:
            name, undo = self._undo.pop()
            try:
                undo()
            except Exception as err:  # restore the rest before reporting
                failures.append(f"{name} ({type(err).__name__}: {err})")
        return failures

    def restore(self) -> None:
        """Put back every flag, environment variable and RNG state this handle changed.

        Example:
            >>> handle = devrng.deterministic(seed=0)
            >>> handle.restore()
        """
        failures = self._run_undo()
        self._active = False
        if failures:
            raise DevRNGError(
                "deterministic() could not restore " + "; ".join(failures)
                + ". The other settings were restored."
            )

    def __enter__(self) -> DeterministicHandle:
        if not self._active:  # re-entering a handle that was restored
            self._apply()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.restore()

    # -- DataLoader and report -----------------------------------------------------
    def dataloader_kwargs(self) -> dict[str, Any]:
        """``generator`` and ``worker_init_fn`` for ``torch.utils.data.DataLoader``.

        The generator is seeded with the handle's seed (or, without one, with a
        seed drawn from torch's CPU generator, so an earlier ``manual_seed``
        fixes it); it decides shuffling and each epoch's worker seeds.

        Example:
            >>> loader = DataLoader(data, num_workers=2, shuffle=True,
            ...                     **devrng.deterministic(seed=0).dataloader_kwargs())
        """
        seed = self.seed
        if seed is None:
            seed = int(torch.randint(0, 2**62, (), dtype=torch.int64).item())
        generator = torch.Generator()
        generator.manual_seed(seed)
        rank = _rank()
        # A worker finds the rank through torch.distributed (forked workers) or
        # RANK; bind it when a spawned worker could not see it that way.
        init_fn: Callable[[int], int] = seed_worker
        if rank != _env_rank(strict=False):
            init_fn = functools.partial(seed_worker, rank=rank)
        return {"generator": generator, "worker_init_fn": init_fn}

    def report(self) -> dict[str, dict[str, Any]]:
        """Every setting with its current value, availability, target and value before.

        Example:
            >>> devrng.deterministic(seed=0).report()["torch.backends.cudnn.deterministic"]
            {'value': True, 'available': True, 'target': True, 'previous': False, 'note': '...'}
        """
        out = _settings(self.warn_only, self.fill_uninitialized_memory,
                        self.cublas_workspace_config)
        for name, previous in self._previous.items():
            if name in out:
                out[name]["previous"] = previous
        out["seed"] = _entry(self.seed, True, self.seed, "devrng.manual_seed(seed) when given",
                             None)
        return out

    def __repr__(self) -> str:
        state = "active" if self._active else "restored"
        return f"<devrng.deterministic seed={self.seed!r} warn_only={self.warn_only} {state}>"


def _initialized(name: str) -> bool:
    backend = peek_backend(name)
    check = getattr(backend, "is_initialized", None)
    try:
        return bool(check()) if check is not None else True
    except Exception:
        return False


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

    Example:
        >>> devrng.deterministic(seed=0)          # at program start
        >>> with devrng.deterministic(seed=0):     # or for one block
        ...     train()
    """
    if seed is not None:
        seed = check_seed(seed)
    for name, flag in (("warn_only", warn_only),
                       ("fill_uninitialized_memory", fill_uninitialized_memory)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be True or False, not {flag!r}.")
    if cublas_workspace_config is not None and (
            not isinstance(cublas_workspace_config, str)
            or not _CUBLAS_FORMAT.match(cublas_workspace_config)):
        raise ValueError(
            f"cublas_workspace_config={cublas_workspace_config!r} is not a cuBLAS workspace "
            "setting; pass ':4096:8' or ':16:8' (the deterministic ones), another ':SIZE:COUNT' "
            "string, or None to leave CUBLAS_WORKSPACE_CONFIG alone."
        )
    return DeterministicHandle(seed, warn_only, cublas_workspace_config, fill_uninitialized_memory)


# --------------------------------------------------------------------------- workers
def _rank() -> int:
    return _rank_from_env(strict=False)


def worker_seeds(base_seed: int, worker_id: int, rank: int) -> tuple[int, int, list[int]]:
    """The torch, Python and NumPy seeds :func:`seed_worker` uses, from its inputs."""
    h = splitmix64(base_seed & MASK64)
    h = splitmix64(h ^ splitmix64((rank & MASK64) ^ 0x5EED0000000000AB))
    h = splitmix64(h ^ (worker_id & MASK64))
    torch_seed = splitmix64(h ^ 1)
    python_seed = splitmix64(h ^ 2)
    np_words = [w for k in (3, 4) for x in (splitmix64(h ^ k),)
                for w in (x & 0xFFFFFFFF, x >> 32)]
    return torch_seed, python_seed, np_words


def seed_worker(worker_id: int, *, rank: int | None = None) -> int:
    """Seed torch, Python ``random`` and NumPy inside a DataLoader worker.

    The seeds come from the worker's own seed, which the DataLoader draws from
    its ``generator`` each epoch and offsets by ``worker_id``, mixed with the
    distributed rank (``rank``, else the default process group's, else
    ``RANK``, else 0). So they differ per worker, epoch and rank, and repeat
    exactly when the generator is seeded the same. ``torch.distributions``
    samples draw from torch's generator and follow. Returns the torch seed.

    Example:
        >>> DataLoader(data, num_workers=2, worker_init_fn=devrng.seed_worker,
        ...            generator=torch.Generator().manual_seed(0))
    """
    info = torch.utils.data.get_worker_info()
    base = int(info.seed) if info is not None else int(torch.initial_seed())
    torch_seed, python_seed, np_words = worker_seeds(
        base, int(worker_id), _rank() if rank is None else int(rank))
    torch.manual_seed(torch_seed)
    random.seed(python_seed)
    np = _host.numpy_or_none()
    if np is not None:
        np.random.seed(np_words)
    return torch_seed
