"""The collectives of the per-rank protocol: a few integers reduced, a few bytes sent.

None of them talks to anyone without a process group of more than one rank
(``group_size``): a single process runs the same code, and each collective returns
what it was given. Every rank calls each of them in the same order (``load_ranked``
makes sure of it), so they never wait for a rank that went another way. ``first_of``
is no collective: a rank asks the job's store and never waits for another rank.
"""

from __future__ import annotations

import os

import torch

from devrng._base.errors import DevRNGError
from devrng._base.rank import collective_device, group_size, process_rank

__all__ = ["fail_everywhere", "first_of", "reduce_min", "send_entries"]

_TEXT = 4096  # bytes of an error message sent from one rank to the others


def reduce_min(values: list[int]) -> list[int]:
    """The element-wise minimum of ``values`` over every rank (one ``all_reduce``)."""
    if group_size() == 1:
        return values
    dist = torch.distributed
    t = torch.tensor(values, dtype=torch.int64, device=collective_device())
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return [int(v) for v in t.cpu().tolist()]


def first_of(key: str, value: int) -> int | None:
    """The first value any rank offered for ``key`` in the job's store (``value`` if this rank
    is the first): ranks that offer values for the same key get the same one, and none waits
    for the others. None without a process group, or with a store that cannot do this."""
    if group_size() == 1:
        return None
    dist = torch.distributed
    get_store = getattr(dist.distributed_c10d, "_get_default_store", None)
    try:
        store = get_store() if get_store is not None else None
        if store is None:
            return None
        # (A restarted torchrun job may keep its store: its round is part of the key.)
        round_ = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        won = store.compare_set(f"devrng/{round_}/{key}", "", str(value))
        return int(won)
    except Exception:  # a store without compare_set, or one that failed: no agreement here
        return None


def _broadcast_bytes(data: bytes, src: int, size: int) -> bytes:
    """``src``'s ``data`` (``size`` bytes at most) on every rank."""
    if group_size() == 1:
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


def send_entries(payload: bytes, rank: int, source: int, missing: tuple[int, int],
                 highest_found: int) -> bytes:
    """Give each rank without an entry the entry of its ``source`` (see ``load_ranked``):
    in a grown world saved rank ``s`` sends its own to ranks ``s + k * low``; else the one
    lender broadcasts it. ``rank``: this process's place in the group."""
    low, high = missing
    if highest_found < low:
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
    size = reduce_min([-len(payload) if rank == source else 0])[0]
    return _broadcast_bytes(payload, source, -size)


def fail_everywhere(what: str, failing: int, error: DevRNGError | None, world: int,
                    stage: str) -> None:
    """Raise on every rank the error of rank ``failing`` (the lowest that failed) in
    ``stage`` (``"load"``: nothing was applied; ``"apply"``: every rank put its own back)."""
    text = _broadcast_text(str(error) if error is not None else "", failing)
    if world == 1:
        assert error is not None
        raise error
    outcome = "no rank loaded any" if stage == "load" else "every rank put its own back"
    message = (f"{what}: rank {failing} of {world} could not {stage} its devrng state, so "
               f"{outcome}: {text}")
    raise DevRNGError(message) from error
