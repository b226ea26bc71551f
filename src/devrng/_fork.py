"""``fork_rng``: torch.random.fork_rng that forks every device type it is given."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

import torch

from devrng._errors import check_flags
from devrng._host import get_cpu_state, set_cpu_state
from devrng._plan import make_plan
from devrng._sigint import deliver, guard
from devrng._undo import Undo

__all__ = ["fork_rng"]

F = TypeVar("F", bound=Callable[..., Any])

_Tensor = torch.Tensor
# Containers that inference walks as they are; any other iterable (range, a
# generator) is listed once first, as torch does, since it may be consumed.
_WALKED = (list, tuple, dict, set, frozenset, str, torch.device, torch.Tensor,
           torch.nn.Module, torch.Generator, int)


class _Args(NamedTuple):
    """A fork's arguments, as ``torch.random.fork_rng`` takes them plus devrng's host switches."""

    devices: Any
    enabled: bool
    caller: str
    devices_kw: str
    device_type: Any
    python: bool
    numpy: bool


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


class Fork:
    """What ``fork_rng`` returns: a context manager and decorator.

    The same object may be entered again while open (nesting, recursion):
    each entry keeps its own saved states, the innermost last.
    """

    __slots__ = ("_args", "_cpu_only", "_open")

    def __init__(self, args: _Args) -> None:
        self._args = args
        # devices=[...] with nothing else: when the list is empty on entry, the CPU
        # generator alone is forked, with no plan to make.
        self._cpu_only = (args.devices.__class__ is list and args.enabled is True
                          and args.device_type is None and not args.python and not args.numpy)
        self._open: list[Any] = []  # per open entry: a CPU state, an Undo, or None

    def __enter__(self) -> None:
        try:
            args = self._args
            saved: Any
            if self._cpu_only and not args.devices:
                saved = get_cpu_state()
            elif not args.enabled or args.device_type == "meta":  # as torch: meta has none
                saved = None
            else:
                plan = make_plan(args.devices, args.device_type, caller=args.caller,
                                 devices_kw=args.devices_kw)
                # Everything is read before anything could be restored, so an error here
                # (a backend that cannot read its state) leaves nothing half-forked.
                saved = Undo.of_plan(args.caller, plan, python=args.python, numpy=args.numpy)
        except BaseException:
            deliver()
            raise
        # Nothing changed yet: a Ctrl-C noted meanwhile is raised before the entry is added,
        # and no call (no check point) comes between adding it and returning.
        deliver()
        self._open += [saved]

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        # A real Ctrl-C is noted, not raised, until deliver() (devrng._sigint). An interrupt
        # raised here all the same (a line-level one) finds the entry still open, dropped
        # last (`del` runs no Python code), and puts everything back again (idempotent).
        try:
            saved = self._open[-1]
            if saved.__class__ is _Tensor:
                set_cpu_state(saved)
            elif saved is not None:
                saved.run(pending=exc)
            del self._open[-1]
        except BaseException as err:
            saved = self._open[-1]
            del self._open[-1]
            if saved is not None and not isinstance(err, Exception):
                if saved.__class__ is _Tensor:
                    set_cpu_state(saved)
                else:
                    saved.run(pending=err)
            raise
        finally:
            deliver()

    def __call__(self, fn: F) -> F:
        args = self._args
        if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
            kind = "async generator" if inspect.isasyncgenfunction(fn) else "generator"
            raise TypeError(
                f"fork_rng cannot decorate the {kind} function {fn.__qualname__}: its body runs "
                "between yields, outside any block the decorator could open. Use "
                "`with devrng.fork_rng(...):` inside it, around the draws to fork."
            )
        # A new Fork per call: concurrent calls (threads, tasks) never share saved states.
        # No `with` statement: its exit runs after a line that an interrupt could take
        # before __exit__ is called; here the exit is the try block's last step.
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def forked_async(*a: Any, **k: Any) -> Any:
                fork = Fork(args)
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
            fork = Fork(args)
            try:
                fork.__enter__()
                out = fn(*a, **k)
                fork.__exit__(None, None, None)
            except BaseException as err:
                fork._leave(err)
                raise
            return out

        return forked  # type: ignore[return-value]

    def _leave(self, err: BaseException) -> None:
        """Exit with ``err`` unless this (decorator's own) fork is not open any more."""
        try:
            if self._open:
                self.__exit__(type(err), err, err.__traceback__)
        finally:
            deliver()


guard(Fork.__enter__)
guard(Fork.__exit__)
guard(Fork._leave)


def _listed(devices: Any, kw: str) -> list[Any]:
    """Any other iterable, listed once (a generator or range may be consumed)."""
    if callable(devices):
        raise TypeError(
            f"fork_rng got the callable {devices!r} as {kw}; to decorate a function "
            "write @fork_rng() with parentheses."
        )
    if isinstance(devices, (bytes, bytearray, memoryview)):
        raise TypeError(
            f"fork_rng got {kw}={devices!r} (a {type(devices).__name__}); pass device strings "
            "such as 'cuda:0', not bytes."
        )
    try:
        return list(devices)
    except TypeError:
        raise TypeError(
            f"fork_rng got {kw}={devices!r} (a {type(devices).__name__}), which is neither a "
            "device nor a collection of them; pass a list of ints, device strings, "
            "torch.device objects, tensors or modules."
        ) from None
