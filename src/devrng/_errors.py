"""devrng's one exception class."""

from __future__ import annotations

__all__ = ["DevRNGError"]


class DevRNGError(RuntimeError):
    """RNG state that cannot be restored, or a snapshot that does not match this process.

    Example:
        >>> import devrng
        >>> try:
        ...     devrng.set_rng_state(devrng.RNGState.load("run.rng"))
        ... except devrng.DevRNGError as err:
        ...     print(err)  # names the generator that did not match
    """
