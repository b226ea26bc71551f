"""Restoring a snapshot: check all of it against this process, then set all of it, or nothing.

``prepare_restore`` does every check that needs no change (device types, device
counts, each state's type, shape and dtype against this process's; the CPU, Python
and NumPy states are checked in full when the snapshot is parsed, or by ``check_host``
for one built by hand); ``fit_devices`` cuts a saved state to the devices this
process has, for a lenient resume; ``Restore.apply`` then sets every generator,
pushing each one's current state onto an ``Undo`` stack first, so that a
failure or an interrupt anywhere puts every generator back.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from devrng._backends import host as _host
from devrng._backends.registry import (
    Backend,
    available_backends,
    device_count,
    get_backend,
    started_types,
)
from devrng._base.errors import DevRNGError
from devrng._base.plain import describe, signature
from devrng._base.seeds import MASK64
from devrng._base.sigint import deliver, guard
from devrng._generators.snapshot import RNGState, check_host
from devrng._generators.undo import DeviceState, Undo, read_devices

__all__ = ["Fit", "Restore", "fit_devices", "prepare_restore", "set_rng_state"]


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
        raise TypeError(
            f"set_rng_state takes a devrng.RNGState, not a {type(state).__name__}; get one from "
            "devrng.get_rng_state() or devrng.RNGState.load(path)."
        )
    try:
        check_host(state)
        restore = prepare_restore(state)
        with Undo("Restoring the snapshot") as undo:
            restore.apply(undo)
    finally:
        deliver()


guard(set_rng_state)


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
    targets: list[DeviceState] = []
    for name, per in (state.devices if fit is None else fit.devices).items():
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
    return Restore(state, targets) if fit is None else Restore(state, targets, fit.reseed, fit.seed)


class Fit(NamedTuple):
    """What of a saved state fits this process's devices (see ``fit_devices``)."""

    devices: dict[str, dict[int, Any]]  # the device states to restore
    skipped: list[str]  # what is not restored, as phrases
    reseed: tuple[Backend, ...]  # backends with devices the state holds no state for
    seed: int  # ... seeded with this


def fit_devices(state: RNGState, *, strict: bool, seed: int) -> Fit:
    """The device states of ``state`` this process has devices for, and what does not fit:
    devices it lacks (left out), and devices or started types the state lacks (to seed
    with ``seed``). With ``strict``, the first misfit raises ``ValueError`` saying what it
    is."""
    kept: dict[str, dict[int, Any]] = {}
    skipped: list[str] = []
    reseed: list[Backend] = []
    here = {name: get_backend(name) for name in available_backends()}
    for name, per in state.devices.items():
        backend = here.get(name)
        count = 0 if backend is None else device_count(backend)
        fits = {i: s for i, s in per.items() if i < count}
        lost = sorted(set(per) - set(fits))
        if lost and strict:
            raise ValueError(f"the state holds {name} devices {lost}, and this process has "
                             f"{count} {name} device(s)")
        if lost:
            skipped.append(f"{name} devices {lost} (this process has {count})")
        if fits:
            kept[name] = fits
        if backend is not None and len(fits) < count:
            if strict:
                raise ValueError(f"this process has {count} {name} device(s), and the state "
                                 f"holds {len(fits)}")
            reseed.append(backend)
            skipped.append(f"{name} devices {sorted(set(range(count)) - set(fits))} "
                           "(none saved: seeded from the seed and this rank)")
    for name in started_types():
        if name in state.devices:
            continue
        if strict:
            raise ValueError(f"this process uses {name} devices, and the state holds none")
        reseed.append(here[name])
        skipped.append(f"{name} devices (none saved: seeded from the seed and this rank)")
    return Fit(kept, skipped, tuple(reseed), seed)


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
