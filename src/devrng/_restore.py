"""Restoring a snapshot: check all of it against this process, then set all of it, or nothing.

``prepare_restore`` does every check that needs no change (device types, device
counts, each state's type, shape and dtype against this process's, the CPU,
Python and NumPy states in full); ``Restore.apply`` then sets every generator,
pushing each one's current state onto an ``Undo`` stack first, so that a
failure or an interrupt anywhere puts every generator back.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from devrng import _host
from devrng._errors import DevRNGError
from devrng._plain import describe, signature
from devrng._registry import device_count, get_backend
from devrng._seeds import MASK64
from devrng._state import RNGState
from devrng._undo import DeviceState, Undo

__all__ = ["Restore", "prepare_restore", "set_rng_state"]


def set_rng_state(state: RNGState) -> None:
    """Restore a snapshot: everything it covers, or, on any mismatch or failure, nothing.

    The whole snapshot is checked first (device types, device counts, state
    types, shapes and dtypes, and the CPU, Python and NumPy states in full); a
    mismatch raises ``DevRNGError`` before any generator changes. If setting a
    generator still fails, or an interrupt arrives, every generator already
    set is put back.

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
    restore = prepare_restore(state)
    with Undo("Restoring the snapshot") as undo:
        restore.apply(undo)


class Restore(NamedTuple):
    """A snapshot checked against this process and ready to apply (see ``prepare_restore``)."""

    state: RNGState
    targets: list[DeviceState]  # (backend, index, the state to set)

    def apply(self, undo: Undo) -> None:
        """Set every generator the snapshot holds, each one's current state pushed on ``undo``
        first; the caller's ``with undo:`` puts them back if anything fails."""
        state = self.state
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


def prepare_restore(state: RNGState) -> Restore:
    """Check ``state`` in full against this process without changing anything.

    Raises ``DevRNGError`` on any mismatch; the result's ``apply()`` restores it.
    Callers that restore more than one thing (``TrainingRNG``) check every
    part before applying any.
    """
    _check_host(state)
    targets: list[DeviceState] = []
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
            _check_device_state(backend.name, index, saved, backend.get_rng_state, "snapshot")
            targets.append((backend, index, saved))
    return Restore(state, targets)


def _check_device_state(name: str, index: int, saved: Any, read: Any, whose: str) -> None:
    """A saved device state must have the type, shape and dtype of this process's own."""
    try:
        current = read(index)
    except Exception as err:
        raise DevRNGError(
            f"Restoring the {whose} failed before changing anything: reading this process's "
            f"{name}:{index} state raised {type(err).__name__}: {err}."
        ) from err
    if signature(saved) != signature(current):
        raise DevRNGError(
            f"The {whose}'s {name}:{index} state is {describe(saved)}, but this process's is "
            f"{describe(current)}; it was taken with another backend or library version."
        )
    if type(saved) is int and not 0 <= saved <= MASK64:
        raise DevRNGError(f"The {whose}'s {name}:{index} state is {saved}, outside [0, 2**64).")


def _check_host(state: RNGState) -> None:
    """The CPU, Python and NumPy parts of a snapshot, checked as fully as from_dict checks them."""
    try:
        _host.check_cpu_state(state.cpu)
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
