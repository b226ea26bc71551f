"""RNG across processes: per-rank seeds, broadcasting a snapshot, checking ranks agree.

Everything here runs on a ``torch.distributed`` process group that the program
has already started (gloo, nccl, xccl, XLA's backend, ...); devrng never
starts one itself and uses only collectives on the group it is given.

How devices are compared across ranks
-------------------------------------
Each process usually drives its own device: rank 0 uses ``cuda:0``, rank 1
uses ``cuda:1``. Their states are therefore matched by device type and by
*position* in the rank's own device list, never by raw index: rank 0's
``cuda:0`` is compared with (or broadcast to) rank 1's ``cuda:1``. With
``devices=None`` each rank covers its *current* device of every device type in
use (the accelerator, XLA, torchax), so replicas on different local GPUs
compare equal. Pass ``devices=`` (the same number of devices per type on every
rank) to cover more than one device per rank.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from devrng._backends.registry import current_index, default_types, get_backend
from devrng._base.errors import DevRNGError
from devrng._base.lazy import load
from devrng._base.plain import hash_into, tensor_bytes
from devrng._base.rank import (
    check_rank,
    collective_device,
    dist_or_none,
    group_size,
    process_rank,
)
from devrng._base.seeds import check_seed
from devrng._base.seeds import rank_seed as derive_rank_seed
from devrng._generators.plan import Plan, make_plan
from devrng._generators.saved import decode, encode
from devrng._generators.seeding import manual_seed
from devrng._generators.snapshot import RNGState, set_rng_state, snapshot, with_devices
from devrng._generators.undo import read_devices

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

__all__ = [
    "RNGSyncError",
    "assert_rng_in_sync",
    "broadcast_rng_state",
    "load_planner",
    "manual_seed_ranks",
    "rank_seed",
]


class RNGSyncError(DevRNGError):
    """Ranks whose RNG state differs from the rest of the group.

    ``ranks`` holds the global ranks that differ from the reference (the most
    common state); ``fingerprints`` maps every global rank to its fingerprint.

    Examples:
        >>> err = RNGSyncError("ranks 3 differ", [3], {0: "a1", 1: "a1", 2: "a1", 3: "b2"})
        >>> err.ranks, isinstance(err, devrng.DevRNGError)
        ((3,), True)
    """

    def __init__(self, message: str, ranks: Sequence[int], fingerprints: dict[int, str]) -> None:
        """Raised by ``assert_rng_synchronized`` with the ranks that differ."""
        super().__init__(message)
        self.ranks = tuple(ranks)
        self.fingerprints = dict(fingerprints)


def load_planner(**kwargs: Any) -> Any:
    """A DCP load planner for a job with more ranks than the checkpoint was saved by.

    ``torch.distributed.checkpoint.load`` with its default planner fails on every
    rank ("Missing key in checkpoint state_dict") when a rank asks for an entry
    no saved rank wrote, as every rank of a grown world does for devrng's
    per-rank entries. This planner is DCP's ``DefaultLoadPlanner`` except that
    devrng's missing entries are marked as not found, and devrng then decides on
    every rank together: continue exactly (a stream the saved rank at this
    rank's place held, with the same seed), seed afresh with a warning
    (``TrainingRNG(strict=False)``), or refuse with a ``DevRNGError`` on every
    rank. Every other key is planned as ``DefaultLoadPlanner`` plans it.
    ``torch.distributed.checkpoint`` is imported when this is first called.

    Args:
        **kwargs: ``DefaultLoadPlanner``'s (``allow_partial_load=True`` also lets
            other keys be missing, as DCP's own option does).

    Returns:
        The planner, for ``dcp.load(..., planner=...)``.

    Examples:
        >>> import torch.distributed.checkpoint as dcp
        >>> stream = devrng.portable(seed=7)
        >>> writer = dcp.FileSystemWriter("ckpt", thread_count=2)  # (see the note below)
        >>> _ = dcp.save({"rng": stream}, storage_writer=writer, no_dist=True)
        >>> dcp.load({"rng": stream}, checkpoint_id="ckpt", no_dist=True,
        ...          planner=devrng.distributed.load_planner())

        (``thread_count=2``: torch 2.9's single-threaded writer asks any registered
        device module for ``current_stream``, which torchax 0.0.13's lacks.)
    """
    return load("devrng._generators.ranks.planner:Planner", what="devrng.distributed.load_planner")(**kwargs)


# -- seeds ---------------------------------------------------------------------
def rank_seed(seed: int, rank: int | None = None) -> int:
    """A well-mixed 64-bit seed for ``rank``, distinct for every rank.

    The result is the SplitMix64 output for stream position ``rank`` of a
    generator seeded with ``seed``: for one ``seed`` two ranks below 2**64
    never get the same value, and the same ``(seed, rank)`` gives the same
    value on every machine.

    Args:
        seed: The run's seed, an int in ``[0, 2**64)``.
        rank: The rank; ``None`` takes the rank in the default process group
            if one is initialised, else the ``RANK`` environment variable,
            else 0.

    Returns:
        A seed in ``[0, 2**64)``.

    Raises:
        TypeError: ``seed`` or ``rank`` is not an int.
        ValueError: ``seed`` or ``rank`` is out of range.

    Examples:
        >>> devrng.distributed.rank_seed(1234, rank=0) != devrng.distributed.rank_seed(1234, rank=1)
        True
    """
    seed = check_seed(seed)
    rank = process_rank() if rank is None else check_rank(rank)
    # Distinct ranks can never share a seed: see devrng._base.seeds.nth_seed.
    return derive_rank_seed(seed, rank)


def manual_seed_ranks(seed: int, *, group: ProcessGroup | None = None) -> int:
    """Seed everything (``devrng.manual_seed``) with this rank's ``rank_seed``.

    Seeding by the rank in a data-parallel group gives the members of each
    tensor-parallel group one shared stream.

    Args:
        seed: The run's seed, an int in ``[0, 2**64)``.
        group: The process group whose rank counts; ``None`` is the default
            group (without any process group, ``RANK`` or 0).

    Returns:
        The seed applied: ``rank_seed(seed, rank)``.

    Raises:
        TypeError: ``seed`` is not an int.
        ValueError: ``seed`` is out of range, or this process is not in ``group``.

    Examples:
        >>> import os, torch.distributed as dist   # a one-process group, for the example
        >>> dist.init_process_group("gloo", init_method="file://" + os.path.abspath("store"),
        ...                         rank=0, world_size=1)
        >>> devrng.distributed.manual_seed_ranks(1234) == devrng.distributed.rank_seed(1234, 0)
        True
        >>> dist.destroy_process_group()
    """
    seed = check_seed(seed)
    if group is None:
        rank = process_rank()
    else:
        dist = _require_dist("manual_seed_ranks")
        rank = int(dist.get_rank(group))
        if rank < 0:
            raise ValueError(
                f"manual_seed_ranks was given a group that this process (global rank "
                f"{process_rank()}) is not a member of; pass a group that contains it, or "
                "group=None for the default group."
            )
    return manual_seed(rank_seed(seed, rank))


# -- process groups ------------------------------------------------------------
def _require_dist(caller: str) -> Any:
    dist = dist_or_none()
    if dist is None:
        raise RuntimeError(
            f"devrng.distributed.{caller} needs torch.distributed, which this build of torch "
            "does not include."
        )
    if not dist.is_initialized():
        raise RuntimeError(
            f"devrng.distributed.{caller} needs an initialised torch.distributed process group, "
            "and there is none; call torch.distributed.init_process_group(...) first (devrng "
            "never starts one itself)."
        )
    return dist


def _group_ranks(dist: Any, group: ProcessGroup | None) -> list[int]:
    """The group's global ranks, in group-rank order."""
    if group is None:
        return list(range(group_size()))
    return [int(r) for r in dist.get_process_group_ranks(group)]


# -- what a rank covers ---------------------------------------------------------
def _local_devices(devices: Any, caller: str) -> Plan:
    """(backend, local indices in position order) for every covered device type."""
    if devices is not None:
        return make_plan(devices, None, caller=f"devrng.distributed.{caller}", warn=False)
    return tuple((backend, (current_index(backend),))
                 for backend in map(get_backend, default_types()))


def _coverage(plan: Plan) -> dict[str, int]:
    return {backend.name: len(indices) for backend, indices in plan}


def _describe_coverage(cov: dict[str, int]) -> str:
    parts = ["cpu"] + [f"{n} ({c} device{'s' if c != 1 else ''})" for n, c in cov.items()]
    return ", ".join(parts)


def _snapshot(plan: Plan, python: bool, numpy: bool) -> RNGState:
    """This rank's state with devices keyed by position, so ranks can be compared."""
    by_position = [(b, pos, s) for b, idx in plan
                   for pos, (_, _, s) in enumerate(read_devices([(b, idx)]))]
    return snapshot(by_position, python=python, numpy=numpy)


def _part_fingerprints(state: RNGState) -> dict[str, str]:
    """One short hash per generator, to say *which* generator differs."""
    parts: dict[str, Any] = {"cpu": state.cpu}
    for name, per in state.devices.items():
        for pos, s in per.items():
            parts[f"{name}[{pos}]"] = s
    if state.python is not None:
        parts["python"] = state.python
    if state.numpy is not None:
        parts["numpy"] = state.numpy
    out = {}
    for label, value in parts.items():
        h = hashlib.sha256()
        hash_into(h, value)
        out[label] = h.hexdigest()[:16]
    return out


def _check_coverage(records: list[dict[str, Any]], caller: str) -> None:
    """All ranks must cover the same device types and counts, or every rank raises."""
    kinds: dict[tuple[tuple[str, int], ...], list[int]] = {}
    for rec in records:
        key = tuple(sorted(rec["coverage"].items()))
        kinds.setdefault(key, []).append(rec["rank"])
    if len(kinds) <= 1:
        return
    lines = "; ".join(
        f"{_ranks_text(ranks)} cover{'s' if len(ranks) == 1 else ''} {_describe_coverage(dict(k))}"
        for k, ranks in kinds.items()
    )
    raise DevRNGError(
        f"devrng.distributed.{caller}: the ranks disagree on which devices they cover ({lines}). "
        "Every rank must cover the same device types with the same number of devices each; "
        "pass devices= explicitly (for example devices=['cuda:<local rank>']) on every rank."
    )


def _ranks_text(ranks: Sequence[int]) -> str:
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def _all_gather(dist: Any, group: ProcessGroup | None, record: dict[str, Any]) -> list[dict[str, Any]]:
    size = dist.get_world_size(group)
    out: list[Any] = [None] * size
    # Only short strings and ints travel this way; states go as tensors (see broadcast).
    dist.all_gather_object(out, record, group=group)
    return out


# -- broadcast -----------------------------------------------------------------
def broadcast_rng_state(src: int = 0, *, group: ProcessGroup | None = None, devices: Any = None,
                        python: bool = True, numpy: bool = True) -> None:
    """Give every rank of ``group`` the RNG state of global rank ``src``.

    Covers the CPU generator, each rank's devices (see the module notes: the
    current device of each device type in use, or ``devices``; matched by
    position, so rank 0's ``cuda:0`` state lands on rank 1's ``cuda:1``), and
    Python's and NumPy's generators unless ``python`` / ``numpy`` is false.
    ``src`` is a global rank, as in ``torch.distributed.broadcast``. The
    snapshot travels as a weights-only ``torch.save`` payload in a uint8
    tensor, so receiving it never unpickles arbitrary objects. Ranks outside
    ``group`` return at once, as torch's collectives do.

    Args:
        src: The global rank whose state every rank takes.
        group: The process group; ``None`` is the default group.
        devices: The devices each rank covers (the same number per type on
            every rank); ``None`` covers the current device of each type in use.
        python: Include Python's ``random``.
        numpy: Include NumPy's global generator.

    Raises:
        RuntimeError: No process group is initialised.
        TypeError: ``src`` is not an int.
        ValueError: ``src`` is not in ``group``.
        DevRNGError: The ranks cover different devices, or the received
            state does not fit this rank; nothing was changed.

    Examples:
        >>> import os, torch.distributed as dist   # a one-process group, for the example
        >>> dist.init_process_group("gloo", init_method="file://" + os.path.abspath("store"),
        ...                         rank=0, world_size=1)
        >>> devrng.distributed.broadcast_rng_state(src=0)  # all replicas now draw alike
        >>> dist.destroy_process_group()
    """
    dist = _require_dist("broadcast_rng_state")
    if dist.get_rank(group) < 0:
        return
    ranks = _group_ranks(dist, group)
    src = check_rank(src, "src")  # a global rank
    if src not in ranks:
        raise ValueError(
            f"src={src} is not a member of the group, whose global ranks are "
            f"{', '.join(map(str, ranks))}; src is a global rank, as in torch.distributed.broadcast."
        )
    me = process_rank()
    plan = _local_devices(devices, "broadcast_rng_state")
    payload = b""
    if me == src:
        payload = encode(_snapshot(plan, python, numpy).to_dict())
    records = _all_gather(dist, group, {"rank": me, "coverage": _coverage(plan),
                                        "size": len(payload)})
    _check_coverage(records, "broadcast_rng_state")
    size = next(rec["size"] for rec in records if rec["rank"] == src)
    device = collective_device(group)
    if me == src:
        data = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(device)
    else:
        data = torch.empty(size, dtype=torch.uint8, device=device)
    dist.broadcast(data, src=src, group=group)
    if me == src:
        return
    source = f"the RNG state broadcast by rank {src}"
    state = RNGState.from_dict(decode(tensor_bytes(data), source), source=source)
    # Positions back to this rank's own device indices.
    local = {b.name: {idx[pos]: s for pos, s in state.devices[b.name].items()} for b, idx in plan}
    set_rng_state(with_devices(state, local, python=python, numpy=numpy))


# -- check -----------------------------------------------------------------------
def assert_rng_in_sync(*, group: ProcessGroup | None = None, devices: Any = None,
                       python: bool = True, numpy: bool = True) -> None:
    """Raise unless every rank of ``group`` holds the same RNG state.

    Each rank's ``RNGState.fingerprint()`` (of the CPU generator, its devices
    matched by type and position, and Python / NumPy unless switched off) is
    gathered with ``all_gather_object``. The reference is the fingerprint most
    ranks share (a tie goes to the one held by the lowest rank). Ranks outside
    ``group`` return at once.

    Args:
        group: The process group; ``None`` is the default group.
        devices: The devices each rank covers (the same number per type on
            every rank); ``None`` covers the current device of each type in use.
        python: Include Python's ``random``.
        numpy: Include NumPy's global generator.

    Raises:
        RNGSyncError: On every rank, when some rank's state differs from the
            reference; it names those ranks (global ranks) and which
            generators differ.
        RuntimeError: No process group is initialised.
        DevRNGError: The ranks cover different devices.

    Examples:
        >>> import os, torch.distributed as dist   # a one-process group, for the example
        >>> dist.init_process_group("gloo", init_method="file://" + os.path.abspath("store"),
        ...                         rank=0, world_size=1)
        >>> devrng.distributed.broadcast_rng_state(src=0)
        >>> devrng.distributed.assert_rng_in_sync()  # passes
        >>> dist.destroy_process_group()
    """
    dist = _require_dist("assert_rng_in_sync")
    if dist.get_rank(group) < 0:
        return
    plan = _local_devices(devices, "assert_rng_in_sync")
    snap = _snapshot(plan, python, numpy)
    record = {"rank": process_rank(), "coverage": _coverage(plan),
              "fingerprint": snap.fingerprint(), "parts": _part_fingerprints(snap)}
    records = _all_gather(dist, group, record)
    _check_coverage(records, "assert_rng_in_sync")
    counts = Counter(rec["fingerprint"] for rec in records)
    lowest: dict[str, int] = {}
    for rec in sorted(records, key=lambda r: r["rank"]):
        lowest.setdefault(rec["fingerprint"], rec["rank"])
    reference = max(counts, key=lambda fp: (counts[fp], -lowest[fp]))
    agree = sorted(rec["rank"] for rec in records if rec["fingerprint"] == reference)
    differ = sorted((rec for rec in records if rec["fingerprint"] != reference),
                    key=lambda r: r["rank"])
    if not differ:
        return
    ref_parts = next(rec["parts"] for rec in records if rec["fingerprint"] == reference)
    details = "; ".join(
        f"rank {rec['rank']} in {', '.join(k for k, v in rec['parts'].items() if ref_parts.get(k) != v)}"
        for rec in differ
    )
    bad = [rec["rank"] for rec in differ]
    raise RNGSyncError(
        f"RNG state is out of sync: {_ranks_text(bad)} differ{'s' if len(bad) == 1 else ''} from "
        f"{_ranks_text(agree)} (fingerprint {reference}); generators that differ: {details}. "
        "Call devrng.distributed.broadcast_rng_state(src=...) to re-synchronise, or find the "
        "code that drew random numbers on only some ranks.",
        bad,
        {rec["rank"]: rec["fingerprint"] for rec in records},
    )
