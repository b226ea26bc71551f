"""devrng's exception and warning classes, and the small helpers every module raises errors with."""

from __future__ import annotations

import logging
import warnings

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
        >>> import io, warnings
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("error", devrng.DevRNGWarning)
        ...     rng = devrng.TrainingRNG(seed=1)
        ...     entry = rng.state_dict()["devrng_rank_0"]    # this rank's plain state, saved
        ...     state = torch.load(io.BytesIO(entry), weights_only=True)
        ...     state["world_size"] = 2           # saved by one of two ranks
        ...     try:
        ...         rng.load_state_dict(state, strict=False)
        ...     except devrng.DevRNGWarning as warning:
        ...         print(str(warning)[:45])
        The resumed run will not be bitwise the same
    """

    __module__ = "devrng"  # as DevRNGError: named where users import it from


def warn_and_log(message: str, *, stacklevel: int = 1) -> None:
    """Warn with a ``DevRNGWarning`` and log the same message on the ``"devrng"`` logger.

    ``stacklevel`` is ``warnings.warn``'s, counted from the line that calls this function.
    """
    logging.getLogger("devrng").warning(message)
    warnings.warn(message, DevRNGWarning, stacklevel=stacklevel + 1)


def short_repr(value: object, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters, for error messages about any input."""
    try:
        text = repr(value)
    except Exception:  # a hostile object's __repr__
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def check_flags(**flags: object) -> None:
    """Raise ``TypeError`` naming the first flag that is not True or False."""
    for name, value in flags.items():
        if value.__class__ is not bool:
            raise TypeError(f"{name} must be True or False, not {short_repr(value)}.")
