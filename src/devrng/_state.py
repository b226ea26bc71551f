"""RNG snapshots (``RNGState``), restoring them, and seeding everything at once."""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import torch

from devrng import _host
from devrng._errors import DevRNGError
from devrng._plain import check_plain, describe, feed, signature
from devrng._plan import make_plan
from devrng._registry import Backend, available_backends, device_count, get_backend
from devrng._seeds import check_seed

__all__ = ["RNGState", "get_rng_state", "manual_seed", "set_rng_state"]

_FORMAT = "devrng.RNGState"
_VERSION = 1
_cpu = torch.default_generator
_NO_DEVICES: Mapping[str, Mapping[int, Any]] = MappingProxyType({})


class RNGState:
    """A frozen snapshot of every covered generator.

    Attributes are read-only: ``cpu`` (the CPU generator's state tensor),
    ``devices`` (device type -> device index -> state), ``python`` and
    ``numpy`` (``None`` when not captured).

    Example:
        >>> snap = devrng.get_rng_state()
        >>> a = torch.rand(3)
        >>> devrng.set_rng_state(snap)
        >>> torch.equal(a, torch.rand(3))
        True
    """

    __slots__ = ("_cpu", "_devices", "_numpy", "_python")
    _cpu: torch.Tensor
    _devices: Mapping[str, Mapping[int, Any]]
    _python: Any
    _numpy: Any

    def __init__(self, cpu: torch.Tensor, devices: Mapping[str, Mapping[int, Any]],
                 python: Any = None, numpy: Any = None) -> None:
        # Read-only through the properties below (none has a setter).
        self._cpu = cpu
        self._devices = MappingProxyType(
            {t: MappingProxyType(dict(per)) for t, per in devices.items()}) if devices else _NO_DEVICES
        self._python = python
        self._numpy = numpy

    @property
    def cpu(self) -> torch.Tensor:
        return self._cpu

    @property
    def devices(self) -> Mapping[str, Mapping[int, Any]]:
        return self._devices

    @property
    def python(self) -> Any:
        return self._python

    @property
    def numpy(self) -> Any:
        return self._numpy

    def __repr__(self) -> str:
        parts = ["cpu"] + [f"{t}:{i}" for t, per in self.devices.items() for i in per]
        parts += [n for n in ("python", "numpy") if getattr(self, n) is not None]
        return f"RNGState({', '.join(parts)}; fingerprint={self.fingerprint()})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RNGState):
            return NotImplemented
        return self.fingerprint() == other.fingerprint()

    def __hash__(self) -> int:
        return hash(self.fingerprint())

    # -- serialisation -------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain data (tensors, ints, strings, dicts, lists) that ``torch.load(weights_only=True)`` reads."""
        data: dict[str, Any] = {
            "format": _FORMAT,
            "version": _VERSION,
            "torch": str(torch.__version__),
            "cpu": self.cpu,
            "devices": {t: dict(per) for t, per in self.devices.items()},
            "python": None,
            "numpy": None,
        }
        if self.python is not None:
            version, internal, gauss = self.python
            data["python"] = [version, torch.tensor(internal, dtype=torch.int64), gauss]
        if self.numpy is not None:
            st = self.numpy
            key = torch.from_numpy(st["state"]["key"].astype("int64"))
            data["numpy"] = {"bit_generator": st["bit_generator"], "key": key,
                             "pos": int(st["state"]["pos"]), "has_gauss": int(st["has_gauss"]),
                             "gauss": float(st["gauss"])}
        for t, per in data["devices"].items():
            for i, state in per.items():
                check_plain(state, f"the {t}:{i} state")
        return data

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "the data") -> RNGState:
        """Inverse of :meth:`to_dict`; raises ``DevRNGError`` on anything malformed."""
        try:
            if data.get("format") != _FORMAT:
                raise ValueError(f"its format tag is {data.get('format')!r}, not {_FORMAT!r}")
            if data.get("version") != _VERSION:
                raise ValueError(f"it is version {data.get('version')!r}; this devrng reads {_VERSION}")
            cpu = data["cpu"]
            if not isinstance(cpu, torch.Tensor) or cpu.dtype != torch.uint8:
                raise ValueError("its CPU state is not a uint8 tensor")
            devices = {str(t): {int(i): s for i, s in per.items()} for t, per in data["devices"].items()}
            python = None
            if data["python"] is not None:
                version, internal, gauss = data["python"]
                python = (int(version), tuple(int(v) for v in internal.tolist()), gauss)
            numpy = None
            if data["numpy"] is not None:
                np = _host.numpy_or_none()
                if np is None:
                    raise ValueError("it holds a NumPy state and NumPy is not installed")
                st = data["numpy"]
                numpy = {"bit_generator": st["bit_generator"],
                         "state": {"key": np.asarray(st["key"].numpy(), dtype=np.uint32),
                                   "pos": int(st["pos"])},
                         "has_gauss": int(st["has_gauss"]), "gauss": float(st["gauss"])}
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise DevRNGError(f"{source} is not a valid devrng RNG snapshot: {err}.") from err
        return cls(cpu, devices, python, numpy)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the snapshot to ``path``; it loads with ``torch.load(path, weights_only=True)``.

        Example:
            >>> devrng.get_rng_state().save("step_100.rng")
        """
        torch.save(self.to_dict(), path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> RNGState:
        """Read a snapshot written by :meth:`save`, never unpickling arbitrary objects.

        Example:
            >>> devrng.set_rng_state(devrng.RNGState.load("step_100.rng"))
        """
        try:
            data = torch.load(path, weights_only=True, map_location="cpu")
        except FileNotFoundError:
            raise
        except Exception as err:
            raise DevRNGError(
                f"{os.fspath(path)!r} could not be read as a devrng RNG snapshot "
                f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); "
                "it is corrupt or was not written by RNGState.save."
            ) from err
        if not isinstance(data, dict):
            raise DevRNGError(
                f"{os.fspath(path)!r} holds a {type(data).__name__}, not a devrng RNG snapshot."
            )
        return cls.from_dict(data, source=repr(os.fspath(path)))

    def fingerprint(self) -> str:
        """A short hash of every state, equal across processes exactly when the states are.

        Example:
            >>> devrng.get_rng_state().fingerprint()
            '3f9a0c7d21b4e865'
        """
        h = hashlib.sha256()
        feed(h, self._hash_parts())
        return h.hexdigest()[:16]

    def _hash_parts(self) -> Any:
        return [self.cpu, sorted((t, sorted(per.items())) for t, per in self.devices.items()),
                self.python, self.numpy]


def get_rng_state(devices: Any = None, device_type: Any = None, *, python: bool = True,
                  numpy: bool = True) -> RNGState:
    """Snapshot the CPU generator, each covered device's, and Python's and NumPy's.

    ``devices`` / ``device_type`` choose devices as in :func:`devrng.fork_rng`.

    Example:
        >>> snap = devrng.get_rng_state(devices=[xla_tensor])
        >>> snap.save("rng.pt")
    """
    plan = make_plan(devices, device_type, caller="get_rng_state", warn=False)
    per_type = {b.name: {i: b.get_rng_state(i) for i in idx} for b, idx in plan}
    return RNGState(
        _cpu.get_state(),
        per_type,
        _host.get_python_state() if python else None,
        _host.get_numpy_state() if numpy else None,
    )


_CPU_NUMEL: int | None = None  # the size of this torch's CPU generator state, read once


def _cpu_numel() -> int:
    global _CPU_NUMEL
    if _CPU_NUMEL is None:
        _CPU_NUMEL = _cpu.get_state().numel()
    return _CPU_NUMEL


def _validate_host(state: RNGState) -> None:
    cpu = state.cpu
    if not isinstance(cpu, torch.Tensor) or cpu.dtype != torch.uint8 or cpu.dim() != 1 \
            or cpu.numel() != _cpu_numel():
        got = f"a {cpu.dtype} tensor of shape {tuple(cpu.shape)}" if isinstance(cpu, torch.Tensor) \
            else f"a {type(cpu).__name__}"
        raise DevRNGError(
            f"The snapshot's CPU state is {got}; this torch needs a uint8 tensor of "
            f"{_cpu_numel()} elements."
        )
    py = state.python
    if py is not None and not (isinstance(py, tuple) and len(py) == 3 and py[0] == 3
                               and isinstance(py[1], tuple) and len(py[1]) == 625):
        raise DevRNGError(
            "The snapshot's Python state is not one that random.setstate accepts "
            "(a tuple (3, 625 ints, gauss))."
        )
    np_state = state.numpy
    if np_state is not None:
        try:
            ok = np_state["bit_generator"] == "MT19937" and np_state["state"]["key"].shape == (624,)
        except (KeyError, TypeError, AttributeError):
            ok = False
        if not ok:
            raise DevRNGError(
                "The snapshot's NumPy state is not an MT19937 state of 624 words, which NumPy's "
                "global generator needs."
            )
        if _host.numpy_or_none() is None:
            raise DevRNGError("The snapshot holds a NumPy state, but NumPy is not installed here.")


def set_rng_state(state: RNGState) -> None:
    """Restore a snapshot: everything it covers, or, on any mismatch, nothing.

    The whole snapshot is checked first (device types, device counts, state
    types, shapes and dtypes); a mismatch raises ``DevRNGError`` before any
    generator changes.

    Example:
        >>> snap = devrng.get_rng_state()
        >>> devrng.set_rng_state(snap)
    """
    if not isinstance(state, RNGState):
        raise TypeError(
            f"set_rng_state takes a devrng.RNGState, not a {type(state).__name__}; get one from "
            "devrng.get_rng_state() or devrng.RNGState.load(path)."
        )
    _validate_host(state)
    # Check every device state against this process, keeping the current one
    # so that a failure half-way can be rolled back.
    plan: list[tuple[Backend, int, Any, Any]] = []
    for name, per in state.devices.items():
        try:
            backend = get_backend(name)
        except (ValueError, ImportError) as err:
            raise DevRNGError(
                f"The snapshot holds {name} states, but this process cannot reach {name} devices "
                f"({err})."
            ) from err
        count = device_count(backend) if backend.is_available() else 0
        for index, saved in per.items():
            if not 0 <= index < count:
                raise DevRNGError(
                    f"The snapshot holds a state for {name}:{index}, but this process has "
                    f"{count} {name} device(s); restore it where that device exists."
                )
            current = backend.get_rng_state(index)
            if signature(saved) != signature(current):
                raise DevRNGError(
                    f"The snapshot's {name}:{index} state is {describe(saved)}, but this "
                    f"process's is {describe(current)}; it was taken with another backend or "
                    "library version."
                )
            plan.append((backend, index, saved, current))
    done: list[tuple[Backend, int, Any, Any]] = []
    try:
        for item in plan:
            item[0].set_rng_state(item[2], item[1])
            done.append(item)
        # Validated above; each of these either applies whole or raises unchanged.
        if state.python is not None:
            _host.set_python_state(state.python)
        if state.numpy is not None:
            _host.set_numpy_state(state.numpy)
        _cpu.set_state(state.cpu)
    except Exception as err:
        for backend, index, _, previous in reversed(done):
            with contextlib.suppress(Exception):  # best effort; the error below says what failed
                backend.set_rng_state(previous, index)
        raise DevRNGError(
            f"Restoring the snapshot failed ({type(err).__name__}: {err}); the device generators "
            "already set were put back."
        ) from err


def manual_seed(seed: int, *, devices: Any = None, device_type: Any = None, python: bool = True,
                numpy: bool = True) -> int:
    """Seed torch's CPU generator, every available device backend, Python and NumPy.

    Unlike ``torch.manual_seed`` this reaches XLA and torchax too. With
    ``devices`` / ``device_type`` only those device types are seeded (all
    devices of each).

    Example:
        >>> devrng.manual_seed(1234)
        1234
    """
    seed = check_seed(seed)
    if devices is None and device_type is None:
        backends = [get_backend(n) for n in available_backends() if n != "cpu"]
    else:
        backends = [b for b, _ in make_plan(devices, device_type, caller="manual_seed", warn=False)]
    _cpu.manual_seed(seed)
    for backend in backends:
        backend.manual_seed(seed)
    if python:
        random.seed(seed)
    if numpy:
        _host.seed_numpy(seed)
    return seed
