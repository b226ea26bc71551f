"""devrng's one exception class, and the small helpers every module raises errors with."""

from __future__ import annotations

__all__ = ["DevRNGError", "check_flags", "short_repr"]


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
