"""This process's distributed rank and the job's world size, read the same way everywhere in devrng.

The default ``torch.distributed`` process group is asked first, then the
``RANK`` and ``WORLD_SIZE`` environment variables (set by torchrun and most
launchers), else rank 0 of 1: a torchrun rank before ``init_process_group`` is
the rank of the job it belongs to, so what it records in a checkpoint and what
it checks on resume agree. DataLoader workers read the rank leniently (a
worker must never fail on a bad ``RANK``); ``devrng.distributed`` reads it
strictly. How many processes take part in a collective is another fact:
``group_size``, the default group's size (1 without one). No other module reads
these variables or asks torch for the default group's rank or size
(``tests/test_layering.py`` checks it).

What a rank is -- an int of 0 or more -- is read here too, in one wording
(``count_problem``), for a rank given as an argument (``check_rank``), the ``RANK``
variable, and the rank and world size a saved state records.
"""

from __future__ import annotations

import numbers
import os
from typing import Any

import torch

from devrng._base.errors import short_repr

__all__ = [
    "MAX_RANKS",
    "check_rank",
    "collective_device",
    "count_problem",
    "dist_or_none",
    "env_rank",
    "group_size",
    "process_rank",
    "world_size",
]

#: No job has this many ranks: a rank or world size a saved state records this large is junk.
MAX_RANKS = 1 << 32
_ANY_RANK = 1 << 64  # ranks given to devrng index seed streams (rank_seed): any below 2**64


def count_problem(value: Any, low: int = 0, high: int = MAX_RANKS) -> str | None:
    """What is wrong with a rank (``low`` 0) or a world size (``low`` 1), in words that follow
    its name ("is -1, not an int of 0 or more"), or None when it is one (below ``high``).

    Examples:
        >>> count_problem([[2]], 1)
        'is [[2]], not an int of 1 or more'
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < low:
        return f"is {short_repr(value)}, not an int of {low} or more"
    if int(value) >= high:
        return f"is {short_repr(value)}, more ranks than any job has"
    return None


def check_rank(rank: Any, name: str = "rank") -> int:
    """``rank``, given as an argument, as an int; a ``TypeError`` (not an int) or ``ValueError``
    (out of range) in the words of ``count_problem``.

    Examples:
        >>> check_rank(3)
        3
    """
    problem = count_problem(rank, 0, _ANY_RANK)
    if problem is not None:
        integral = isinstance(rank, numbers.Integral) and not isinstance(rank, bool)
        raise (ValueError if integral else TypeError)(f"{name} {problem}.")
    return int(rank)


def dist_or_none() -> Any:
    """``torch.distributed``, or None in a torch built without it."""
    return torch.distributed if torch.distributed.is_available() else None


def process_rank(*, strict: bool = True) -> int:
    """This process's global rank: the default process group's, else ``RANK``, else 0.

    With ``strict=False`` (DataLoader workers, which must never fail on it) a
    bad ``RANK`` or a half-torn-down group reads as rank 0; otherwise both raise.

    Examples:
        >>> process_rank()
        0
    """
    dist = dist_or_none()
    try:
        if dist is not None and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:
        if strict:
            raise
    return env_rank(strict=strict)


def env_rank(*, strict: bool = True) -> int:
    """The ``RANK`` environment variable as a rank (0 when unset); see ``process_rank``."""
    raw = os.environ.get("RANK", "")
    if not raw.strip():
        return 0
    try:
        value: Any = int(raw)
    except ValueError:
        value = raw
    problem = count_problem(value, 0, _ANY_RANK)
    if problem is not None:
        if not strict:
            return 0
        raise ValueError(f"The RANK environment variable {problem}; set it to this process's "
                         "rank or pass rank= explicitly.")
    return int(value)


def world_size() -> int:
    """How many ranks the job has: the default process group's size, else ``WORLD_SIZE``,
    else 1 (``process_rank``'s counterpart: what a checkpoint records and a resume checks).

    Examples:
        >>> world_size()
        1
    """
    dist = dist_or_none()
    if dist is not None and dist.is_initialized():
        return int(dist.get_world_size())
    raw = os.environ.get("WORLD_SIZE", "").strip()
    return int(raw) if raw.isdigit() and int(raw) > 0 else 1


def group_size() -> int:
    """How many processes take part in a collective on the default group: its size, or 1
    without one (a process that has no group talks to nobody, whatever ``WORLD_SIZE`` says).

    Examples:
        >>> group_size()
        1
    """
    dist = dist_or_none()
    return int(dist.get_world_size()) if dist is not None and dist.is_initialized() else 1


def collective_device(group: Any = None) -> torch.device:
    """The device a group's collectives take tensors on (CPU for gloo, CUDA for nccl, ...)."""
    dist = torch.distributed
    pick = getattr(dist.distributed_c10d, "_get_object_coll_device", None)
    if pick is not None:
        try:
            return torch.device(pick(group))
        except Exception:  # a group type that private helper does not know
            pass
    backend = str(dist.get_backend(group))
    return torch.device({"nccl": "cuda", "xccl": "xpu"}.get(backend, "cpu"))
