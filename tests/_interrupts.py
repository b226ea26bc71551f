"""Interrupts injected where a user's Ctrl-C (or a signal handler) can land inside devrng.

Two ways, matching how CPython delivers an interrupt:

- ``at_every_line``: a ``sys.settrace`` hook raises ``KeyboardInterrupt`` before the k-th
  line that devrng's own code runs, for k = 0, 1, 2, ... until the operation finishes
  untouched. The first line of a function that user code called is left out: nothing
  inside a function can guard its own first line.
- ``after_every_apply``: chosen setters (a generator's ``set_state``, NumPy's
  ``set_state``, a backend's ``set_rng_state``, ...) do their work and then raise, as when
  a signal arrives during a C call and its handler runs right after the call returns.

Each trial reports what the operation raised, so that a test can check that the interrupt
went on as itself and that everything ended all done or all undone.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, NamedTuple

from tests._helpers import ROOT

SRC = str(ROOT / "src" / "devrng")


class Trial(NamedTuple):
    """One run of the operation: where the interrupt was injected and what came out."""

    where: str
    injected: BaseException | None  # None: the operation ran to its end untouched
    raised: BaseException | None  # what the operation raised (None: it returned)


def _ours(frame: FrameType | None) -> bool:
    return frame is not None and frame.f_code.co_filename.startswith(SRC)


def _run_with_trace(op: Callable[[], Any], k: int) -> Trial:
    count = [0]
    injected = KeyboardInterrupt(f"injected before devrng's line {k}")
    fired: list[str] = []

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        if event != "call" or not _ours(frame):
            return None
        first = [not _ours(frame.f_back)]  # user code called it: its first line is left out

        def local(frame: FrameType, event: str, arg: Any) -> Any:
            if event != "line":
                return local
            if first[0]:
                first[0] = False
                return local
            if count[0] == k:
                count[0] += 1
                fired.append(f"{frame.f_code.co_name} line {frame.f_lineno}")
                raise injected  # the hook is unset after this: one interrupt per trial
            count[0] += 1
            return local

        return local

    raised: BaseException | None = None
    sys.settrace(tracer)
    try:
        op()
    except BaseException as err:
        raised = err
    finally:
        sys.settrace(None)
    return Trial(fired[0] if fired else "", injected if fired else None, raised)


def at_every_line(op: Callable[[], Any], reset: Callable[[], Any],
                  limit: int = 20_000) -> Iterator[Trial]:
    """Run ``reset()`` then ``op()`` with an interrupt at devrng's line 0, 1, 2, ...; yield
    each trial, the last one being the run that no injection reached."""
    for k in range(limit):
        reset()
        trial = _run_with_trace(op, k)
        yield trial
        if trial.injected is None:
            return
    raise AssertionError(f"the operation ran more than {limit} lines of devrng")


class _Raiser:
    """Wraps a callable: its n-th call during the trial does its work, then raises the
    interrupt. (Undo entries made in the trial may keep it and call it later: it only
    passes calls through then.)"""

    def __init__(self, fn: Callable[..., Any], n: int, injected: BaseException,
                 fired: list[str], label: str) -> None:
        self.fn, self.n, self.injected, self.fired, self.label = fn, n, injected, fired, label
        self.calls = 0
        self.armed = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self.fn(*args, **kwargs)
        if not self.armed:
            return out
        self.calls += 1
        if self.calls == self.n and not self.fired:
            self.fired.append(f"after {self.label} call {self.n}")
            raise self.injected
        return out


def after_every_apply(op: Callable[[], Any], reset: Callable[[], Any],
                      targets: list[tuple[Any, str]], limit: int = 50) -> Iterator[Trial]:
    """For each ``(owner, attribute)`` setter and n = 1, 2, ...: ``reset()``, then ``op()``
    with the n-th call of that setter applying and then raising ``KeyboardInterrupt``."""
    for owner, attr in targets:
        original = getattr(owner, attr)
        label = f"{getattr(owner, '__name__', type(owner).__name__)}.{attr}"
        for n in range(1, limit + 1):
            fired: list[str] = []
            injected = KeyboardInterrupt(f"injected after {label} call {n}")
            raised: BaseException | None = None
            raiser = _Raiser(original, n, injected, fired, label)
            with _patched(owner, attr, raiser):
                reset()  # what reset makes (a handle to restore) may keep the setter
                raiser.armed = True
                try:
                    op()
                except BaseException as err:
                    raised = err
                raiser.armed = False
            yield Trial(fired[0] if fired else "", injected if fired else None, raised)
            if not fired:
                break


@contextlib.contextmanager
def _patched(owner: Any, attr: str, value: Any) -> Iterator[None]:
    original = getattr(owner, attr)
    setattr(owner, attr, value)
    try:
        yield
    finally:
        setattr(owner, attr, original)
