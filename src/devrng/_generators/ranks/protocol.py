"""The per-rank protocol: one entry per rank in a checkpoint, and loading all ranks together.

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
agree on through the job's store when ``state_dict()`` is called, without waiting for
one another (not for the state of a tracked object, whose holder's entry carries one),
and ``load_ranked``
refuses entries of different saves on every rank, naming both. An entry that is still
the template ``dcp.load`` read the checkpoint into (the identity this object's
``state_dict()`` made last: a planner that skips keys the checkpoint
lacks, as ``DefaultLoadPlanner(allow_partial_load=True)``, left it) is named as such.

**Loading** is one step of all ranks, because ``dcp.load`` calls ``load_state_dict`` on
every rank: each rank reads and checks its entry (the object's ``Loader``), the ranks
exchange a few integers (one ``all_reduce``), then all of them apply or all of them
raise the lowest failing rank's error; a second ``all_reduce`` after applying puts
every rank back if one of them could not apply. Several devrng values of one
``dcp.load`` load together (``devrng._generators.ranks.dcp_load``): one that fails puts
back the ones loaded before it. A rank that found no entry (a job with more ranks than
the one that saved, loaded with ``devrng.distributed.load_planner()``) is sent the entry
of rank ``r % s`` (``s`` saved ranks: the rank at its place in the saved layout, when
ranks are numbered with the data-parallel dimension outermost); the object then keeps it
only if it holds the same streams. Each rank sends and receives the same few bytes
whatever the number of ranks (a saved rank sends its entry to as many ranks as the world
grew by, times).
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import secrets
import sys
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import CodeType, FrameType
from typing import Any, NamedTuple

from devrng._base.errors import DevRNGError, short_repr, warn_and_log
from devrng._base.plain import hash_into
from devrng._base.rank import group_size, process_rank, world_size
from devrng._generators.ranks import dcp_load
from devrng._generators.ranks.collectives import (
    fail_everywhere,
    first_of,
    reduce_min,
    send_entries,
)
from devrng._generators.saved import PREFIX, decode, encode, recorded_counts, refusing
from devrng._generators.undo import Undo

__all__ = ["PREFIX", "SAVE", "Apply", "Loader", "Summary", "entry_key", "entry_rank",
           "identity_of", "is_ranked", "load_ranked", "nested_state",
           "own_entry", "ranked", "ranks_text", "save_of", "stamp"]

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
    this save: 62 random bits, drawn from the OS (never from a generator the run uses). The
    ranks of a job agree on it without a collective: the k-th save of an object takes the
    first identity any rank offered for that object's k-th save in the job's store
    (``first_of``), so a rank that saves alone (``if rank == 0: torch.save(...)``) never waits
    for the others. Without a store that can do this, one ``all_reduce`` agrees on it (every
    rank must then call ``state_dict()``, as ``dcp.save`` does). Saves are counted by kind of
    object and seed: a rank that saved an object more often than the others (a copy of its
    own) agrees with them no more. A state taken for another's entry (``nested_state``) is
    returned as it is.

    Examples:
        >>> sorted(stamp({"seed": 1}, owner=None))
        ['save', 'seed']
    """
    if _inside(nested_state.__code__):
        return plain
    offered = _LOW | secrets.randbits(61)
    save = first_of(_save_key(owner, plain), offered)
    if save is None or not _LOW <= save < 2 * _LOW:
        save = reduce_min([offered])[0]
    with contextlib.suppress(TypeError):  # an owner without weak references goes unrecorded
        _made[owner] = save
    return {**plain, SAVE: save}


#: How many saves this process made of objects of each kind and seed (their store keys).
_counts: dict[tuple[str, str], int] = {}


def _save_key(owner: Any, plain: Mapping[str, Any]) -> str:
    """``"save/TrainingRNG/1234/3"``: the store key of this process's 3rd save of a
    ``TrainingRNG`` of seed 1234 -- the same on every rank that saves it as often."""
    kind = (type(owner).__name__, short_repr(plain.get("seed", plain.get("base_seed"))))
    _counts[kind] = _counts.get(kind, 0) + 1
    return f"save/{kind[0]}/{kind[1]}/{_counts[kind]}"


def _latest_save(owner: Any) -> int | None:
    """The save identity ``owner``'s latest ``state_dict()`` made (see ``stamp``)."""
    try:
        return _made.get(owner)
    except TypeError:  # no weak reference to it: nothing was recorded
        return None


def nested_state(obj: Any) -> Any:
    """The plain state of ``obj`` (``own_entry(obj.state_dict())``) for another object's entry,
    which carries the save identity: made without one, so without counting a save (a
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


def _save_text(save: int) -> str:
    """A save identity in words: ``"save 3f0a..."``, or an older devrng's save without one."""
    return f"save {save:016x}" if save else "a save without an identity (an older devrng's)"


# -- loading -----------------------------------------------------------------------------
_NONE = 1 << 62  # "nothing" in the vectors the ranks reduce with MIN

#: What ``prepare`` returns: the change to make (its undo steps pushed on the stack it is
#: given) and the warning to give on every rank afterwards, if any.
Apply = Callable[[Undo], None]


class Facts(NamedTuple):
    """What the ranks compare of their entries before any of them loads (-1: not recorded)."""

    world: int  #: the world size the entry records
    identity: int  #: a hash of what must be alike on every rank (``Loader.alike``)
    rank: int  #: the rank that saved the entry
    save: int  #: the save identity (``save_of``; 0: an older devrng's entry)


@dataclass(frozen=True)
class Summary:
    """What every rank knows after the ranks compared their entries (the same on all)."""

    rank: int  #: this process's rank (``process_rank``)
    world: int  #: the job's number of ranks (``world_size``: what a state records)
    source: int  #: the rank whose entry this rank holds (its own, or the one it was sent)
    missing: tuple[int, int] | None  #: lowest and highest rank that found no entry
    saved_world: int | None  #: the world size the entries record, if they record one
    uniform: bool  #: whether every entry found holds the same state
    borrowed: bool  #: whether this rank found no entry and took ``source``'s


class Loader(NamedTuple):
    """How one kind of devrng object loads its rank's entry: the whole contract between it and
    ``load_ranked``, which runs these steps on every rank between its collectives.

    ``read`` and ``prepare`` raise ``DevRNGError`` for what they refuse, and neither changes
    anything: the change is ``prepare``'s result, applied once every rank agreed.
    """

    what: str  #: the caller, for messages (``"RNGStreams.load_state_dict"``)
    #: The entry and what it is in words (``"the entry 'devrng_rank_1'"``) to its plain state
    #: (a dict), checked whole (``check_saved``).
    read: Callable[[Any, str], Mapping[str, Any]]
    #: The keys of what must be alike in every rank's plain state (the run's seed).
    alike: tuple[str, ...]
    #: Checks a plain state (this rank's own, or the lowest rank's if this rank has none)
    #: against this process; the change, and a warning for every rank.
    prepare: Callable[[Any, Summary], tuple[Apply, str | None]]


def _facts(plain: Mapping[str, Any], loader: Loader) -> Facts:
    """What the ranks compare of a plain state: the world size and rank it records, a hash of
    what must be alike, and its save identity. (An entry saved by another rank than its key
    names was moved there: swapped entries, refused.)"""
    world, rank = recorded_counts(plain, loader.what)
    return Facts(world, identity_of([plain.get(key) for key in loader.alike]), rank,
                 save_of(plain, f"{loader.what}: its entry"))


def ranks_text(low: int, high: int) -> str:
    """``"rank 2"`` or ``"ranks 2-5"``."""
    return f"rank {low}" if low == high else f"ranks {low}-{high}"


def load_ranked(state_dict: Mapping[str, Any], owner: Any, loader: Loader) -> None:
    """Load one rank's entry, all ranks together: all of them, or none.

    Inside a ``dcp.load``, a failure also puts back the devrng values that call loaded
    before this one (``devrng._generators.ranks.dcp_load``), on every rank.

    Args:
        state_dict: This rank's ``{"devrng_rank_<r>": entry}``, as ``dcp.load`` filled it (an
            entry that is ``None``, or a dict of ``None``, was not in the checkpoint).
        owner: The object that loads (its latest ``state_dict()`` made the template a
            ``dcp.load`` reads into: see ``stamp``).
        loader: How the owner reads, describes and prepares an entry.
    """
    what = loader.what
    call = dcp_load.current()
    try:
        apply, warning, me = _agree(state_dict, owner, loader, call is not None)
        # Applied here, as load_training_state applies: the warnings' stack levels count on it.
        error: DevRNGError | None = None
        with Undo(what) as undo:
            try:
                apply(undo)
            except (KeyboardInterrupt, SystemExit):
                raise
            except Exception as err:
                error = err if isinstance(err, DevRNGError) else DevRNGError(
                    f"{what}: {type(err).__name__}: {err}")
            failed = reduce_min([me if error else _NONE])[0]
            if failed != _NONE:  # every rank puts back what it applied
                fail_everywhere(what, failed, error, group_size(), "apply")
            if warning:
                warn_and_log(warning, stacklevel=3)
            kept = undo.hand_over()  # a later devrng value of the same dcp.load may fail
    except BaseException as err:
        earlier = dcp_load.put_back(call, err)
        if earlier and isinstance(err, DevRNGError) and err.args:
            err.args = (f"{err.args[0]} The devrng values this dcp.load loaded before it "
                        f"({', '.join(earlier)}) were put back as well.", *err.args[1:])
        raise
    dcp_load.keep(call, kept, state_dict, is_ranked)


def _agree(state_dict: Mapping[str, Any], owner: Any, loader: Loader,
           inside_dcp: bool) -> tuple[Apply, str | None, int]:
    """Every check of ``load_ranked``, agreed by the ranks: the change to make, the warning,
    and this rank's place in the reduced vectors; or the same error on every rank."""
    what = loader.what
    rank, world, members = process_rank(), world_size(), group_size()
    me = rank if members > 1 else 0  # this process's place in the vectors the ranks reduce
    ((key, entry),) = state_dict.items()
    found = not _absent(entry)
    plain: Any = None
    error: DevRNGError | None = None
    saved_world, fingerprint, save = _NONE, _NONE, _NONE
    if found:
        try:  # (another rank's entry, from a file of its own, is the object's to judge)
            with refusing(what):
                plain = loader.read(entry, f"the entry {key!r}")
                recorded = _facts(plain, loader)
            saved_world, fingerprint, save = recorded.world, recorded.identity, recorded.save
            _check_key(key, recorded.rank, what)
            saved_world = _NONE if saved_world < 0 else saved_world
        except DevRNGError as err:
            error = err
    nobody = _NONE if found or error else me
    ok = found and not error
    left = ok and save == _latest_save(owner)  # the template dcp.load was to fill, if in one
    (source, highest_found, lowest_missing, highest_missing, bad, world_low, world_high,
     print_low, print_high, save_low, save_high, left_low, left_high) = reduce_min([
        me if ok else _NONE, -me if ok else _NONE, nobody,
        -nobody if nobody != _NONE else _NONE, me if error else _NONE, saved_world,
        -saved_world if saved_world != _NONE else _NONE,
        fingerprint, -fingerprint if fingerprint != _NONE else _NONE,
        save if ok else _NONE, -save if ok else _NONE, me if left else _NONE,
        -me if left else _NONE])
    if bad != _NONE:
        fail_everywhere(what, bad, error, members, "load")
    if source == _NONE:
        raise DevRNGError(
            f"{what}: no rank found its entry ('{PREFIX}<rank>') in the checkpoint: it holds no "
            "devrng state under this key (saved without devrng, by another object, or by devrng "
            "0.1, whose state DCP merged across ranks).")
    stale = None if left_low == _NONE else (left_low, -left_high)
    if save_low != -save_high:
        raise _different_saves(what, (save_low, -save_high), save if ok else _NONE, me,
                               stale if inside_dcp else None)
    if stale is not None and inside_dcp:
        raise DevRNGError(
            f"{what}: the checkpoint holds no devrng entry under this key ('{PREFIX}<rank>') "
            "for any rank: dcp.load left in place the entries each rank's state_dict() made "
            "for it to fill, because its planner skips keys the checkpoint lacks (as "
            "DefaultLoadPlanner(allow_partial_load=True) does, without a word); nothing was "
            "loaded. Resume from a checkpoint saved with this object, or leave it out of the "
            "state dict you load to start its state afresh.")
    if world_low != _NONE and world_low != -world_high:
        raise DevRNGError(
            f"{what}: the entries this job found were saved by runs of {world_low} and "
            f"{-world_high} ranks; they do not come from one checkpoint.")
    missing = None if lowest_missing == _NONE else (lowest_missing, -highest_missing)
    borrowed = not found
    if borrowed:
        # Saved ranks 0..s-1 and this job's ranks from s on without an entry (a grown world):
        # the rank at this rank's place in the saved layout; else the lowest that has one.
        tail = -highest_found < lowest_missing
        source = me % lowest_missing if tail else source
    if missing is not None:
        payload = send_entries(encode(plain) if found else b"", me, source, missing,
                               -highest_found)
        if borrowed:
            plain = decode(payload, f"the entry of rank {source}")
    summary = Summary(rank, world, source if borrowed else rank, missing,
                      None if world_low == _NONE else world_low, print_low == -print_high,
                      borrowed)
    apply, warning = None, None
    try:
        with refusing(what):
            apply, warning = loader.prepare(plain, summary)
    except DevRNGError as err:
        error = err
    failed = reduce_min([me if error else _NONE])[0]
    if failed != _NONE:
        fail_everywhere(what, failed, error, members, "load")
    assert apply is not None
    return apply, warning, me


def _different_saves(what: str, saves: tuple[int, int], mine: int, me: int,
                     stale: tuple[int, int] | None) -> DevRNGError:
    """The error every rank raises when the entries' save identities differ (``saves``: the
    lowest and highest), naming a rank of each; ``stale``: the ranks whose entry is the
    template a ``dcp.load`` left in place."""
    low, high = saves
    first, second = reduce_min([me if mine == low else _NONE, me if mine == high else _NONE])
    if stale is not None:
        who = ranks_text(*stale)
        return DevRNGError(
            f"{what}: the checkpoint holds no devrng entry for {who}: dcp.load left in place "
            f"the entry {who}'s state_dict() made for it to fill, because its planner skips "
            "keys the checkpoint lacks (as DefaultLoadPlanner(allow_partial_load=True) does, "
            "without a word), while other ranks loaded saved entries; no rank loaded any. "
            "Resume from a checkpoint that every rank of this job wrote; on more ranks than "
            "the run that saved, load with planner=devrng.distributed.load_planner(), which "
            "lets devrng decide for the ranks without an entry.")
    (a, sa), (b, sb) = sorted([(first, low), (second, high)])
    return DevRNGError(
        f"{what}: the checkpoint's entries come from different saves: rank {a}'s from "
        f"{_save_text(sa)} and rank {b}'s from {_save_text(sb)}, so no rank loaded any. DCP "
        "writes a checkpoint directory in place, one file per rank: a save that did not "
        "finish on every rank (a rank that died while an older checkpoint was overwritten) "
        "leaves files of two saves. Resume from a checkpoint every rank finished writing, and "
        "save each checkpoint to a directory of its own (one per step).")


def _check_key(key: str, saved_rank: int, what: str) -> None:
    """Refuse an entry that the rank its key names did not save (entries swapped or moved)."""
    named = entry_rank(key)
    if saved_rank >= 0 and named is not None and named != saved_rank:
        raise DevRNGError(
            f"{what}: the entry {key!r} holds the state that rank {saved_rank} saved: the "
            "checkpoint's entries were swapped or moved after it was written, so none of them "
            "is loaded. Load an intact copy of the checkpoint.")


def _absent(entry: Any) -> bool:
    """Whether an entry holds nothing (``load_planner()`` found no such key in the checkpoint)."""
    if isinstance(entry, Mapping):
        return all(v is None for v in entry.values())
    return entry is None
