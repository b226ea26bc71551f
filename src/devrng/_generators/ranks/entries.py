"""One rank's entry in a checkpoint: its key, and the identity of the save that wrote it.

**One entry per rank.** ``torch.distributed.checkpoint`` (DCP) flattens every rank's
state dict into leaves and keeps one copy of each leaf key that several ranks write,
chosen by load balancing: per-rank values saved under the same keys come back
stitched from several ranks. So ``TrainingRNG``, ``RNGStreams`` and ``PortableRNG``
return their state under a key that names the rank, ``{"devrng_rank_<r>": entry}``:
DCP keeps every rank's entry, and a rank that loads reads its own one, whatever the
number of ranks. An entry is the object's plain state: the bytes ``torch.save`` makes
of it where its structure varies (DCP would match nested keys and tensor shapes
against the loading process's template), or a dict of ints (``PortableRNG``).

**One save.** DCP writes a checkpoint directory in place, one file per rank, and its
metadata last: a save that did not finish on every rank (a rank killed while writing
over an older checkpoint) leaves files of two saves, which load without an error. So
every entry carries the identity of its save (``stamp``): 62 random bits that the ranks
agree on when ``state_dict()`` is called (one ``all_reduce`` of one integer; not for the
state of a tracked object, whose holder's entry carries one), and ``load_ranked``
refuses entries of different saves on every rank, naming both. An entry that is still
the template ``dcp.load`` read the checkpoint into (the identity this object's
``state_dict()`` made last, ``latest_save``: a planner that skips keys the checkpoint
lacks, as ``DefaultLoadPlanner(allow_partial_load=True)``, left it) is named as such.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import secrets
import sys
import weakref
from collections.abc import Mapping
from types import CodeType, FrameType
from typing import Any

from devrng._base.errors import DevRNGError, short_repr
from devrng._base.plain import hash_into
from devrng._base.rank import process_rank
from devrng._generators.ranks.collectives import reduce_min
from devrng._generators.saved import decode

__all__ = ["PREFIX", "SAVE", "entry_key", "entry_rank", "identity_of", "is_ranked",
           "latest_save", "nested_state", "own_entry", "ranked", "save_of", "save_text",
           "stamp"]

PREFIX = "devrng_rank_"
_KEY = re.compile(re.escape(PREFIX) + r"(\d+)")


def entry_key(rank: int) -> str:
    """The key of ``rank``'s entry: ``"devrng_rank_<rank>"``."""
    return f"{PREFIX}{rank}"


def entry_rank(key: Any) -> int | None:
    """The rank an entry's key names (``"devrng_rank_3"``: 3), or None for any other key.

    Examples:
        >>> entry_rank("devrng_rank_3"), entry_rank("rng")
        (3, None)
    """
    match = _KEY.fullmatch(key) if isinstance(key, str) else None
    return None if match is None else int(match.group(1))


def ranked(entry: Any) -> dict[str, Any]:
    """``{"devrng_rank_<r>": entry}`` for this process's rank."""
    return {entry_key(process_rank()): entry}


def is_ranked(state_dict: Any) -> bool:
    """Whether ``state_dict`` is one rank's entry (what ``ranked`` returns)."""
    return (isinstance(state_dict, Mapping) and len(state_dict) == 1
            and all(entry_rank(k) is not None for k in state_dict))


def own_entry(state_dict: Any) -> Any:
    """The plain state in one rank's entry (``state_dict`` itself when it is not one)."""
    if not is_ranked(state_dict):
        return state_dict
    entry = next(iter(state_dict.values()))
    return decode(entry, "the entry") if isinstance(entry, (bytes, bytearray)) else entry


def identity_of(value: Any) -> int:
    """A 62-bit hash of plain data, to compare entries across ranks."""
    h = hashlib.sha256()
    hash_into(h, value)
    return int.from_bytes(h.digest()[:8], "little") >> 2


# -- the identity of a save --------------------------------------------------------------------
SAVE = "save"  #: the key of an entry's save identity
_LOW = 1 << 61  # identities are in [2**61, 2**62): every one pickles to the same 8 bytes
#: The identity each object's latest ``state_dict()`` made (its template in a ``dcp.load``).
_made: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def stamp(plain: dict[str, Any], owner: Any) -> dict[str, Any]:
    """``plain`` (an entry's plain state, made by ``owner.state_dict()``) with the identity of
    this save: 62 random bits, agreed by every rank of the default group (one ``all_reduce``
    of one integer: every rank calls ``state_dict()``, as ``dcp.save`` does). Drawn from the
    OS, never from a generator the run uses. A state taken for another's entry
    (``nested_state``) is returned as it is.

    Examples:
        >>> sorted(stamp({"seed": 1}, owner=None))
        ['save', 'seed']
    """
    if _inside(nested_state.__code__):
        return plain
    save = reduce_min([_LOW | secrets.randbits(61)])[0]
    with contextlib.suppress(TypeError):  # an owner without weak references goes unrecorded
        _made[owner] = save
    return {**plain, SAVE: save}


def latest_save(owner: Any) -> int | None:
    """The save identity ``owner``'s latest ``state_dict()`` made (see ``stamp``)."""
    try:
        return _made.get(owner)
    except TypeError:  # no weak reference to it: nothing was recorded
        return None


def nested_state(obj: Any) -> Any:
    """The plain state of ``obj`` (``own_entry(obj.state_dict())``) for another object's entry,
    which carries the save identity: made without one, so without a collective (a
    ``TrainingRNG`` tracking ``RNGStreams``, a state gathered by a trainer integration)."""
    return own_entry(obj.state_dict())


def _inside(code: CodeType) -> bool:
    """Whether a call of ``code`` is on this thread's stack. (Read from the stack, not kept in
    a flag, which an interrupt between setting and clearing it could leave set.)"""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


def save_of(plain: Any, what: str) -> int:
    """The save identity in an entry's plain state; 0 for one saved without (an older devrng).

    Examples:
        >>> save_of({"seed": 1}, "the entry")
        0
    """
    save = plain.get(SAVE) if isinstance(plain, Mapping) else None
    if save is None:
        return 0
    if type(save) is not int or not _LOW <= save < 2 * _LOW:
        raise DevRNGError(f"{what} has the save identity {short_repr(save)}; devrng writes an "
                          "int in [2**61, 2**62) there, so the entry was altered.")
    return save


def save_text(save: int) -> str:
    """A save identity in words: ``"save 3f0a..."``, or an older devrng's save without one."""
    return f"save {save:016x}" if save else "a save without an identity (an older devrng's)"
