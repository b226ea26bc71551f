"""Interrupts injected where a user's Ctrl-C (or a signal handler) can land inside devrng.

Three ways, matching how CPython delivers an interrupt:

- ``at_every_line``: a ``sys.settrace`` hook raises ``KeyboardInterrupt`` before the k-th
  line that devrng's own code runs, for k = 0, 1, 2, ... until the operation finishes
  untouched. The first line of a function that user code called is left out: nothing
  inside a function can guard its own first line.
- ``after_every_apply``: chosen setters (a generator's ``set_state``, NumPy's
  ``set_state``, a backend's ``set_rng_state``, ...) do their work and then raise, as when
  a signal arrives during a C call and its handler runs right after the call returns.

- ``under_real_sigint``: another process sends real SIGINTs at random moments while the
  operation runs in a loop in a fresh interpreter: the signal lands wherever CPython takes
  it (often at the first instruction of a function, where no line-level guard reaches).

Each trial reports what the operation raised, so that a test can check that the interrupt
went on as itself and that everything ended all done or all undone.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import textwrap
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


# --------------------------------------------------------------------------- real signals
_CHILD = r'''
import json, os, signal, sys, time, traceback
# A suite started in the background (`cmd &` without job control) hands its children SIGINT
# ignored, and Python then installs no handler: the child stands for a program at a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
__SETUP__
real = signal.getsignal(signal.SIGINT)
busy, signalled, dropped = True, False, 0


def handler(signum, frame):
    # Harness bookkeeping runs with busy set: a signal then is dropped (counted), so
    # only the operation under test ever sees one. Otherwise the handler in place
    # (Python's, or devrng's) decides, with the frame the signal landed in.
    global dropped, signalled
    if busy:
        dropped += 1
        return
    signalled = True
    real(signum, frame)


reset()
op(0)  # imports and first-call work happen before any signal
signal.signal(signal.SIGINT, handler)
stats = {"interrupts": 0, "calls": 0, "bad": [], "swallowed": 0, "where": {}}
print("ready", flush=True)
deadline = time.monotonic() + __SECONDS__
while stats["interrupts"] < __TARGET__ and time.monotonic() < deadline:
    reset()
    i = 0
    signalled = False
    try:
        while True:
            busy = False
            op(i)
            # Reached only when the call returned: a signal taken during it must not be lost.
            busy = True
            if signalled:
                stats["swallowed"] += 1
                signalled = False
            i += 1
            stats["calls"] += 1
    except BaseException as err:
        busy = True
        stats["interrupts"] += 1
        frames = [f for f in traceback.extract_tb(err.__traceback__)
                  if f.name not in ("handler", "_on_sigint", "deliver")]
        where = f"{os.path.basename(frames[-1].filename)}:{frames[-1].name}"
        stats["where"][where] = stats["where"].get(where, 0) + 1
        if type(err) is not KeyboardInterrupt:  # the interrupt must go on as itself
            stats["bad"].append(f"{where}: raised {type(err).__name__}: {str(err)[:80]}")
        problem = check(i)
        if problem:
            stats["bad"].append(f"{where}: {problem}")
signal.signal(signal.SIGINT, signal.SIG_IGN)
print("stats " + json.dumps(stats), flush=True)
'''


def under_real_sigint(setup: str, *, interrupts: int, seconds: float = 120,
                      env: dict[str, str | None] | None = None,
                      gap: tuple[float, float] = (0.0002, 0.002),
                      python: str = sys.executable) -> dict[str, Any]:
    """Run an operation in a fresh process while this process sends it SIGINT at random moments.

    ``setup`` is Python code that defines ``reset()`` (called before each trial),
    ``op(i)`` (the i-th call of the operation in the trial; called until an interrupt
    comes) and ``check(i)`` (after the interrupt in call ``i``: a string naming what is
    wrong, or ``""`` when everything is all done or all undone). Nothing is mocked: the
    signal is a real one, handled by whatever handler the child has (Python's default, or
    devrng's). Returns the child's counts: ``interrupts``, ``calls`` completed, ``bad``
    (one line per trial that ended half done), ``swallowed`` (calls that returned
    normally although a signal was taken during them) and ``where`` the interrupts
    surfaced. ``python`` is the interpreter of the child (another CPython release).
    """
    import random
    import signal as _signal
    import subprocess
    import time

    from tests._helpers import run_env

    code = (_CHILD.replace("__SETUP__", textwrap.dedent(setup))
            .replace("__TARGET__", str(interrupts)).replace("__SECONDS__", str(seconds)))
    child = subprocess.Popen([python, "-c", code], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=run_env(env), cwd=ROOT)
    assert child.stdout is not None
    first = child.stdout.readline()
    if first.strip() != "ready":
        child.kill()
        raise AssertionError(f"the child did not start: {first}{child.communicate()[1]}")
    rng = random.Random(0)
    sent = 0
    while child.poll() is None:
        time.sleep(rng.uniform(*gap))
        try:
            os.kill(child.pid, _signal.SIGINT)
            sent += 1
        except ProcessLookupError:
            break
    out, err = child.communicate(timeout=60)
    line = next((ln for ln in out.splitlines() if ln.startswith("stats ")), None)
    if child.returncode != 0 or line is None:
        raise AssertionError(f"the child failed (exit {child.returncode}):\n{out}\n{err}")
    stats: dict[str, Any] = json.loads(line[len("stats "):])
    stats["sent"] = sent
    return stats
