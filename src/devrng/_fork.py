"""``fork_rng``: torch.random.fork_rng that forks every device type it is given."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

import torch

from devrng import _host
from devrng._errors import DevRNGError, add_note, check_flags
from devrng._plan import make_plan

__all__ = ["fork_rng", "restore_all"]

F = TypeVar("F", bound=Callable[..., Any])

_cpu = torch.default_generator
_get_cpu = _cpu.get_state
_set_cpu = _cpu.set_state
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


_DEFAULT_ARGS = _Args([], True, "fork_rng", "devices", None, False, False)


class fork_rng:
    """Fork the RNG of the CPU and of every device type in ``devices``; restore on exit.

    A drop-in for ``torch.random.fork_rng``: device types are inferred from
    ``devices`` (tensors, modules, ``"xla:0"``, ...) instead of assumed, so one
    call covers CUDA, XPU, MPS, XLA and torchax together. Use it as a context
    manager or a decorator (also of ``async def`` functions); forks nest.

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

    __slots__ = ("_args", "_device_type", "_devices", "_outer", "_state")

    def __init__(
        self,
        devices: Any = None,
        enabled: bool = True,
        _caller: str = "fork_rng",
        _devices_kw: str = "devices",
        device_type: Any = None,
        *,
        python: bool = False,
        numpy: bool = False,
    ) -> None:
        # The state of the innermost active entry; entries of the same object that are
        # still open around it (nesting, recursion) wait in _outer.
        self._state: Any = None
        self._outer: list[Any] | None = None
        self._device_type = device_type
        if devices.__class__ is list and enabled is True and python is False \
                and numpy is False and _caller == "fork_rng" and _devices_kw == "devices":
            # The shapes that run once per step or layer keep no argument record:
            # devices=[...] (read on entry), with or without a device_type.
            self._devices = devices
            self._args: _Args | None = None
            return
        if devices is not None and devices.__class__ is not list and not isinstance(devices, _WALKED):
            devices = _listed(devices, _devices_kw)
        check_flags(python=python, numpy=numpy)
        self._devices = devices
        self._args = _Args(devices, enabled, _caller, _devices_kw, device_type, python, numpy)

    def __enter__(self) -> None:
        args = self._args
        if args is None:
            if self._device_type is None and not self._devices:  # the one CPU-only test
                state: Any = _get_cpu()
            elif self._device_type == "meta":  # as torch: meta has no generators, fork nothing
                return
            else:
                plan = make_plan(self._devices, self._device_type)
                if len(plan) == 1 and len(plan[0][1]) == 1:  # one device, as checkpoint forks
                    backend, (index,) = plan[0]
                    state = (_get_cpu(), [(backend, index, backend.get_rng_state(index))],
                             None, None)
                else:
                    state = _capture(plan, False, False)
        elif args.enabled and args.device_type != "meta":
            plan = make_plan(args.devices, args.device_type, caller=args.caller,
                             devices_kw=args.devices_kw)
            state = _capture(plan, args.python, args.numpy)
        else:
            return
        if self._state is not None:
            if self._outer is None:
                self._outer = []
            self._outer.append(self._state)
        self._state = state

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        state = self._state
        if state is None:  # disabled
            return
        self._state = self._outer.pop() if self._outer else None
        if state.__class__ is _Tensor:  # CPU only
            _set_cpu(state)
            return
        cpu, devices, py, np = state
        first: BaseException | None = None
        if py is None and np is None:
            try:
                for backend, index, saved in devices:
                    backend.set_rng_state(saved, index)
                _set_cpu(cpu)
                return
            except BaseException as err:
                first = err  # setting a state is idempotent: start over, collecting failures
        interrupted = first is not None and not isinstance(first, Exception)
        what = "fork_rng" if self._args is None else self._args.caller
        restore_all(cpu, devices, py, np, what=what,
                    pending=first if interrupted else exc)  # type: ignore[arg-type]
        if interrupted:
            raise first  # type: ignore[misc]  # it arrived while restoring; all is back now

    def __call__(self, fn: F) -> F:
        args = self._args or _DEFAULT_ARGS._replace(devices=self._devices,
                                                   device_type=self._device_type)
        devices, enabled, caller, kw, device_type, python, numpy = args
        if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
            kind = "async generator" if inspect.isasyncgenfunction(fn) else "generator"
            raise TypeError(
                f"fork_rng cannot decorate the {kind} function {fn.__qualname__}: its body runs "
                "between yields, outside any block the decorator could open. Use "
                "`with devrng.fork_rng(...):` inside it, around the draws to fork."
            )
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def forked_async(*a: Any, **k: Any) -> Any:
                with fork_rng(devices, enabled, caller, kw, device_type, python=python,
                              numpy=numpy):
                    return await fn(*a, **k)

            return forked_async  # type: ignore[return-value]

        @functools.wraps(fn)
        def forked(*a: Any, **k: Any) -> Any:
            with fork_rng(devices, enabled, caller, kw, device_type, python=python, numpy=numpy):
                return fn(*a, **k)

        return forked  # type: ignore[return-value]


def _capture(plan: Any, python: bool, numpy: bool) -> tuple[Any, ...]:
    # Everything is read before anything could be restored, so an error here
    # (a backend that cannot read its state) leaves nothing half-forked.
    return (
        _get_cpu(),
        [(b, i, b.get_rng_state(i)) for b, indices in plan for i in indices],
        _host.get_python_state() if python else None,
        _host.get_numpy_state() if numpy else None,
    )


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


def restore_all(cpu: torch.Tensor | None, devices: Any, py: Any, np: Any, *, what: str,
                pending: BaseException | None = None) -> None:
    """Put every saved state back; a failure of any kind does not stop the others.

    Afterwards, an interrupt (``KeyboardInterrupt``, ``SystemExit``) raised by a
    restore is re-raised as itself; other failures raise ``DevRNGError`` --
    unless ``pending``, the exception already on its way out, is an interrupt:
    then the failure is attached to it as a note and this returns, so that it
    goes on as itself. In a ``finally`` block pass ``sys.exc_info()[1]``.
    """
    failed: list[tuple[str, BaseException]] = []
    for backend, index, state in devices:
        try:
            backend.set_rng_state(state, index)
        except BaseException as err:
            failed.append((f"{backend.name}:{index}", err))
    host: tuple[tuple[str, Callable[[Any], object], Any], ...] = (
        ("cpu", _set_cpu, cpu),
        ("python", _host.set_python_state, py),
        ("numpy", _host.set_numpy_state, np),
    )
    for label, setter, state in host:
        if state is not None:
            try:
                setter(state)
            except BaseException as err:
                failed.append((label, err))
    if not failed:
        return
    detail = "; ".join(f"{name} ({type(e).__name__}: {e})" for name, e in failed)
    message = (f"{what} could not restore {len(failed)} generator(s): {detail}. Every other "
               "generator was restored.")
    interrupt = next((e for _, e in failed if not isinstance(e, Exception)), None)
    if interrupt is None and pending is not None and not isinstance(pending, Exception):
        interrupt = pending  # the body was interrupted: it goes on, carrying the failure
    if interrupt is not None:
        add_note(interrupt, message)
        if interrupt is pending:
            return
        raise interrupt
    raise DevRNGError(message) from failed[0][1]
