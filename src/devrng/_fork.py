"""``fork_rng``: torch.random.fork_rng that forks every device type it is given."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from devrng import _host
from devrng._errors import DevRNGError
from devrng._plan import make_plan, plan_tensors

__all__ = ["fork_rng", "restore_all"]

F = TypeVar("F", bound=Callable[..., Any])

_cpu = torch.default_generator
_get_cpu = _cpu.get_state
_set_cpu = _cpu.set_state
_OFF, _CPU, _ALL = "off", "cpu", "all"
_CPU_ARGS: tuple[Any, ...] = ([], True, "fork_rng", "devices", None, False, False)  # the hot path's arguments
# Containers that inference walks as they are; any other iterable (range, a
# generator) is listed once first, as torch does, since it may be consumed.
_WALKED = (list, tuple, dict, set, frozenset, str, torch.device, torch.Tensor,
           torch.nn.Module, torch.Generator, int)


class fork_rng:
    """Fork the RNG of the CPU and of every device type in ``devices``; restore on exit.

    A drop-in for ``torch.random.fork_rng``: device types are inferred from
    ``devices`` (tensors, modules, ``"xla:0"``, ...) instead of assumed, so one
    call covers CUDA, XPU, MPS, XLA and torchax together. Use it as a context
    manager or a decorator.

    Example:
        >>> x = torch.ones(2, device="xla")
        >>> with devrng.fork_rng(devices=[x]):
        ...     torch.nn.functional.dropout(x)  # XLA and CPU state restored on exit
    """

    __slots__ = ("_args", "_mode", "_outer", "_plan", "_state")

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
        tdev = devices.__class__
        if tdev is list and enabled and not devices and device_type is None \
                and not python and not numpy:
            # The hot path, `devices=[]`: one get_state / set_state pair on the CPU.
            self._mode = _CPU
            return
        if devices is not None and tdev is not list and not isinstance(devices, _WALKED):
            if callable(devices):
                raise TypeError(
                    f"fork_rng got the callable {devices!r} as devices; to decorate a function "
                    "write @fork_rng() with parentheses."
                )
            devices = list(devices)  # a generator or range may be consumed: list it once
        self._args = (devices, enabled, _caller, _devices_kw, device_type, python, numpy)
        self._plan: Any = None
        if not enabled or device_type == "meta":
            self._mode = _OFF
        elif device_type is None and not python and not numpy and devices.__class__ in (list, tuple) \
                and not devices:
            self._mode = _CPU
        else:
            self._mode = _ALL

    def __enter__(self) -> None:
        mode = self._mode
        state: Any
        if mode is _CPU:
            state = _get_cpu()
        elif mode is _ALL:
            state = self._capture()
        else:
            return
        if self._state is not None:
            if self._outer is None:
                self._outer = []
            self._outer.append(self._state)
        self._state = state

    def _capture(self) -> tuple[Any, ...]:
        devices, _, caller, kw, device_type, python, numpy = self._args
        plan = self._plan
        if plan is None:
            if device_type is None and devices.__class__ in (list, tuple):
                plan = plan_tensors(devices, cache=True)  # None unless only tensors
            if plan is None:
                plan = make_plan(devices, device_type, caller=caller, devices_kw=kw)
            self._plan = plan
        return (
            _get_cpu(),
            [(b, i, b.get_rng_state(i)) for b, indices in plan for i in indices],
            _host.get_python_state() if python else None,
            _host.get_numpy_state() if numpy else None,
        )

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        state = self._state
        if state is None:  # disabled
            return
        self._state = self._outer.pop() if self._outer else None
        if self._mode is _CPU:
            _set_cpu(state)
            return
        cpu, devices, py, np = state
        if py is None and np is None:
            try:
                for backend, index, saved in devices:
                    backend.set_rng_state(saved, index)
                _set_cpu(cpu)
                return
            except Exception:
                pass  # setting a state is idempotent: start over, collecting every failure
        restore_all(cpu, devices, py, np, what=self._args[2])

    def __call__(self, fn: F) -> F:
        args: tuple[Any, ...] = getattr(self, "_args", None) or _CPU_ARGS
        devices, enabled, caller, kw, device_type, python, numpy = args

        @functools.wraps(fn)
        def forked(*a: Any, **k: Any) -> Any:
            with fork_rng(devices, enabled, caller, kw, device_type, python=python, numpy=numpy):
                return fn(*a, **k)

        return forked  # type: ignore[return-value]


def restore_all(cpu: torch.Tensor | None, devices: Any, py: Any, np: Any, *, what: str) -> None:
    """Put every saved state back; one failure does not stop the others."""
    failed: list[tuple[str, BaseException]] = []
    for backend, index, state in devices:
        try:
            backend.set_rng_state(state, index)
        except Exception as err:
            failed.append((f"{backend.name}:{index}", err))
    host: tuple[tuple[str, Callable[[Any], object], Any], ...] = (
        ("cpu", _cpu.set_state, cpu),
        ("python", _host.set_python_state, py),
        ("numpy", _host.set_numpy_state, np),
    )
    for label, setter, state in host:
        if state is not None:
            try:
                setter(state)
            except Exception as err:
                failed.append((label, err))
    if failed:
        detail = "; ".join(f"{name} ({type(e).__name__}: {e})" for name, e in failed)
        raise DevRNGError(
            f"{what} could not restore {len(failed)} generator(s): {detail}. Every other "
            "generator was restored."
        ) from failed[0][1]
