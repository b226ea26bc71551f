"""devrng's exception and warning classes, and the small helpers every module raises errors with."""

from __future__ import annotations

import contextlib
import itertools
import logging
import sys
import warnings
from collections.abc import Callable
from typing import Any

from devrng._base.lazy import imported

__all__ = ["DevRNGError", "DevRNGWarning", "check_flags", "short_repr",
           "warn_and_log"]

# A library's logger stays quiet until the application configures logging (without a
# handler, Python would print every warning logged here a second time, to stderr).
logging.getLogger("devrng").addHandler(logging.NullHandler())


class DevRNGError(RuntimeError):
    """RNG state that cannot be restored, or a snapshot that does not match this process.

    Examples:
        >>> import torch, devrng
        >>> wrong = devrng.RNGState(torch.zeros(3, dtype=torch.uint8), {})
        >>> try:
        ...     devrng.set_rng_state(wrong)
        ... except devrng.DevRNGError as err:
        ...     print(err)
        The snapshot's CPU state is a torch.uint8 tensor of shape (3,); this torch needs a uint8 CPU tensor of ... elements.
    """

    # Tracebacks and help() name it where users import it from (pickling finds it
    # there too, through the package's lazy attributes).
    __module__ = "devrng"


class DevRNGWarning(UserWarning):
    """A result that will not be what the program asked for, and why.

    devrng warns when a run resumes and will not continue bitwise as the
    uninterrupted one, naming what will differ and how to make it exact, when
    restoring a ``deterministic()`` handle switches off a newer one, and (once
    per process) when the installed CPU kernel of ``devrng.portable`` fails its
    checks and the same numbers come, more slowly, from tensor ops. Each
    warning is also logged on the ``"devrng"`` logger. Turn them into errors
    with ``warnings.simplefilter("error", devrng.DevRNGWarning)``.

    Examples:
        >>> import warnings, torch, devrng
        >>> saved = devrng.TrainingRNG(seed=1).state_dict()
        >>> rng = devrng.TrainingRNG(seed=1)
        >>> _ = rng.track("noise", torch.Generator())    # tracked since the checkpoint
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     rng.load_state_dict(saved, strict=False)
        >>> print(str(caught[0].message)[:60])
        TrainingRNG.load_state_dict(strict=False) did not restore: n
    """

    __module__ = "devrng"  # as DevRNGError: named where users import it from


def warn_and_log(message: str, *, stacklevel: int = 1, at: tuple[str, int] | None = None
                 ) -> None:
    """Warn with a ``DevRNGWarning`` and log the same message on the ``"devrng"`` logger.

    ``stacklevel`` is ``warnings.warn``'s, counted from the line that calls this function;
    ``at`` (a file name and line) places the warning there instead.
    """
    logging.getLogger("devrng").warning(message)
    if at is None:
        warnings.warn(message, DevRNGWarning, stacklevel=stacklevel + 1)
    else:  # (a registry per file, as Python keeps: its default filter says each line once)
        warnings.warn_explicit(message, DevRNGWarning, at[0], at[1],
                               registry=_AT_REGISTRY.setdefault(at[0], {}))


_AT_REGISTRY: dict[str, dict[Any, Any]] = {}


def say(message: str, log: Callable[[str], None] | None = None) -> None:
    """Say ``message``, which is not a warning (a verdict, a resume that could not be
    checked): on the ``"devrng"`` logger when logging is set up to show its info lines, else
    on standard error, so that a script that sets up no logging sees it too; and on ``log``
    (a trainer's logger) as well."""
    logger = logging.getLogger("devrng")
    if logger.isEnabledFor(logging.INFO) and logger.hasHandlers():
        logger.info(message)
    else:
        with contextlib.suppress(OSError, ValueError):  # a closed stderr: nowhere to say it
            print(message, file=sys.stderr, flush=True)
    if log is not None:
        log(message)


def short_repr(value: object, limit: int = 60) -> str:
    """``value`` in at most ``limit`` characters, for a message about any input.

    The one formatter for values quoted in messages, above all values read from a
    saved state, which may be anything: its length, nesting (3 levels, a few items
    of each container) and cost are bounded -- a huge tensor, int, string or list is
    described or cut, never printed whole -- and it never raises (an object whose
    ``repr`` raises or recurses is named by its type).

    Examples:
        >>> short_repr([[[[[1]]]], "x" * 100])
        "[[[[...]]], 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx..."
        >>> short_repr(2 ** 1000)
        '<an int of 1001 bits>'
    """
    text = _bounded(value, 0, limit + 1)
    return text if len(text) <= limit else text[:limit - 3] + "..."


_DEPTH = 3  # containers nested deeper are shown as [...]
_ITEMS = 6  # items shown of each container


def _bounded(value: object, depth: int, room: int) -> str:
    """``value``'s text, cut near ``room`` characters: the work done is bounded by ``room``
    and the item and depth limits above, whatever ``value`` holds."""
    kind = type(value)
    try:
        if value is None or kind in (bool, float, complex):
            return repr(value)
        if kind is int:
            bits = value.bit_length()  # type: ignore[attr-defined]
            return repr(value) if bits <= 128 else f"<an int of {bits} bits>"
        if kind is str:
            return repr(value[:room])  # type: ignore[index]
        if kind in (bytes, bytearray):
            return repr(bytes(value[:room]))  # type: ignore[index]
        if isinstance(value, (list, tuple, set, frozenset, dict)):  # OrderedDict, Size too
            return _container(value, depth, room)
        torch = imported("torch")
        if torch is not None and isinstance(value, torch.Tensor):
            return _tensor(value, torch)
        if kind.__module__ == "numpy" and getattr(value, "ndim", None):
            return f"<a numpy {value.dtype} array of shape {tuple(value.shape)}>"  # type: ignore[attr-defined]
        text = repr(value)
        if type(text) is not str:
            raise TypeError("__repr__ returned a non-string")
        return text[:room]
    except Exception:  # a hostile __repr__, a recursion, a container changing under us
        return f"<{kind.__name__}>"


def _container(value: Any, depth: int, room: int) -> str:
    # The built-in classes' own methods: a subclass's overrides could do anything.
    base = next(b for b in (dict, list, tuple, set, frozenset) if isinstance(value, b))
    size = base.__len__(value)
    opening, closing = {list: ("[", "]"), tuple: ("(", ")")}.get(base, ("{", "}"))
    if base in (set, frozenset) and not size:
        return f"{base.__name__}()"
    if depth >= _DEPTH:
        return f"{opening}...{closing}" if size else opening + closing
    items = iter(dict.items(value)) if base is dict else base.__iter__(value)
    parts: list[str] = []
    used = 0
    for item in itertools.islice(items, _ITEMS):
        if used > room:
            break
        if base is dict:
            key, val = item
            text = (_bounded(key, depth + 1, room - used) + ": "
                    + _bounded(val, depth + 1, room - used))
        else:
            text = _bounded(item, depth + 1, room - used)
        parts.append(text)
        used += len(text) + 2
    if len(parts) < size:
        parts.append("...")
    if base is tuple and size == 1:
        parts[0] += ","
    return opening + ", ".join(parts) + closing


def _tensor(value: Any, torch: Any) -> str:
    if type(value).__name__ == "Tensor" and value.device.type == "cpu" and value.numel() <= 4 \
            and value.layout is torch.strided:
        return repr(value)  # a few elements: torch's own words ("tensor(1)")
    return f"<a {value.dtype} tensor of shape {tuple(value.shape)}>"


def check_flags(**flags: object) -> None:
    """Raise ``TypeError`` naming the first flag that is not True or False."""
    for name, value in flags.items():
        if value.__class__ is not bool:
            raise TypeError(f"{name} must be True or False, not {short_repr(value)}.")
