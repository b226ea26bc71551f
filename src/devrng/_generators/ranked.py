"""One entry per rank: devrng's checkpointable objects as values of a DCP state dict.

``torch.distributed.checkpoint`` (DCP) flattens every rank's state dict into
leaves and keeps one copy of each leaf key that several ranks write, chosen by
load balancing: per-rank values saved under the same keys come back stitched
from several ranks. So ``TrainingRNG``, ``RNGStreams`` and ``PortableRNG``
return their state under a key that names the rank, ``{"devrng_rank_<r>":
entry}``: DCP keeps every rank's entry, and a rank that loads reads its own
one, whatever the number of ranks. An entry is the object's plain state: the
bytes ``torch.save`` makes of it where its structure varies (DCP would match
nested keys and tensor shapes against the loading process's template), or a
dict of ints (``PortableRNG``).

Loading is one step of all ranks, because ``dcp.load`` calls
``load_state_dict`` on every rank: each rank reads and checks its entry, the
ranks exchange a few integers (one ``all_reduce``), then all of them apply or
all of them raise the lowest failing rank's error; a second ``all_reduce``
after applying puts every rank back if one of them could not apply. A rank
that found no entry (a job with more ranks than the one that saved, loaded
with ``devrng.distributed.load_planner()``) is sent the entry of rank ``r % s``
(``s`` saved ranks: the rank at its place in the saved layout, when ranks are
numbered with the data-parallel dimension outermost); the object then keeps it
only if it holds the same streams. Each rank sends and receives the same few
bytes whatever the number of ranks (a saved rank sends its entry to as many
ranks as the world grew by, times).
"""

from __future__ import annotations

import hashlib
import io
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from devrng._base.errors import DevRNGError, short_repr, warn_and_log
from devrng._base.plain import check_loaded, hash_into
from devrng._base.rank import collective_device, dist_or_none, process_rank
from devrng._generators.undo import Undo

__all__ = ["PREFIX", "Summary", "decode", "encode", "entry_key", "identity_of", "is_ranked",
           "load_ranked", "own_entry", "ranked", "ranks_text"]

PREFIX = "devrng_rank_"
_KEY = re.compile(PREFIX + r"(\d+)")
_NONE = 1 << 62  # "nothing" in the vectors the ranks reduce with MIN
_TEXT = 4096  # bytes of an error message sent from one rank to the others

#: What ``prepare`` returns: the change to make (its undo steps pushed on the stack it is
#: given) and the warning to give on every rank afterwards, if any.
Apply = Callable[[Undo], None]


def entry_key(rank: int) -> str:
    """The key of ``rank``'s entry: ``"devrng_rank_<rank>"``."""
    return f"{PREFIX}{rank}"


def ranked(entry: Any) -> dict[str, Any]:
    """``{"devrng_rank_<r>": entry}`` for this process's rank."""
    return {entry_key(process_rank()): entry}


def is_ranked(state_dict: Any) -> bool:
    """Whether ``state_dict`` is one rank's entry (what ``ranked`` returns)."""
    return (isinstance(state_dict, Mapping) and len(state_dict) == 1
            and all(isinstance(k, str) and _KEY.fullmatch(k) for k in state_dict))


def encode(plain: Any) -> bytes:
    """The bytes ``torch.save`` makes of ``plain`` (read back by ``decode``)."""
    buffer = io.BytesIO()
    torch.save(plain, buffer)
    return buffer.getvalue()


def decode(payload: Any, what: str) -> Any:
    """What ``encode`` made ``payload`` from, read weights-only and checked as a state file is."""
    if not isinstance(payload, (bytes, bytearray)):
        raise DevRNGError(f"{what} is {short_repr(payload)} (a {type(payload).__name__}), not "
                          "the bytes devrng saves there.")
    try:
        plain = torch.load(io.BytesIO(payload), weights_only=True, map_location="cpu")
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as err:
        first = (str(err).splitlines() or [""])[0][:200]
        raise DevRNGError(f"{what} could not be read ({type(err).__name__}: {first}); it is "
                          "corrupt or was not written by devrng.") from None
    check_loaded(plain, what)
    return plain


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


def ranks_text(low: int, high: int) -> str:
    """``"rank 2"`` or ``"ranks 2-5"``."""
    return f"rank {low}" if low == high else f"ranks {low}-{high}"


@dataclass(frozen=True)
class Summary:
    """What every rank knows after the ranks compared their entries (the same on all)."""

    rank: int
    world: int
    source: int  #: the rank whose entry this rank holds (its own, or the one it was sent)
    missing: tuple[int, int] | None  #: lowest and highest rank that found no entry
    saved_world: int | None  #: the world size the entries record, if they record one
    uniform: bool  #: whether every entry found holds the same state
    borrowed: bool  #: whether this rank found no entry and took ``source``'s


# -- collectives (none without a process group of more than one rank) ------------------------
def _group_world() -> int:
    dist = dist_or_none()
    return int(dist.get_world_size()) if dist is not None and dist.is_initialized() else 1


def _reduce_min(values: list[int]) -> list[int]:
    if _group_world() == 1:
        return values
    dist = torch.distributed
    t = torch.tensor(values, dtype=torch.int64, device=collective_device())
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return [int(v) for v in t.cpu().tolist()]


def _broadcast_bytes(data: bytes, src: int, size: int) -> bytes:
    """``src``'s ``data`` (``size`` bytes at most) on every rank."""
    if _group_world() == 1:
        return data
    dist = torch.distributed
    t = torch.zeros(size, dtype=torch.uint8, device=collective_device())
    if process_rank() == src:
        t[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    dist.broadcast(t, src=src)
    return bytes(t.cpu().tolist())


def _broadcast_text(text: str, src: int) -> str:
    raw = text.encode()[:_TEXT]
    return _broadcast_bytes(raw, src, _TEXT).rstrip(b"\0").decode(errors="replace")


def _send_entries(payload: bytes, rank: int, source: int, missing: tuple[int, int],
                  highest_found: int, world: int) -> bytes:
    """Give each rank without an entry the entry of its source (see ``load_ranked``)."""
    low, high = missing
    if highest_found < low:  # a grown world: saved rank s sends to ranks s + k * low
        dist = torch.distributed
        device = collective_device()
        if rank < low:
            for dst in range(rank + low, high + 1, low):
                dist.send(torch.tensor([len(payload)], dtype=torch.int64, device=device), dst)
                dist.send(torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(device),
                          dst)
            return payload
        length = torch.zeros(1, dtype=torch.int64, device=device)
        dist.recv(length, source)
        data = torch.empty(int(length.item()), dtype=torch.uint8, device=device)
        dist.recv(data, source)
        return bytes(data.cpu().numpy().tobytes())
    size = _reduce_min([-len(payload) if rank == source else 0])[0]  # one lender: broadcast
    return _broadcast_bytes(payload, source, -size)


def _fail_everywhere(what: str, failing: int, error: DevRNGError | None, rank: int,
                     world: int, stage: str) -> None:
    """Raise on every rank the error of rank ``failing`` (the lowest that failed)."""
    text = _broadcast_text(str(error) if error is not None else "", failing)
    if world == 1:
        assert error is not None
        raise error
    outcome = "no rank loaded any" if stage == "load" else "every rank put its own back"
    message = (f"{what}: rank {failing} of {world} could not {stage} its devrng state, so "
               f"{outcome}: {text}")
    raise DevRNGError(message) from error


# -- loading -----------------------------------------------------------------------------
def load_ranked(state_dict: Mapping[str, Any], *, what: str, read: Callable[[Any], Any],
                facts: Callable[[Any], tuple[int, int]],
                prepare: Callable[[Any, Summary], tuple[Apply, str | None]]) -> None:
    """Load one rank's entry, all ranks together: all of them, or none.

    Args:
        state_dict: This rank's ``{"devrng_rank_<r>": entry}``, as ``dcp.load`` filled it (an
            entry that is ``None``, or a dict of ``None``, was not in the checkpoint).
        what: The caller, for messages (``"RNGStreams.load_state_dict"``).
        read: The entry to its plain state; raises ``DevRNGError`` if it is not one.
        facts: A plain state's (world size it records or -1, fingerprint of its state).
        prepare: Checks a plain state (this rank's own, or the lowest rank's if this rank has
            none) against this process, changing nothing; returns the change and a warning
            for every rank, or raises ``DevRNGError``.
    """
    rank, world = process_rank(), _group_world()
    if world == 1:
        rank = 0
    (entry,) = state_dict.values()
    found = not _absent(entry)
    plain: Any = None
    error: DevRNGError | None = None
    saved_world, fingerprint = _NONE, _NONE
    if found:
        try:  # (another rank's entry, from a file of its own, is the object's to judge)
            plain = read(entry)
            saved_world, fingerprint = facts(plain)
            saved_world = _NONE if saved_world < 0 else saved_world
        except DevRNGError as err:
            error = err
    nobody = _NONE if found or error else rank
    ok = found and not error
    (source, highest_found, lowest_missing, highest_missing, bad, world_low, world_high,
     print_low, print_high) = _reduce_min([
        rank if ok else _NONE, -rank if ok else _NONE, nobody,
        -nobody if nobody != _NONE else _NONE, rank if error else _NONE, saved_world,
        -saved_world if saved_world != _NONE else _NONE,
        fingerprint, -fingerprint if fingerprint != _NONE else _NONE])
    if bad != _NONE:
        _fail_everywhere(what, bad, error, rank, world, "load")
    if source == _NONE:
        raise DevRNGError(
            f"{what}: no rank found its entry ('{PREFIX}<rank>') in the checkpoint: it holds no "
            "devrng state under this key (saved without devrng, by another object, or by devrng "
            "0.1, whose state DCP merged across ranks).")
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
        source = rank % lowest_missing if tail else source
    if missing is not None:
        payload = _send_entries(encode(plain) if found else b"", rank, source, missing,
                                -highest_found, world)
        if borrowed:
            plain = decode(payload, f"the entry of rank {source}")
    summary = Summary(rank, world, source if borrowed else rank, missing,
                      None if world_low == _NONE else world_low, print_low == -print_high,
                      borrowed)
    apply, warning = None, None
    try:
        apply, warning = prepare(plain, summary)
    except DevRNGError as err:
        error = err
    failed = _reduce_min([rank if error else _NONE])[0]
    if failed != _NONE:
        _fail_everywhere(what, failed, error, rank, world, "load")
    assert apply is not None
    with Undo(what) as undo:
        try:
            apply(undo)
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as err:
            error = err if isinstance(err, DevRNGError) else DevRNGError(
                f"{what}: {type(err).__name__}: {err}")
        failed = _reduce_min([rank if error else _NONE])[0]
        if failed != _NONE:  # every rank puts back what it applied
            _fail_everywhere(what, failed, error, rank, world, "apply")
        if warning:
            warn_and_log(warning, stacklevel=4)


def _absent(entry: Any) -> bool:
    """Whether an entry holds nothing (``load_planner()`` found no such key in the checkpoint)."""
    if isinstance(entry, Mapping):
        return all(v is None for v in entry.values())
    return entry is None
