"""A Ctrl-C that lands inside a devrng call is raised when the call ends, so the call is whole.

CPython runs a Python signal handler at the next *check point* of the eval loop
after the signal arrived: the first instruction of a function, the end of a call,
a backward jump. A Ctrl-C that arrives while torch runs C code in the body of
``with devrng.fork_rng():`` is often taken at the first instruction of
``Fork.__exit__`` -- before any ``try`` in it, so nothing inside the function
could put the generators back. No code can guard its own first line.

So devrng installs a SIGINT handler of its own (``install``, at import) where
Python's default one is in place. The handler looks at the frames the interrupt
landed in. Inside a *guarded* devrng function it only notes the interrupt; the
function ends with ``deliver()``, which raises it as ``KeyboardInterrupt`` once
the outermost guarded call is complete. Anywhere else it raises
``KeyboardInterrupt`` at once, exactly as Python's handler does. A guarded call
therefore takes a few microseconds longer to be interrupted, and is never left
half done.

A function is guarded when its body is ``try: ... finally: deliver()`` and it is
decorated with ``@guard``, which registers its code and returns the function itself
(a wrapper would add a frame to every traceback and shift every warning's
``stacklevel``). A frame stops counting as
guarded at a call of ``deliver``: after that call returns there is no check
point before the function returns, so an interrupt taken there is raised at
once (the work is done) instead of being noted for a ``deliver`` that will not
come. A call that hands the caller something to undo (``deterministic()``, an
``__enter__``) calls ``deliver()`` as the last step of its ``try`` as well, so
that a noted interrupt is raised where its ``except`` undoes the call.

The handler is installed only from the main thread and only over
``signal.default_int_handler``: a program or framework with a SIGINT handler of
its own keeps it (and loses this protection). ``DEVRNG_DEFER_SIGINT=0`` keeps
Python's handler, and so does a Python release whose bytecode this reading is not
tested on (``devrng._base.bytecode.TESTED``; ``devrng doctor`` says so).
"""

from __future__ import annotations

import dis
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any, TypeVar

from devrng._base.bytecode import tested

__all__ = ["PENDING", "deliver", "deliver_waiting", "guard", "install", "installed", "interrupt_in", "raised_count"]

F = TypeVar("F", bound=Callable[..., Any])

#: Guarded code -> the instruction offsets at which its frame no longer counts as guarded.
_GUARDED: dict[CodeType, frozenset[int]] = {}
#: ``PENDING[0]``: an interrupt was noted and not yet raised. Hot paths read it inline
#: (``if PENDING[0]: deliver()``) instead of calling ``deliver`` every time.
PENDING = [False]
_raised = 0  # interrupts raised at once by the handler, ever (see ``raised_count``)
# Instructions at which CPython may run a signal handler (the eval loop's check points).
_CHECK_POINTS = ("CALL", "PRECALL", "JUMP_BACKWARD", "RESUME", "SEND", "YIELD")


def deliver() -> None:
    """End of a guarded call: raise the interrupt noted during it, unless a guarded call
    that encloses this one is still running (it will raise it when it ends). Only the main
    thread's: the interrupt was noted there, and another thread's call must not take it."""
    if PENDING[0] and threading.current_thread() is threading.main_thread():
        if _inside_guarded(sys._getframe(2)):  # 0: here, 1: the guarded call that ends
            return
        PENDING[0] = False
        raise KeyboardInterrupt


def deliver_waiting() -> None:
    """In a guarded call that waits (for a lock) before it has changed anything: raise a
    noted interrupt now, enclosing guarded calls or not, so that a Ctrl-C ends the wait."""
    if PENDING[0] and threading.current_thread() is threading.main_thread():
        PENDING[0] = False
        raise KeyboardInterrupt


def _after_the_call_of(code: CodeType, name: str) -> frozenset[int]:
    """Offsets from each call of ``name`` in ``code`` up to the next check point."""
    closed: set[int] = set()
    instructions = list(dis.get_instructions(code))
    loading = False
    for i, ins in enumerate(instructions):
        if ins.opname in ("LOAD_GLOBAL", "LOAD_ATTR", "LOAD_METHOD") and ins.argval == name:
            loading = True
        elif loading and ins.opname.startswith("CALL"):
            loading = False
            closed.add(ins.offset)
            for later in instructions[i + 1:]:
                if later.opname.startswith(_CHECK_POINTS):
                    break
                closed.add(later.offset)
                if later.opname.startswith(("RETURN", "RERAISE", "RAISE")):
                    break
    return frozenset(closed)


def _from_the_read_of(code: CodeType, name: str) -> frozenset[int]:
    """Offsets from the first read of the global ``name`` in ``code`` on."""
    offsets = [ins.offset for ins in dis.get_instructions(code)]
    first = next(ins.offset for ins in dis.get_instructions(code)
                 if ins.opname == "LOAD_GLOBAL" and ins.argval == name)
    return frozenset(o for o in offsets if o >= first)


def guard(fn: F) -> F:
    """Guard ``fn``, whose body is ``try: ... finally: deliver()``: a decorator that
    registers ``fn``'s code and returns ``fn`` itself.

    Examples:
        >>> @guard
        ... def swap(a, b):
        ...     try:
        ...         return b, a
        ...     finally:
        ...         deliver()
        >>> swap(1, 2)
        (2, 1)
    """
    code = fn.__code__
    closed = _after_the_call_of(code, "deliver")
    if not closed:
        raise AssertionError(f"{fn.__qualname__} is guarded but never calls deliver()")
    _GUARDED[code] = closed
    return fn


def _inside_guarded(frame: FrameType | None) -> bool:
    while frame is not None:
        closed = _GUARDED.get(frame.f_code)
        if closed is not None and frame.f_lasti not in closed:
            return True
        frame = frame.f_back
    return False


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    global _raised
    if _inside_guarded(frame):
        PENDING[0] = True
        return
    _raised += 1
    signal.default_int_handler(signum, frame)


def raised_count() -> int:
    """How many interrupts the handler has raised so far: a call that returns normally
    although the count moved while it ran had its interrupt swallowed by C++ code that
    turns Python errors into results (a compiler's guards)."""
    return _raised


def interrupt_in(err: BaseException) -> BaseException | None:
    """The interrupt behind ``err``, else None: when C++ code turned one raised in a Python
    callback into a ``SystemError`` ("returned a result with an exception set"), or cleanup
    code raised another error while it was on its way (dynamo's ``_compile`` on torch 2.9
    raises ``UnboundLocalError`` over it)."""
    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


_GUARDED[deliver.__code__] = _from_the_read_of(deliver.__code__, "PENDING")


def installed() -> bool:
    """Whether devrng's SIGINT handler is the one in place."""
    return signal.getsignal(signal.SIGINT) is _on_sigint


def install() -> None:
    """Put devrng's handler in place of Python's default SIGINT handler (see the module
    docstring); nothing where another handler is installed, off the main thread, or with
    ``DEVRNG_DEFER_SIGINT=0``."""
    if os.environ.get("DEVRNG_DEFER_SIGINT", "1").strip() == "0" or not tested():
        return
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, _on_sigint)
    except (ValueError, OSError):  # no signals here (an embedded interpreter)
        pass
