"""RNG snapshots: ``RNGState``, taking one, writing and reading it, and restoring it.

Restoring checks all of a snapshot against this process first (``prepare_restore``:
device types, device counts, each state's type, shape and dtype; the CPU, Python
and NumPy states are checked in full when the snapshot is read, or by
``check_host`` for one built by hand -- every check is in
``devrng._generators.saved``), then ``Restore.apply`` sets every generator, pushing
each one's current state onto an ``Undo`` stack first, so that a failure or an
interrupt anywhere puts every generator back. Seeding is in
``devrng._generators.seeding``.
"""

from __future__ import annotations

import array
import hashlib
import os
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import IO, Any, NamedTuple

import torch

from devrng._backends import host as _host
from devrng._backends.registry import Backend, device_count
from devrng._base.errors import DevRNGError, check_flags, short_repr
from devrng._base.files import atomic_write, checked_path, is_file_like, readable_file
from devrng._base.plain import hash_into
from devrng._base.sigint import deliver, guard
from devrng._generators.plan import make_plan
from devrng._generators.saved import (
    PREFIX,
    Fit,
    SavedForm,
    check_device_states,
    check_host_parts,
    check_plain,
    encode,
    parse_parts,
    read_parts,
    seal,
)
from devrng._generators.undo import DeviceState, Undo, read_devices

__all__ = ["RNGState", "Restore", "check_host", "get_rng_state", "parse_state", "plain_snapshot",
           "prepare_restore", "read_snapshot", "set_rng_state", "snapshot", "with_devices"]

# 2: sealed (a digest of the content, checked on load); 1 (devrng <= 0.4) loads unchecked
_FORM = SavedForm("devrng.RNGState", (1, 2), 2, "RNGState",
                  "RNGState.save or RNGState.to_dict()")
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

    __slots__ = ("_cpu", "_devices", "_host_checked", "_numpy", "_python")
    _cpu: torch.Tensor
    _devices: Mapping[str, Mapping[int, Any]]
    _python: Any
    _numpy: Any

    def __init__(self, cpu: torch.Tensor, devices: Mapping[str, Mapping[int, Any]],
                 python: Any = None, numpy: Any = None) -> None:
        """A snapshot of these states, checked when restored; ``get_rng_state()`` makes one."""
        # Read-only through the properties below (none has a setter).
        self._cpu = cpu
        self._devices = MappingProxyType(
            {t: MappingProxyType(dict(per)) for t, per in devices.items()}) if devices else _NO_DEVICES
        self._python = python
        self._numpy = numpy
        self._host_checked = False  # set by whatever made it from live or checked states

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
        """Plain data (tensors, ints, strings, dicts, lists) that ``torch.load(weights_only=True)`` reads.

        It records the devrng version that wrote it and a SHA-256 digest of its content:
        ``from_dict`` and ``load`` refuse it if anything in it changed since.
        """
        return seal(plain_snapshot(self))

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
        return read_snapshot(data, source=source)

    @guard
    def save(self, f: str | os.PathLike[str] | IO[bytes]) -> None:
        """Write the snapshot to a file that ``torch.load(..., weights_only=True)`` reads.

        A path is written atomically: a failure leaves the previous file as it was.

        Args:
            f: A path, or a binary file open for writing.

        Raises:
            TypeError: ``f`` is neither a path (``str``, ``os.PathLike``) nor a file.
            ValueError: The path names a directory, or something that is not a
                regular file (a FIFO, a device).
            OSError: The file could not be written (the previous one is kept).

        Examples:
            >>> devrng.get_rng_state().save("step_100.rng")
        """
        # Serialised in memory first (``encode``): torch's zip writer never holds the file,
        # so an interrupt or a full disk cannot leave it writing to a file already closed.
        # The whole call is guarded: a Ctrl-C raised at once inside torch.save was lost
        # about once in 2,000 real interrupts; noted, it is raised at the end, after the
        # file is in place.
        try:
            data = encode(self.to_dict())
            if is_file_like(f):
                f.write(data)  # type: ignore[union-attr]
            else:
                atomic_write(f, lambda fh: fh.write(data))  # type: ignore[arg-type]
        finally:
            deliver()

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
        if is_file_like(f):
            where = repr(f)
        else:
            where = repr(checked_path(f, "load"))
            problem = readable_file(os.fspath(f))  # type: ignore[arg-type]
            if problem is not None:
                raise DevRNGError(f"{where} is not a devrng RNG snapshot: {problem}. Snapshots "
                                  "are files that RNGState.save writes.")
            _check_exists(where, os.fspath(f))  # type: ignore[arg-type]
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
        hash_into(h, self._hash_parts())
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
    return snapshot(read_devices(plan), python=python, numpy=numpy)


def snapshot(devices: Iterable[DeviceState], *, python: bool, numpy: bool) -> RNGState:
    """An ``RNGState`` of device states already read, the CPU generator now, and Python's
    and NumPy's when asked for."""
    per_type: dict[str, dict[int, Any]] = {}
    for backend, index, state in devices:
        per_type.setdefault(backend.name, {})[index] = state
    snap = RNGState(
        _host.get_cpu_state(),
        per_type,
        _host.get_python_state() if python else None,
        _host.get_numpy_state() if numpy else None,
    )
    snap._host_checked = True  # this process's own generators: nothing to check
    return snap


def plain_snapshot(state: RNGState) -> dict[str, Any]:
    """``state.to_dict()`` without the keys ``seal`` adds: for a state that holds a snapshot
    under a digest of its own (``TrainingRNG``), read back with ``read_snapshot(covered=True)``."""
    data: dict[str, Any] = {
        "format": _FORM.tag,
        "version": _FORM.version,
        "torch": str(torch.__version__),
        "cpu": state.cpu,
        "devices": {t: dict(per) for t, per in state.devices.items()},
        "python": None,
        "numpy": None,
    }
    if state.python is not None:
        version, internal, gauss = state.python
        # (Through an array: torch.tensor over 625 Python ints is the slower way.)
        data["python"] = [version, torch.frombuffer(array.array("q", internal),
                                                    dtype=torch.int64), gauss]
    if state.numpy is not None:
        st = state.numpy
        key = torch.from_numpy(st["state"]["key"].astype("int64"))
        data["numpy"] = {"bit_generator": st["bit_generator"], "key": key,
                         "pos": int(st["state"]["pos"]), "has_gauss": int(st["has_gauss"]),
                         "gauss": float(st["gauss"])}
    for t, per in data["devices"].items():
        for i, device_state in per.items():
            check_plain(device_state, f"the {t}:{i} state")
    return data


def read_snapshot(data: Any, *, source: str, covered: bool = False) -> RNGState:
    """``RNGState.from_dict``; ``covered``: ``data`` is part of a state whose digest was
    verified, so it carries none of its own (``check_saved``)."""
    try:
        # ``source`` names where the data came from: a file, a TrainingRNG state, a broadcast.
        parts = read_parts(data, _FORM, source=source, covered=covered)
    except (DevRNGError, KeyboardInterrupt, SystemExit):
        raise
    except Exception as err:  # hostile input may fail in any way: one error class for it
        raise DevRNGError(
            f"{source} is not a valid devrng RNG snapshot: {short_repr(str(err), 200)}. Write "
            "snapshots with RNGState.save or RNGState.to_dict."
        ) from err
    state = RNGState(*parts)
    state._host_checked = True  # each part was checked
    return state


def parse_state(cpu: Any, devices: Any, python: Any = None, numpy: Any = None) -> RNGState:
    """An ``RNGState`` from the plain data ``to_dict`` writes, each part checked by
    ``parse_parts``; ``ValueError`` saying what is wrong ("its CPU state ...")."""
    state = RNGState(*parse_parts(cpu, devices, python, numpy))
    state._host_checked = True  # each part was checked
    return state


def with_devices(state: RNGState, devices: Mapping[str, Mapping[int, Any]], *,
                 python: bool = True, numpy: bool = True) -> RNGState:
    """``state`` with other device states (and without Python's or NumPy's when False);
    what was checked of its host parts stays checked."""
    new = RNGState(state.cpu, devices, state.python if python else None,
                   state.numpy if numpy else None)
    new._host_checked = state._host_checked
    return new


def check_host(state: RNGState) -> None:
    """Raise ``DevRNGError`` unless the CPU, Python and NumPy parts of ``state`` would install
    working generators (``check_host_parts``; once per snapshot)."""
    if not state._host_checked:
        check_host_parts(state.cpu, state.python, state.numpy)
        state._host_checked = True


def _check_exists(where: str, path: str) -> None:
    """A sentence instead of torch's traceback for a path that names no file."""
    if not os.path.exists(path):
        link = " (a symlink to a file that is gone)" if os.path.islink(path) else ""
        raise FileNotFoundError(
            f"There is no file {where}{link} to load an RNG snapshot from; pass the path that "
            "RNGState.save wrote (relative paths start from the current directory, "
            f"{os.getcwd()!r})."
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


# -- restoring: check all of it against this process, then set all of it, or nothing -----
@guard
def set_rng_state(state: RNGState) -> None:
    """Restore a snapshot: everything it covers, or, on any mismatch or failure, nothing.

    The whole snapshot is checked first (device types, device counts, state
    types, shapes and dtypes, and the CPU, Python and NumPy states in full); a
    mismatch raises ``DevRNGError`` before any generator changes. If setting a
    generator still fails, every generator already set is put back; a Ctrl-C
    that arrives meanwhile is raised once the snapshot is fully restored.

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
        raise TypeError(f"set_rng_state takes a devrng.RNGState, not {_what_state(state)}.")
    try:
        check_host(state)
        restore = prepare_restore(state)
        with Undo("Restoring the snapshot") as undo:
            restore.apply(undo)
    finally:
        deliver()


class Restore(NamedTuple):
    """A snapshot checked against this process and ready to apply (see ``prepare_restore``)."""

    state: RNGState
    targets: list[DeviceState]  # (backend, index, the state to set)
    reseed: tuple[Backend, ...] = ()  # backends whose devices the state has no state for
    seed: int = 0  # ... seeded with this

    def apply(self, undo: Undo) -> None:
        """Seed the devices the snapshot has no state for (``reseed``), then set every
        generator it holds, each one's current state pushed on ``undo`` first; the caller's
        ``with undo:`` puts them back if anything fails."""
        state = self.state
        for backend in self.reseed:  # every device of it, then the saved states over those
            undo.save_devices(read_devices([(backend, range(device_count(backend)))]))
            backend.manual_seed(self.seed)
        for backend, index, saved in self.targets:
            undo.save_devices([(backend, index, backend.get_rng_state(index))])
            backend.set_rng_state(saved, index)
        undo.save_cpu()
        _host.set_cpu_state(state.cpu)
        if state.python is not None:
            undo.save_python()
            _host.set_python_state(state.python)
        if state.numpy is not None:
            undo.save_numpy()
            _host.set_numpy_state(state.numpy)


def prepare_restore(state: RNGState, fit: Fit | None = None) -> Restore:
    """Check ``state``, whose host part is checked already, against this process without
    changing anything.

    Raises ``DevRNGError`` on any mismatch; the result's ``apply()`` restores it.
    Callers that restore more than one thing (``TrainingRNG``) check every
    part before applying any. ``fit`` (from ``fit_devices``): restore the device states
    that fit this process, and seed its devices the state has none for.
    """
    targets = check_device_states(state.devices if fit is None else fit.devices)
    return Restore(state, targets) if fit is None else Restore(state, targets, fit.reseed, fit.seed)


def _what_state(state: Any) -> str:
    """What ``set_rng_state`` got instead of a snapshot, and where that goes, in words."""
    if isinstance(state, Mapping):
        tag = state.get("format")
        if tag == "devrng.RNGState":
            return "a dict (RNGState.to_dict()): turn it into one with RNGState.from_dict(state)"
        if tag == "devrng.TrainingRNG" or any(str(k).startswith(PREFIX) for k in state):
            return ("the state_dict() of a TrainingRNG (or another devrng object): put it back "
                    "with that object's load_state_dict(state), e.g. rng.load_state_dict(state)")
    return (f"a {type(state).__name__}; get one from devrng.get_rng_state() or "
            "devrng.RNGState.load(path)")
