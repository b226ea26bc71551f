"""``fork_rng``: torch.random.fork_rng that forks every device type it is given."""

from __future__ import annotations

import atexit
import functools
import inspect
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

import torch

from devrng._backends.host import get_cpu_state, set_cpu_state
from devrng._base.errors import check_flags, short_repr, warn_and_log
from devrng._base.sigint import PENDING, deliver, guard
from devrng._generators.plan import make_plan
from devrng._generators.undo import Undo

__all__ = ["fork_rng"]

F = TypeVar("F", bound=Callable[..., Any])

_Tensor = torch.Tensor
# Containers that inference walks as they are; any other iterable (range, a
# generator) is listed once first, as torch does, since it may be consumed.
_WALKED = (list, tuple, dict, set, frozenset, str, torch.device, torch.Tensor,
           torch.nn.Module, torch.Generator, int)


class _Threads(threading.local):
    """Per thread, its open fork entries, oldest first: a fork exited while one entered after
    it is still open puts the generators back under that one's feet, so it says so (torch
    does not)."""

    def __init__(self) -> None:
        self.forks: list[Fork] = []


_threads = _Threads()


class _Args(NamedTuple):
    """A fork's arguments, as ``torch.random.fork_rng`` takes them plus devrng's host switches."""

    devices: Any
    enabled: bool
    caller: str
    devices_kw: str
    device_type: Any
    python: bool
    numpy: bool


class _Unentered(weakref.ref):  # type: ignore[type-arg]
    """A weak reference that a fork holds until it is entered or made a decorator. If the fork
    is freed first, the reference is appended to ``_FREED`` by ``list.append`` (a C function:
    no Python code runs while the fork is freed, so a Ctrl-C cannot land there and be swallowed,
    as one raised inside a finalizer is). The next fork_rng call, or the interpreter's exit,
    says so.

    ``where`` is set last: the code and instruction that called fork_rng, or None. Reading
    them costs more than the rest of a fork's making (a frame object), so forks record it
    only once one was found never entered (``_LOCATING``), as Python names where a coroutine
    never awaited was made only under tracemalloc. A fork whose making was interrupted has no
    ``where`` and is not reported."""

    __slots__ = ("where",)
    where: tuple[Any, int] | None


_FREED: list[_Unentered] = []
_note_freed = _FREED.append
_LOCATING = [False]


def _maker() -> tuple[Any, int] | None:
    """Where the fork being made was asked for (the caller of fork_rng), when forks record it."""
    if not _LOCATING[0]:
        return None
    caller = sys._getframe(3)  # (0: here, 1: the fork's __init__, 2: fork_rng)
    return caller.f_code, caller.f_lasti


def fork_rng(devices: Any = None, enabled: bool = True, _caller: str = "fork_rng",
             _devices_kw: str = "devices", device_type: Any = None, *, python: bool = False,
             numpy: bool = False) -> Fork:
    """Fork the RNG of the CPU and of every device type in ``devices``; restore it on exit.

    A drop-in for ``torch.random.fork_rng``: device types are inferred from
    ``devices`` (tensors, modules, ``"xla:0"``, ...) instead of assumed, so one
    call covers CUDA, XPU, MPS, XLA and torchax together. Use it as a context
    manager or a decorator (also of ``async def`` functions); forks nest. On
    exit, normal or by exception, every forked generator is put back; a failure
    to put one back does not stop the others.

    Args:
        devices: What to fork: tensors, modules, device strings (``"xpu:1"``,
            ``"cuda"``), ``torch.device`` and ``torch.Generator`` objects, and
            ints (indices of ``device_type``), in any nesting of lists, tuples,
            dicts and sets. Read when the block is entered, as torch reads it.
            ``[]`` forks the CPU only; ``None`` forks every device of
            ``device_type`` or, without one, the current accelerator and
            XLA / torchax where this process uses them.
        enabled: ``False`` forks nothing, as in torch.
        device_type: A device type (``"cuda"``, ``"xla"``, ...) or a sequence
            of them. With ``devices=None`` every device of each is forked;
            otherwise it is the type that bare ints in ``devices`` index.
            ``"meta"`` forks nothing, as in torch.
        python: Also fork Python's ``random``.
        numpy: Also fork NumPy's global generator.

    Returns:
        A context manager that is also a decorator: each call of a decorated
        function runs inside a fork of its own.

    Raises:
        TypeError: ``devices`` or ``device_type`` holds something that names no
            device, or a flag is not ``True`` / ``False``.
        ValueError: A device or device type does not exist here, or bare ints
            fit no single device type.
        ImportError: A device type needs a package that is not installed
            (torch_xla, torchax); the message says what to install.
        DevRNGError: A generator could not be restored on exit; every other
            generator was restored.

    Examples:
        >>> x = torch.ones(2)
        >>> with devrng.fork_rng(devices=[x]):
        ...     a = torch.rand(2)
        >>> torch.equal(a, torch.rand(2))   # the block's draws were undone
        True
    """
    if _FREED:
        _say_freed()
    if devices.__class__ is list and enabled is True and device_type is None \
            and python is False and numpy is False:
        return CpuFork(devices, _caller, _devices_kw)  # the common call, made cheap
    if devices is not None and devices.__class__ is not list and not isinstance(devices, _WALKED):
        devices = _listed(devices, _devices_kw)
    if python.__class__ is not bool or numpy.__class__ is not bool:
        check_flags(python=python, numpy=numpy)
    return Fork(_Args(devices, enabled, _caller, _devices_kw, device_type, python, numpy))


# torch's private parameters stay accepted (third-party code passes them positionally)
# but are not shown: help() and the API reference show what users pass.
fork_rng.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [p for name, p in inspect.signature(fork_rng).parameters.items() if not name.startswith("_")],
    return_annotation=inspect.signature(fork_rng).return_annotation)


def _saved_for(args: _Args) -> Any:
    """What a fork entered with ``args`` keeps to put back: a CPU state, an ``Undo`` of
    every generator it covers, or None (nothing forked)."""
    if not args.enabled or args.device_type == "meta":  # as torch: meta has no generators
        return None
    if (args.devices.__class__ is list and not args.devices and args.device_type is None
            and not args.python and not args.numpy):
        return get_cpu_state()
    plan = make_plan(args.devices, args.device_type, caller=args.caller,
                     devices_kw=args.devices_kw)
    # Everything is read before anything could be restored, so an error here (a backend
    # that cannot read its state) leaves nothing half-forked.
    return Undo.of_plan(args.caller, plan, python=args.python, numpy=args.numpy)


class Fork:
    """What ``fork_rng`` returns: a context manager and decorator.

    The same object may be entered again while open (nesting, recursion):
    each entry keeps its own saved states, the innermost last. A Ctrl-C taken
    in ``__enter__`` or ``__exit__`` is raised when they end (``devrng._base.sigint``);
    ``if PENDING[0]: deliver()`` is that check, inline on this hot path.
    """

    __slots__ = ("__weakref__", "_args", "_open", "_unentered")

    def __init__(self, args: _Args, *, made_by_user: bool = True) -> None:
        self._args = args
        self._open: list[Any] = []  # per open entry: a CPU state, an Undo, or None
        self._unentered: _Unentered | None = None
        if made_by_user:  # (where is set last: nothing can stop __init__ after it)
            self._unentered = ref = _Unentered(self, _note_freed)
            ref.where = _maker()

    def _entry(self) -> Any:
        return _saved_for(self._args)

    def _fresh(self) -> Fork:
        """A new fork of the same arguments (one per call of a decorated function)."""
        return Fork(self._args, made_by_user=False)

    @guard
    def __enter__(self) -> None:
        self._unentered = None
        try:
            saved = self._entry()
            opened = _threads.forks
        except BaseException:
            deliver()
            raise
        # Nothing changed yet: a Ctrl-C noted meanwhile is raised before the entry is added,
        # and no call (no check point) comes between adding it and returning.
        if PENDING[0]:
            deliver()
        self._open += [saved]
        opened += [self]

    @guard
    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        # A real Ctrl-C is noted, not raised, until deliver() (devrng._base.sigint). An interrupt
        # raised here all the same (a line-level one) finds the entry still open, dropped
        # last (`del` runs no Python code), and puts everything back again (idempotent).
        try:
            saved = self._open[-1]
            opened: list[Fork] | None = _threads.forks  # (empty: entered in another thread)
            if opened and opened[-1] is self:
                del opened[-1]
                opened = None
            if saved.__class__ is _Tensor:
                set_cpu_state(saved)
            elif saved is not None:
                saved.run(pending=exc)
            del self._open[-1]
        except BaseException as err:
            saved = self._open[-1]
            del self._open[-1]
            opened = _threads.forks
            if opened and opened[-1] is self:  # interrupted before it was taken off
                del opened[-1]
            if saved is not None and not isinstance(err, Exception):
                if saved.__class__ is _Tensor:
                    set_cpu_state(saved)
                else:
                    saved.run(pending=err)
            raise
        finally:
            if PENDING[0]:
                deliver()
        if opened:  # not this thread's newest open fork: said once everything is put back
            try:
                _exited_out_of_order(self, opened)
            finally:
                if PENDING[0]:
                    deliver()

    def __call__(self, fn: F) -> F:
        self._unentered = None
        if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
            kind = "async generator" if inspect.isasyncgenfunction(fn) else "generator"
            raise TypeError(
                f"fork_rng cannot decorate the {kind} function {fn.__qualname__}: its body runs "
                "between yields, outside any block the decorator could open. Use "
                "`with devrng.fork_rng(...):` inside it, around the draws to fork."
            )
        # A new Fork per call: concurrent calls (threads, tasks) never share saved states.
        # No `with` statement: its exit runs after a line that an interrupt could take
        # before __exit__ is called; here the exit is the try block's last step. The two
        # wrappers differ only by `await`, which no shared helper can hold without turning
        # the plain one into a generator to drive.
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def forked_async(*a: Any, **k: Any) -> Any:
                fork = self._fresh()
                try:
                    fork.__enter__()
                    out = await fn(*a, **k)
                    fork.__exit__(None, None, None)
                except BaseException as err:
                    fork._leave(err)
                    raise
                return out

            return forked_async  # type: ignore[return-value]

        @functools.wraps(fn)
        def forked(*a: Any, **k: Any) -> Any:
            fork = self._fresh()
            try:
                fork.__enter__()
                out = fn(*a, **k)
                fork.__exit__(None, None, None)
            except BaseException as err:
                fork._leave(err)
                raise
            return out

        return forked  # type: ignore[return-value]

    @guard
    def _leave(self, err: BaseException) -> None:
        """Exit with ``err`` unless this (decorator's own) fork is not open any more."""
        try:
            if self._open:
                self.__exit__(type(err), err, err.__traceback__)
        finally:
            deliver()


class CpuFork(Fork):
    """``fork_rng(devices=[...])`` and nothing else, the most common call (torch's own RNG
    sites make it): while the list is empty on entry, the CPU generator alone, with no
    argument record to build. A list filled after the call is honoured."""

    __slots__ = ("_caller", "_devices", "_devices_kw")

    def __init__(self, devices: list[Any], caller: str, devices_kw: str, *,
                 made_by_user: bool = True) -> None:
        self._devices = devices
        self._caller = caller
        self._devices_kw = devices_kw
        self._open = []
        self._unentered = None
        if made_by_user:
            self._unentered = ref = _Unentered(self, _note_freed)
            ref.where = _maker()

    def _entry(self) -> Any:
        return _saved_for(_Args(self._devices, True, self._caller, self._devices_kw, None,
                                False, False))

    @guard
    def __enter__(self) -> None:  # Fork.__enter__ with the CPU's state read in line
        self._unentered = None
        try:
            saved = get_cpu_state() if not self._devices else self._entry()
            opened = _threads.forks
        except BaseException:
            deliver()
            raise
        if PENDING[0]:
            deliver()
        self._open += [saved]
        opened += [self]

    def _fresh(self) -> Fork:
        return CpuFork(self._devices, self._caller, self._devices_kw, made_by_user=False)


def _say_freed(at_exit: bool = False) -> None:
    """Warn of every fork freed without being entered: at the line that made it where that was
    recorded, else at the line of the fork_rng call that found it (from then on, forks record
    their line). Python's default filter says each line once."""
    while _FREED:
        try:
            ref = _FREED.pop()
        except IndexError:  # (another thread took the last one)
            return
        if not hasattr(ref, "where"):  # its making was interrupted: it was never the user's
            continue
        _LOCATING[0] = True
        said = ("devrng.fork_rng(...) was called but never entered, so it forked nothing: write "
                "`with devrng.fork_rng(...):` around the draws to fork, or use it as a "
                "decorator (@devrng.fork_rng(...)).")
        if ref.where is None:
            warn_and_log(said + (" (Found at the program's exit: the line that made it is "
                                 "named for forks made after a first one was found.)"
                                 if at_exit else " (Found by the fork_rng call here, which "
                                 "came after it; from now on the warning names the line that "
                                 "made such a fork.)"), stacklevel=3)
            continue
        code, lasti = ref.where
        line = next((ln for start, end, ln in code.co_lines() if start <= lasti < end), None)
        warn_and_log(said, at=(code.co_filename, line or code.co_firstlineno))


atexit.register(_say_freed, at_exit=True)  # forks freed after the last fork_rng call


def _exited_out_of_order(fork: Fork, opened: list[Fork]) -> None:
    """Take ``fork``'s newest entry off ``opened`` (this thread's open forks) and warn of the
    forks entered after it and still open."""
    if fork not in opened:  # entered in another thread: no order to judge
        return
    at = len(opened) - 1 - opened[::-1].index(fork)
    later = len(opened) - 1 - at
    del opened[at]
    warn_and_log(
        f"fork_rng: a fork was exited while {later} fork(s) entered after it in this thread "
        "are still open. It put the generators back as they were when it was entered; each "
        "later fork will put back, when it exits, what it saw at its own entry, so the "
        "generators will not end as they were before the outer fork. Exit forks newest first "
        "(nested with-blocks do; with ExitStack or __enter__/__exit__ calls, close them in "
        "reverse order; concurrent async tasks or threads must not share a fork's span).",
        stacklevel=3)


def _listed(devices: Any, kw: str) -> list[Any]:
    """Any other iterable, listed once (a generator or range may be consumed)."""
    if callable(devices):
        raise TypeError(
            f"fork_rng got the callable {short_repr(devices)} as {kw}; to decorate a function "
            "write @fork_rng() with parentheses."
        )
    if isinstance(devices, (bytes, bytearray, memoryview)):
        raise TypeError(
            f"fork_rng got {kw}={short_repr(devices)} (a {type(devices).__name__}); pass device strings "
            "such as 'cuda:0', not bytes."
        )
    try:
        return list(devices)
    except TypeError:
        raise TypeError(
            f"fork_rng got {kw}={short_repr(devices)} (a {type(devices).__name__}), which is neither a "
            "device nor a collection of them; pass a list of ints, device strings, "
            "torch.device objects, tensors or modules."
        ) from None
