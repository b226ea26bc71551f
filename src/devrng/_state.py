"""RNG snapshots (``RNGState``), restoring them, and seeding everything at once."""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Mapping
from types import MappingProxyType
from typing import IO, Any, NamedTuple

import torch

from devrng import _host
from devrng._errors import DevRNGError, add_note, check_flags, short_repr
from devrng._files import atomic_write, is_file_like
from devrng._fork import restore_all
from devrng._plain import check_plain, describe, feed, signature
from devrng._plan import make_plan
from devrng._registry import Backend, available_backends, device_count, get_backend, is_initialized
from devrng._seeds import MASK64, check_seed

__all__ = ["RNGState", "Restore", "get_rng_state", "manual_seed", "prepare_restore", "set_rng_state"]

_FORMAT = "devrng.RNGState"
_VERSION = 1
_cpu = torch.default_generator
_NO_DEVICES: Mapping[str, Mapping[int, Any]] = MappingProxyType({})


class RNGState:
    """A frozen snapshot of every covered generator, from ``get_rng_state()``.

    Restore it with ``set_rng_state``, write it with ``RNGState.save`` and read
    it back with ``RNGState.load``. Two snapshots are equal when their
    fingerprints are.

    Attributes:
        cpu: The CPU generator's state (a uint8 tensor).
        devices: Device type -> device index -> that device's state.
        python: Python's ``random`` state, or ``None`` when not captured.
        numpy: NumPy's global generator state, or ``None`` when not captured.

    Examples:
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
        try:
            tail = f"; fingerprint={self.fingerprint()}"
        except DevRNGError:
            tail = "; holds a state that is not plain data"
        return f"RNGState({', '.join(parts)}{tail})"

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
        """The snapshot that ``RNGState.to_dict`` turned into ``data``.

        Every part is checked as far as this process can without touching a
        generator: a snapshot that parses installs working generators.

        Args:
            data: What ``RNGState.to_dict`` returned (after any round trip
                through ``torch.save`` / ``torch.load``).
            source: What ``data`` is, for the error message.

        Returns:
            The snapshot.

        Raises:
            DevRNGError: ``data`` is not a snapshot, or any part of it is
                malformed.

        Examples:
            >>> snap = devrng.get_rng_state()
            >>> devrng.RNGState.from_dict(snap.to_dict()) == snap
            True
        """
        try:
            return cls._parse(data)
        except (DevRNGError, KeyboardInterrupt, SystemExit):
            raise
        except Exception as err:  # hostile input may fail in any way: one error class for it
            raise DevRNGError(
                f"{source} is not a valid devrng RNG snapshot: {err}. Write snapshots with "
                "RNGState.save or RNGState.to_dict."
            ) from err

    @classmethod
    def _parse(cls, data: Any) -> RNGState:
        if not isinstance(data, Mapping):
            raise ValueError(f"it is a {type(data).__name__}, not a dict")
        if data.get("format") != _FORMAT:
            raise ValueError(f"its format tag is {short_repr(data.get('format'))}, not {_FORMAT!r}")
        if data.get("version") != _VERSION:
            raise ValueError(f"it is version {short_repr(data.get('version'))}; this devrng reads "
                             f"{_VERSION}")
        cpu = data["cpu"]
        _check_cpu_state(cpu)
        raw_devices = data["devices"]
        if not isinstance(raw_devices, Mapping):
            raise ValueError("its 'devices' entry is not a dict")
        devices: dict[str, dict[int, Any]] = {}
        for name, per in raw_devices.items():
            if not isinstance(name, str) or not name or ":" in name:
                raise ValueError(f"it names the device type {short_repr(name)}")
            if not isinstance(per, Mapping):
                raise ValueError(f"its {name} entry is not a dict of device index to state")
            devices[name] = {}
            for index, state in per.items():
                if type(index) is not int or index < 0:
                    raise ValueError(f"it names the {name} device index {short_repr(index)}")
                check_plain(state, f"its {name}:{index} state")
                devices[name][index] = state
        python = None if data["python"] is None else _python_from_plain(data["python"])
        numpy = None if data["numpy"] is None else _numpy_from_plain(data["numpy"])
        return cls(cpu, devices, python, numpy)

    def save(self, f: str | os.PathLike[str] | IO[bytes]) -> None:
        """Write the snapshot to a file that ``torch.load(..., weights_only=True)`` reads.

        A path is written atomically: a failure leaves the previous file as it was.

        Args:
            f: A path, or a binary file open for writing.

        Raises:
            OSError: The file could not be written.

        Examples:
            >>> devrng.get_rng_state().save("step_100.rng")
        """
        data = self.to_dict()
        if is_file_like(f):
            torch.save(data, f)
        else:
            atomic_write(f, lambda fh: torch.save(data, fh))  # type: ignore[arg-type]

    @classmethod
    def load(cls, f: str | os.PathLike[str] | IO[bytes]) -> RNGState:
        """Read a snapshot that ``RNGState.save`` wrote, never unpickling arbitrary objects.

        Args:
            f: A path, or a binary file open for reading.

        Returns:
            The snapshot, checked as ``RNGState.from_dict`` checks it.

        Raises:
            FileNotFoundError: There is no such file.
            DevRNGError: The file is not a snapshot (text, empty, corrupt, or
                written by something else).

        Examples:
            >>> devrng.get_rng_state().save("step_100.rng")
            >>> snap = devrng.RNGState.load("step_100.rng")
            >>> devrng.set_rng_state(snap)
        """
        where = repr(f) if is_file_like(f) else repr(os.fspath(f))  # type: ignore[arg-type]
        kind = _not_torch_save(f)
        if kind is not None:
            raise DevRNGError(
                f"{where} is not a devrng RNG snapshot: {kind}, and snapshots are files that "
                "RNGState.save (torch.save) writes."
            )
        try:
            data = torch.load(f, weights_only=True, map_location="cpu")
        except FileNotFoundError:
            raise
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as err:
            first = str(err).splitlines()[0] if str(err) else ""
            raise DevRNGError(
                f"{where} could not be read as a devrng RNG snapshot ({type(err).__name__}: "
                f"{first[:200]}); it is corrupt or was not written by RNGState.save."
            ) from err
        return cls.from_dict(data, source=where)

    def fingerprint(self) -> str:
        """A short hash of every state, equal across processes exactly when the states are.

        Returns:
            16 hexadecimal digits.

        Raises:
            DevRNGError: A backend state is not plain data (tensors, numbers,
                strings, lists, dicts), so it has no stable bytes to hash.

        Examples:
            >>> len(devrng.get_rng_state().fingerprint())
            16
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

    Args:
        devices: The devices to cover, as in ``fork_rng``: tensors, modules,
            device strings, ints, ... ``[]`` covers the CPU only; ``None``
            every device of ``device_type`` or, without one, the accelerator
            and XLA / torchax where this process has started them.
        device_type: A device type or a sequence of them, as in ``fork_rng``.
        python: Include Python's ``random``.
        numpy: Include NumPy's global generator.

    Returns:
        A frozen ``RNGState``.

    Raises:
        TypeError: ``devices`` or ``device_type`` names no device, or a flag is
            not ``True`` / ``False``.
        ValueError: A device or device type does not exist here.
        ImportError: A device type needs a package that is not installed.

    Examples:
        >>> snap = devrng.get_rng_state(devices=[])   # CPU, Python and NumPy
        >>> snap.devices
        mappingproxy({})
    """
    check_flags(python=python, numpy=numpy)
    plan = make_plan(devices, device_type, caller="get_rng_state", warn=False)
    per_type = {b.name: {i: b.get_rng_state(i) for i in idx} for b, idx in plan}
    return RNGState(
        _cpu.get_state(),
        per_type,
        _host.get_python_state() if python else None,
        _host.get_numpy_state() if numpy else None,
    )


def _not_torch_save(f: Any) -> str | None:
    """What a file is when it plainly is not torch.save's output (a zip archive or a pickle)."""
    try:
        if is_file_like(f):
            if not (hasattr(f, "seek") and hasattr(f, "tell")):
                return None
            start = f.tell()
            head = f.read(8)
            f.seek(start)
        else:
            with open(f, "rb") as fh:
                head = fh.read(8)
    except (OSError, ValueError):
        return None  # torch.load says what is wrong (a missing file stays FileNotFoundError)
    if not head:
        return "it is empty"
    if head.startswith(b"PK\x03\x04") or head[:1] == b"\x80":
        return None  # a zip archive (torch.save) or a pickle (its legacy format)
    text = head.decode("ascii", errors="replace")
    printable = text.isprintable() or text.rstrip("\r\n").isprintable()
    return f"it begins with {text!r}, like a text file" if printable else \
        f"it begins with the bytes {head!r}"


_CPU_NUMEL: int | None = None  # the size of this torch's CPU generator state, read once
_scratch_cpu = torch.Generator()  # CPU states are tried here first, never on the real one


def _cpu_numel() -> int:
    global _CPU_NUMEL
    if _CPU_NUMEL is None:
        _CPU_NUMEL = _cpu.get_state().numel()
    return _CPU_NUMEL


def _check_cpu_state(cpu: Any) -> None:
    if not isinstance(cpu, torch.Tensor) or cpu.dtype != torch.uint8 or cpu.dim() != 1 \
            or cpu.numel() != _cpu_numel() or cpu.device.type != "cpu":
        raise ValueError(
            f"its CPU state is {describe(cpu)}; this torch needs a uint8 CPU tensor of "
            f"{_cpu_numel()} elements"
        )
    try:
        _scratch_cpu.set_state(cpu)
    except RuntimeError as err:
        raise ValueError(f"its CPU state is not a valid MT19937 state ({err})") from None


def _python_from_plain(raw: Any) -> tuple[int, tuple[int, ...], float | None]:
    if not isinstance(raw, (list, tuple)) or len(raw) != 3:
        raise ValueError("its Python state is not [version, key tensor, gauss]")
    version, internal, gauss = raw
    if not isinstance(internal, torch.Tensor) or internal.dtype != torch.int64 \
            or tuple(internal.shape) != (625,):
        raise ValueError(f"its Python key is {describe(internal)}, not 625 int64 values")
    state = (version, tuple(internal.tolist()), gauss)
    try:
        _host.check_python_state(state)
    except ValueError as err:
        raise ValueError(f"its Python state is unusable: {err}") from None
    return state


def _numpy_from_plain(raw: Any) -> dict[str, Any]:
    np = _host.numpy_or_none()
    if np is None:
        raise ValueError("it holds a NumPy state and NumPy is not installed here")
    if not isinstance(raw, Mapping):
        raise ValueError("its NumPy state is not a dict")
    key = raw["key"]
    if not isinstance(key, torch.Tensor) or key.dtype != torch.int64 \
            or tuple(key.shape) != (624,):
        raise ValueError(f"its NumPy key is {describe(key)}, not 624 int64 values")
    if bool(((key < 0) | (key > 0xFFFFFFFF)).any()):
        raise ValueError("its NumPy key holds values outside [0, 2**32)")
    state = {"bit_generator": raw["bit_generator"],
             "state": {"key": np.asarray(key.numpy(), dtype=np.uint32), "pos": raw["pos"]},
             "has_gauss": raw["has_gauss"], "gauss": raw["gauss"]}
    try:
        _host.check_numpy_state(state)
    except ValueError as err:
        raise ValueError(f"its NumPy state is unusable: {err}") from None
    return state


def _check_host(state: RNGState) -> None:
    """The CPU, Python and NumPy parts of a snapshot, checked as fully as from_dict checks them."""
    try:
        _check_cpu_state(state.cpu)
    except ValueError as err:
        raise DevRNGError(f"The snapshot's {str(err).removeprefix('its ')}.") from None
    checks = (("Python", "random.setstate accepts", _host.check_python_state, state.python),
              ("NumPy", "NumPy's global generator can take", _host.check_numpy_state,
               state.numpy))
    for label, accepts, check, part in checks:
        if part is not None:
            try:
                check(part)
            except ValueError as err:
                raise DevRNGError(
                    f"The snapshot's {label} state is not one that {accepts}: {err}."
                ) from None


def set_rng_state(state: RNGState) -> None:
    """Restore a snapshot: everything it covers, or, on any mismatch or failure, nothing.

    The whole snapshot is checked first (device types, device counts, state
    types, shapes and dtypes, and the CPU, Python and NumPy states in full); a
    mismatch raises ``DevRNGError`` before any generator changes. If setting a
    generator still fails, every generator already set is put back.

    Args:
        state: A snapshot from ``get_rng_state`` or ``RNGState.load``.

    Raises:
        TypeError: ``state`` is not an ``RNGState``.
        DevRNGError: The snapshot does not fit this process (devices it lacks,
            states of another backend or version), or setting a generator
            failed; either way every generator is as it was.

    Examples:
        >>> snap = devrng.get_rng_state()
        >>> first = torch.rand(2)
        >>> devrng.set_rng_state(snap)
        >>> torch.equal(first, torch.rand(2))
        True
    """
    if not isinstance(state, RNGState):
        raise TypeError(
            f"set_rng_state takes a devrng.RNGState, not a {type(state).__name__}; get one from "
            "devrng.get_rng_state() or devrng.RNGState.load(path)."
        )
    prepare_restore(state).apply()


class Restore(NamedTuple):
    """A snapshot checked against this process and ready to apply (see ``prepare_restore``)."""

    state: RNGState
    targets: list[tuple[Backend, int, Any]]
    previous: list[tuple[Backend, int, Any]]

    def apply(self) -> None:
        """Set every generator; on any failure put every generator back and raise."""
        state = self.state
        _apply(self.targets, state.cpu, state.python, state.numpy, self.previous,
               what="Restoring the snapshot", host=(state.python is not None,
                                                    state.numpy is not None))


def prepare_restore(state: RNGState) -> Restore:
    """Check ``state`` in full against this process without changing anything.

    Raises ``DevRNGError`` on any mismatch; the result's ``apply()`` restores it.
    Callers that restore more than one thing (``TrainingRNG``) check every
    part before applying any.
    """
    _check_host(state)
    # Check every device state against this process, keeping the current one
    # so that a failure half-way can be rolled back.
    targets: list[tuple[Backend, int, Any]] = []
    previous: list[tuple[Backend, int, Any]] = []
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
                    + (f"{count} {name} device(s); restore it where that device exists."
                       if count else f"no {name} device; restore it where one exists.")
                )
            try:
                current = backend.get_rng_state(index)
            except Exception as err:
                raise DevRNGError(
                    f"Restoring the snapshot failed before changing anything: reading this "
                    f"process's {name}:{index} state raised {type(err).__name__}: {err}."
                ) from err
            except BaseException as err:
                add_note(err, "Restoring the snapshot was interrupted before any generator "
                              "changed.")
                raise
            if signature(saved) != signature(current):
                raise DevRNGError(
                    f"The snapshot's {name}:{index} state is {describe(saved)}, but this "
                    f"process's is {describe(current)}; it was taken with another backend or "
                    "library version."
                )
            if type(saved) is int and not 0 <= saved <= MASK64:
                raise DevRNGError(
                    f"The snapshot's {name}:{index} state is {saved}, outside [0, 2**64)."
                )
            targets.append((backend, index, saved))
            previous.append((backend, index, current))
    return Restore(state, targets, previous)


def _apply(targets: list[tuple[Backend, int, Any]], cpu: torch.Tensor | None, python: Any,
           numpy: Any, previous: list[tuple[Backend, int, Any]], *, what: str,
           host: tuple[bool, bool]) -> None:
    """Set every target state; on any failure put every generator back and raise.

    NumPy goes last: its state was checked in full, and ``set_state`` either
    applies whole or raises unchanged, so nothing after it can fail and its
    current state (the costliest to copy, 624 words) need not be kept.
    """
    before_cpu = _cpu.get_state()
    before_py = _host.get_python_state() if host[0] else None
    try:
        for backend, index, saved in targets:
            backend.set_rng_state(saved, index)
        if cpu is not None:
            _cpu.set_state(cpu)
        if python is not None:
            _host.set_python_state(python)
        if numpy is not None:
            _host.set_numpy_state(numpy)
    except BaseException as err:
        _roll_back(err, what, before_cpu, previous, before_py, None)
        raise


def _roll_back(err: BaseException, what: str, cpu: torch.Tensor, previous: Any, py: Any,
               np: Any) -> None:
    """Put every generator back after ``err``; an interrupt goes on as itself (the caller
    re-raises it), any other failure becomes one ``DevRNGError`` saying what was put back."""
    interrupt = None if isinstance(err, Exception) else err
    try:
        restore_all(cpu, previous, py, np, what=what, pending=interrupt)
    except DevRNGError as undo_err:
        raise DevRNGError(
            f"{what} failed ({type(err).__name__}: {err}), and putting the generators back "
            f"failed too: {undo_err}"
        ) from err
    if interrupt is None:
        raise DevRNGError(
            f"{what} failed ({type(err).__name__}: {err}); every generator was put back as it "
            "was."
        ) from err


def manual_seed(seed: int, *, devices: Any = None, device_type: Any = None, python: bool = True,
                numpy: bool = True) -> int:
    """Seed torch's CPU generator, every available device backend, Python and NumPy.

    Unlike ``torch.manual_seed`` this reaches XLA and torchax too. With
    ``devices`` / ``device_type`` only those device types are seeded (all
    devices of each). All or nothing: if seeding one generator fails, every
    generator seeded before it is put back.

    Args:
        seed: An int in ``[0, 2**64)``; all 64 bits reach every generator.
        devices: Seed only the device types found here (every device of each).
        device_type: Seed only these device types (one or a sequence).
        python: Also seed Python's ``random``.
        numpy: Also seed NumPy's global generator.

    Returns:
        ``seed``, as an int.

    Raises:
        TypeError: ``seed`` is not an int, or a flag is not ``True`` / ``False``.
        ValueError: ``seed`` is outside ``[0, 2**64)``, or a device type does
            not exist here.
        DevRNGError: Seeding a generator failed; every generator is as it was.

    Examples:
        >>> devrng.manual_seed(1234)
        1234
    """
    seed = check_seed(seed)
    check_flags(python=python, numpy=numpy)
    if devices is None and device_type is None:
        backends = [get_backend(n) for n in available_backends() if n != "cpu"]
    else:
        backends = [b for b, _ in make_plan(devices, device_type, caller="manual_seed", warn=False)]
    # Started devices are read first so that a failure can be undone; a device that
    # has not started is seeded last and never read (reading would start it).
    started = [b for b in backends if is_initialized(b)]
    previous = [(b, i, b.get_rng_state(i)) for b in started for i in range(device_count(b))]
    before_cpu = _cpu.get_state()
    before_py = _host.get_python_state() if python else None
    try:
        for backend in started:
            backend.manual_seed(seed)
        for backend in backends:
            if backend not in started:
                backend.manual_seed(seed)
        _cpu.manual_seed(seed)
        if python:
            random.seed(seed)
        if numpy:  # last, as in _apply: nothing after it can fail
            _host.seed_numpy(seed)
    except BaseException as err:
        _roll_back(err, f"manual_seed({seed})", before_cpu, previous, before_py, None)
        raise
    return seed
