"""Files devrng writes: atomically, so a failure never destroys the previous good file.

Every write goes to a temporary file in the destination's directory, is
flushed and fsynced, and replaces the destination with one rename; a failure
at any point (full disk, file-size limit, an interrupt) leaves the destination
as it was and removes the temporary file.

Only regular files are ever replaced. A symlink is written through: the
temporary file goes beside the file it points to, which the rename replaces,
so the link stays a link. Anything else that exists at the path (a FIFO, a
device, a directory) is refused. Temporary names are short (a 250-character
file name still works) and carry the writer's process id, so that a save to
the same path removes what a killed writer left behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import tempfile
from collections.abc import Callable
from typing import IO, Any

from devrng._base.errors import short_repr
from devrng._base.sigint import deliver, guard

__all__ = ["atomic_write", "checked_path", "is_file_like", "readable_file"]

_SUFFIX = ".devrng-tmp"


def is_file_like(target: Any) -> bool:
    """Whether ``target`` is an open binary file rather than a path."""
    return hasattr(target, "write") or hasattr(target, "read")


@guard
def atomic_write(path: str | os.PathLike[str], write: Callable[[IO[bytes]], object]) -> None:
    """Call ``write(fh)`` on a temporary file next to ``path``, then rename it to ``path``.

    A Ctrl-C during the write is raised before the rename (the previous file
    stays); one that comes after the rename is raised once the call is done.

    Examples:
        >>> atomic_write("notes.bin", lambda fh: fh.write(b"data"))
    """
    try:
        shown = checked_path(path, "write to")
        target = _regular_target(shown)
        directory = os.path.dirname(target)
        prefix = _temp_prefix(target)
        _remove_abandoned(directory, prefix)
        fd, tmp = tempfile.mkstemp(prefix=f"{prefix}{os.getpid()}.", suffix=_SUFFIX,
                                   dir=directory)
        try:
            os.fchmod(fd, _mode_for(target))  # mkstemp makes 0600; give what open() would
            with os.fdopen(fd, "wb") as fh:
                write(fh)
                fh.flush()
                os.fsync(fh.fileno())
            deliver()  # a Ctrl-C noted while writing: the previous file stays (below)
            os.replace(tmp, target)
        except BaseException as err:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if isinstance(err, OSError) and err.errno is not None:
                raise type(err)(err.errno, f"{err.strerror} while writing {shown!r}; the file "
                                "that was there (if any) is unchanged") from err
            raise
        with contextlib.suppress(OSError):  # make the rename durable where the OS allows
            dir_fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
    finally:
        deliver()


def checked_path(path: Any, what: str) -> str:
    """``path`` as a ``str``, or a sentence: devrng takes ``str`` and ``os.PathLike`` paths
    that name a file (not ``bytes``, not a path that ends in a separator)."""
    if isinstance(path, (bytes, bytearray)) or not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            f"devrng cannot {what} {short_repr(path)} (a {type(path).__name__}); pass a path as "
            "a str or os.PathLike (pathlib.Path), or a binary file object."
        )
    text = os.fspath(path)
    if not isinstance(text, str):
        raise TypeError(f"devrng cannot {what} {short_repr(path)}: its os.fspath() is bytes; "
                        "pass a str path.")
    if not text or text.endswith((os.sep, os.altsep or os.sep)):
        raise ValueError(
            f"devrng cannot {what} {text!r}: it names a directory (or nothing), not a file. "
            "Pass the path of a file, such as 'run/rng.pt'."
        )
    return text


def readable_file(path: str) -> str | None:
    """Why ``path`` cannot be read as a file devrng wrote (a directory, a FIFO, a device,
    ...: opening a FIFO would wait for a writer forever), or None. A missing path is left
    to the open, which says so."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode):
        return None
    return f"it is {_kind(mode)}, not a regular file"


def _regular_target(path: str) -> str:
    """The file a write to ``path`` must replace: ``path`` itself, or the file a symlink
    points to; ``ValueError`` for anything that is not a regular file (or absent)."""
    target = os.path.realpath(path) if os.path.islink(path) else os.path.abspath(path)
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        return target  # a new file (also a dangling symlink's target)
    if not stat.S_ISREG(mode):
        shown = path if target == os.path.abspath(path) else f"{path} (-> {target})"
        raise ValueError(
            f"{shown!r} is {_kind(mode)}; devrng saves to regular files only, which it replaces "
            "atomically. Pass the path of a file (new or existing)."
        )
    return target


def _kind(mode: int) -> str:
    return ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")


def _temp_prefix(target: str) -> str:
    """Short and the same for every writer of ``target``, whatever its name's length."""
    digest = hashlib.sha256(os.path.basename(target).encode(errors="surrogateescape"))
    return f".{digest.hexdigest()[:10]}."


def _remove_abandoned(directory: str, prefix: str) -> None:
    """Remove temporary files of this target whose writer process is gone (killed mid-save)."""
    try:
        names = [n for n in os.listdir(directory) if n.startswith(prefix) and n.endswith(_SUFFIX)]
    except OSError:
        return
    for name in names:
        pid = name[len(prefix):].partition(".")[0]
        if pid.isdigit() and not _alive(int(pid)):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, name))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, but is another user's
        return True
    return True


def _mode_for(path: str) -> int:
    """The existing file's permissions, else what ``open(path, "w")`` would create."""
    try:
        return os.stat(path).st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask
