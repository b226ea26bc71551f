"""Locks that survive ``os.fork()``.

DataLoader workers are forked processes. A lock that another thread holds at the
moment of the fork stays held forever in the child, whose copy of that thread does
not exist: the child's first devrng call would wait for good. Every lock devrng
keeps is a ``ForkSafeLock``, which the child gets back unlocked -- unless the
thread that forked is the one holding it, which will release it itself.
"""

from __future__ import annotations

import os
import threading
from typing import Any

__all__ = ["ForkSafeLock"]


class ForkSafeLock:
    """A reentrant lock, used as ``with lock:``, that a forked child never inherits held.

    Examples:
        >>> lock = ForkSafeLock()
        >>> with lock:
        ...     pass
    """

    __slots__ = ("__weakref__", "_lock")

    def __init__(self) -> None:
        self._lock = threading.RLock()
        os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        if not self._lock._is_owned():  # type: ignore[attr-defined]  # held by a lost thread
            self._lock = threading.RLock()

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(self, *exc_info: Any) -> None:
        self._lock.release()

    def acquire(self, timeout: float = -1) -> bool:
        """Hold the lock (waiting at most ``timeout`` seconds if not negative); whether held.
        For a lock held across calls (entered in one, released in another)."""
        return self._lock.acquire(timeout=timeout)

    def release(self) -> bool:
        """Release the lock; returns False (not held), so that ``held = lock.release()``
        changes a flag in the very line that releases (one line here too: no exception can
        land between the release and its result)."""
        return bool(self._lock.release())  # type: ignore[func-returns-value]  # (None)
