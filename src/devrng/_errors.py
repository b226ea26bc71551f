"""devrng's one exception class."""

from __future__ import annotations

__all__ = ["DevRNGError", "add_note"]


class DevRNGError(RuntimeError):
    """RNG state that cannot be restored, or a snapshot that does not match this process.

    Example:
        >>> import devrng
        >>> try:
        ...     devrng.set_rng_state(devrng.RNGState.load("run.rng"))
        ... except devrng.DevRNGError as err:
        ...     print(err)  # names the generator that did not match
    """


def add_note(err: BaseException, note: str) -> None:
    """``err.add_note(note)`` where Python has it (3.11+): a failure attached, not substituted."""
    adder = getattr(err, "add_note", None)
    if adder is not None:
        adder(note)
