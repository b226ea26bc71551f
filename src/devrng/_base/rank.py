"""This process's distributed rank, read the same way everywhere in devrng.

The default ``torch.distributed`` process group is asked first, then the
``RANK`` environment variable (set by torchrun and most launchers), else 0.
DataLoader workers read it leniently (a worker must never fail on a bad
``RANK``); ``devrng.distributed`` reads it strictly.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from devrng._base.seeds import MASK64

__all__ = ["collective_device", "dist_or_none", "env_rank", "process_rank", "world_size"]


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
        value = int(raw)
    except ValueError:
        if not strict:
            return 0
        raise ValueError(
            f"The RANK environment variable is {raw!r}, which is not a non-negative integer; "
            "set it to this process's rank or pass rank= explicitly."
        ) from None
    if not 0 <= value <= MASK64:
        if not strict:
            return 0
        raise ValueError(
            f"The RANK environment variable is {value}; a rank must be 0 or more and below 2**64."
        )
    return value


def world_size() -> int:
    """How many ranks: the default process group's size, else ``WORLD_SIZE``, else 1."""
    dist = dist_or_none()
    if dist is not None and dist.is_initialized():
        return int(dist.get_world_size())
    raw = os.environ.get("WORLD_SIZE", "").strip()
    return int(raw) if raw.isdigit() and int(raw) > 0 else 1


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
