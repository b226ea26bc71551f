"""What devrng reads of CPython's bytecode, and the versions that reading is tested on.

Two things cannot be known from Python's own API: where in a function CPython may
run a signal handler (``devrng._base.sigint`` reads each guarded function's
instructions), and whether a ``with`` statement enters an object made before it
(``with handle:``) or made by its own expression (``with deterministic():``),
which ``DeterministicHandle`` needs. Instruction names change between CPython
releases, so both are tested on every release in ``TESTED`` (tests/test_pythons.py
runs these checks under each interpreter it finds); on any other, devrng keeps
Python's own SIGINT handler and treats every ``with`` as owning its handle.
"""

from __future__ import annotations

import dis
import functools
import sys
from types import CodeType, FrameType

__all__ = ["TESTED", "tested", "with_of_a_name"]

#: The CPython releases whose bytecode devrng's readings are tested on (pyproject's
#: classifiers list the same; tests/test_packaging.py keeps them equal).
TESTED = ((3, 11), (3, 12), (3, 13))


def tested() -> bool:
    """Whether this interpreter is a CPython release devrng's bytecode readings are tested on."""
    return sys.implementation.name == "cpython" and sys.version_info[:2] in TESTED


# What a `with handle:` statement runs right before it calls __enter__: a load of a name or an
# attribute, then BEFORE_WITH (CPython 3.11 to 3.13). `with deterministic():` runs a call there.
# 3.13 fuses a store and the next load (`with make() as a, handle:`) into one instruction.
_LOADS = frozenset({"LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_NAME", "LOAD_GLOBAL", "LOAD_DEREF",
                    "LOAD_CLASSDEREF", "LOAD_ATTR", "LOAD_FAST_LOAD_FAST",
                    "STORE_FAST_LOAD_FAST"})


def with_of_a_name(frame: FrameType) -> bool:
    """Whether ``frame`` is entering a ``with`` statement whose expression is a name or an
    attribute (``with handle:``, ``with self.handle:``): an object made before the statement.
    Anything else (a call, ``ExitStack.enter_context``, an untested CPython) is False.

    Examples:
        >>> import sys
        >>> class Probe:
        ...     def __enter__(self):
        ...         self.named = with_of_a_name(sys._getframe(1))
        ...         return self
        ...     def __exit__(self, *exc):
        ...         pass
        >>> probe = Probe()
        >>> with probe:
        ...     pass
        >>> with Probe() as made:
        ...     pass
        >>> probe.named, made.named
        (True, False)
    """
    return tested() and _loads_then_enters(frame.f_code, frame.f_lasti)


@functools.lru_cache(maxsize=256)
def _loads_then_enters(code: CodeType, offset: int) -> bool:
    previous = None
    for ins in dis.get_instructions(code):
        if ins.offset == offset:
            return (ins.opname == "BEFORE_WITH" and not ins.is_jump_target
                    and previous is not None and previous.opname in _LOADS)
        previous = ins
    return False
