"""Files devrng writes: atomically, so a failure never destroys the previous good file.

Every write goes to a temporary file in the destination's directory, is
flushed and fsynced, and replaces the destination with one rename; a failure
at any point (full disk, file-size limit, an interrupt) leaves the destination
as it was and removes the temporary file.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from typing import IO, Any

__all__ = ["atomic_write", "is_file_like"]


def is_file_like(target: Any) -> bool:
    """Whether ``target`` is an open binary file rather than a path."""
    return hasattr(target, "write") or hasattr(target, "read")


def atomic_write(path: str | os.PathLike[str], write: Callable[[IO[bytes]], object]) -> None:
    """Call ``write(fh)`` on a temporary file next to ``path``, then rename it to ``path``.

    Examples:
        >>> atomic_write("notes.bin", lambda fh: fh.write(b"data"))
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        os.fchmod(fd, _mode_for(path))  # mkstemp makes 0600; give what open() would
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable where the OS allows
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _mode_for(path: str) -> int:
    """The existing file's permissions, else what ``open(path, "w")`` would create."""
    try:
        return os.stat(path).st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask
