"""Saving generator states and putting them back: the one place devrng does either.

Everything in devrng that changes generators or settings -- a fork, restoring a
snapshot, seeding, a seeded call, a stream swap, loading a checkpoint,
``deterministic()`` -- first pushes onto an ``Undo`` stack what it is about to
change (the current value and the call that sets it) and only then changes it.
``Undo.run`` puts every entry back, newest first: all of them, even when one of
them fails or an interrupt (``KeyboardInterrupt``, ``SystemExit``) arrives half
way, because setting a saved value is idempotent and can simply be done again.
Failures are collected and reported once; interrupts always go on as
themselves, carrying the failures as notes.

``Undo`` is also a context manager for "all or nothing": if the block raises or
is interrupted anywhere, every pushed entry is put back before the error goes on.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any

from devrng._backends import host
from devrng._backends.registry import Backend, device_count, get_backend, started_types
from devrng._base.errors import DevRNGError
from devrng._base.sigint import deliver, guard

__all__ = ["DeviceState", "Undo", "around_cpu", "put_env", "read_devices", "read_started"]

#: One device generator's saved state: (backend, device index, state).
DeviceState = tuple[Backend, int, Any]
#: One entry of an undo stack: (what it puts back -- a name, or the backend of a device
#: whose index is the last argument --, a setter, the setter's arguments).
_Step = tuple[Any, Callable[..., object], tuple[Any, ...]]


def read_devices(plan: Iterable[tuple[Backend, Iterable[int]]]) -> list[DeviceState]:
    """The state of every device of ``plan`` ((backend, indices) pairs), read in order."""
    return [(backend, index, backend.get_rng_state(index))
            for backend, indices in plan for index in indices]


def _label(what: Any, args: tuple[Any, ...]) -> str:
    """An entry's name in messages: its own, or ``"<device type>:<index>"``."""
    return what if isinstance(what, str) else f"{what.name}:{args[-1]}"


def around_cpu(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, then torch's CPU generator put back as it was: ``Undo.around`` for
    the one generator of a CPU-only seeded call, without building a stack."""
    saved = host.get_cpu_state()
    try:
        out = fn(*args)
        host.set_cpu_state(saved)
    except BaseException:
        host.set_cpu_state(saved)  # once more if an interrupt came after the first (idempotent)
        raise
    return out


def put_env(name: str, value: str | None) -> None:
    """Set environment variable ``name`` to ``value``; ``None`` removes it."""
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def read_started() -> list[DeviceState]:
    """The state of every device of every type that has started (``started_types``)."""
    backends = [get_backend(name) for name in started_types()]
    return read_devices((b, range(device_count(b))) for b in backends)


class Undo:
    """A stack of values to put back, filled before each change is made.

    ``what`` names the operation in error messages ("fork_rng",
    "Restoring the snapshot", "manual_seed(7)"), ``kind`` what its entries are
    ("generator", "setting").

    Examples:
        >>> undo = Undo("example")
        >>> undo.save_cpu()
        >>> _ = torch.rand(3)           # a change to put back
        >>> undo.run()
    """

    __slots__ = ("_steps", "kind", "what", "wrap")

    def __init__(self, what: str, *, kind: str = "generator", wrap: bool = True) -> None:
        self.what = what
        self.kind = kind
        # As a context manager: turn a failure other than DevRNGError into one DevRNGError
        # that says everything was put back (False: let it go on as it is).
        self.wrap = wrap
        self._steps: list[_Step] = []

    def __bool__(self) -> bool:
        return bool(self._steps)

    @classmethod
    def of_plan(cls, what: str, plan: Iterable[tuple[Backend, Iterable[int]]], *,
                python: bool = False, numpy: bool = False) -> Undo:
        """An undo stack holding the CPU generator, every device of ``plan`` and, when asked
        for, Python's and NumPy's generators, as they are now (what a fork saves)."""
        undo = cls(what)
        steps = undo._steps
        steps.append(("cpu", host.set_cpu_state, (host.get_cpu_state(),)))
        if python:
            undo.save_python()
        if numpy:
            undo.save_numpy()
        for backend, indices in plan:
            setter, getter = backend.set_rng_state, backend.get_rng_state
            for index in indices:
                steps.append((backend, setter, (getter(index), index)))
        return undo

    # -- filling the stack ---------------------------------------------------------
    def push(self, label: str, setter: Callable[..., object], *args: Any) -> None:
        """Remember that ``setter(*args)`` puts ``label`` back as it is now."""
        self._steps.append((label, setter, args))

    def set_env(self, name: str, value: str | None) -> None:
        """Set environment variable ``name`` (``None``: remove it), remembering it first."""
        self._steps.append((name, put_env, (name, os.environ.get(name))))
        put_env(name, value)

    def save_cpu(self) -> None:
        """Torch's CPU generator."""
        self._steps.append(("cpu", host.set_cpu_state, (host.get_cpu_state(),)))

    def save_python(self) -> None:
        """Python's ``random``."""
        self._steps.append(("python", host.set_python_state, (host.get_python_state(),)))

    def save_numpy(self) -> None:
        """NumPy's global generator (nothing without NumPy)."""
        state = host.get_numpy_state()
        if state is not None:
            self._steps.append(("numpy", host.set_numpy_state, (state,)))

    def save_host(self, *, python: bool, numpy: bool) -> None:
        """The CPU generator, and Python's and NumPy's when asked for."""
        self.save_cpu()
        if python:
            self.save_python()
        if numpy:
            self.save_numpy()

    def save_devices(self, states: Iterable[DeviceState]) -> None:
        """Device states already read (``read_devices``), to be set back as they were."""
        for backend, index, state in states:
            self._steps.append((backend, backend.set_rng_state, (state, index)))

    def hand_over(self) -> Undo:
        """A new stack holding this one's entries, which ends empty: leaving its ``with``
        block then keeps every change, and the new stack can still undo them later."""
        kept = Undo(self.what, kind=self.kind, wrap=self.wrap)
        kept._steps, self._steps = self._steps, []
        return kept

    # -- putting back ----------------------------------------------------------------
    def _put_back(self) -> tuple[list[tuple[str, BaseException]], BaseException | None]:
        """Set every entry back; returns the failures and the first interrupt that came."""
        failed: list[tuple[str, BaseException]] = []
        interrupt: BaseException | None = None
        for what, setter, args in reversed(self._steps):
            try:
                setter(*args)
            except BaseException as err:  # the others are put back all the same
                if not isinstance(err, Exception):  # an interrupt: this entry once more
                    interrupt = interrupt or err
                    try:
                        setter(*args)
                        continue
                    except BaseException as again:
                        err = again
                failed.append((_label(what, args), err))
        return failed, interrupt

    def run(self, pending: BaseException | None = None) -> None:
        """Put back everything pushed, newest first, then empty the stack.

        A failure of one entry does not stop the others. Afterwards an
        interrupt that arrived meanwhile goes on as itself; failures raise one
        ``DevRNGError`` -- unless ``pending``, the exception already on its
        way out, is an interrupt: then the failures are attached to it as a
        note and this returns, so that it goes on as itself.
        """
        try:
            failed, interrupt = self._put_back()
        except BaseException as err:  # interrupted between two entries: all again (idempotent)
            failed, _ = self._put_back()
            interrupt = err
        self._steps.clear()
        if interrupt is not None:
            if failed:
                interrupt.add_note(self._message(failed))
            raise interrupt
        if failed:
            self._report(failed, pending)

    def around(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``, then put everything back, also when it fails or an
        interrupt lands anywhere in here (the changes to undo must be made inside ``fn``)."""
        try:
            out = fn(*args, **kwargs)
            self.run()
        except BaseException as err:
            self.run(pending=err)  # a second time does nothing if the first one finished
            raise
        return out

    def _message(self, failed: list[tuple[str, BaseException]]) -> str:
        detail = "; ".join(f"{label} ({type(e).__name__}: {e})" for label, e in failed)
        return (f"{self.what} could not restore {len(failed)} {self.kind}(s): {detail}. "
                f"Every other {self.kind} was restored.")

    def _report(self, failed: list[tuple[str, BaseException]],
                pending: BaseException | None) -> None:
        message = self._message(failed)
        interrupt = next((e for _, e in failed if not isinstance(e, Exception)), None)
        if interrupt is None and pending is not None and not isinstance(pending, Exception):
            interrupt = pending  # the block was interrupted: it goes on, carrying the failure
        if interrupt is not None:
            interrupt.add_note(message)
            if interrupt is pending:
                return
            raise interrupt
        raise DevRNGError(message) from failed[0][1]

    # -- all or nothing ------------------------------------------------------------
    def __enter__(self) -> Undo:
        return self

    @guard
    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            if exc is None:
                self._steps.clear()  # done: nothing to put back
                return
            self.roll_back(exc)
        finally:
            deliver()  # a Ctrl-C taken at this method's first line is raised now, not lost

    def roll_back(self, err: BaseException) -> None:
        """Put everything back after ``err``; the caller then raises ``err``.

        An interrupt goes on as itself, and so does any failure when ``wrap``
        is False; a failure to put something back is then a note on it.
        Otherwise a failure that is not already a ``DevRNGError`` becomes one
        ``DevRNGError`` that says what was put back (or what could not be),
        raised from ``err``.
        """
        try:
            self.run(pending=err)
        except DevRNGError as undo_err:
            if not isinstance(err, Exception) or not self.wrap:
                err.add_note(str(undo_err))
                return
            raise DevRNGError(
                f"{self.what} failed ({type(err).__name__}: {err}), and putting the generators "
                f"back failed too: {undo_err}"
            ) from err
        if self.wrap and isinstance(err, Exception) and not isinstance(err, DevRNGError):
            raise DevRNGError(
                f"{self.what} failed ({type(err).__name__}: {err}); every generator was put back "
                "as it was."
            ) from err
