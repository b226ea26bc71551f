"""Portable draws on DTensors: each rank computes exactly its slice of the full draw.

A counter-based generator needs no communication to shard: element i of
the full draw comes from counter i, so a rank draws the counters of the
elements it holds (the global row-major index of each local element) and
gets the values the same op gives on the whole tensor, on any mesh and any
``Shard`` / ``Replicate`` layout. PyTorch's own DTensor RNG instead moves a
device generator's offset, which works on CUDA-like meshes only
(pytorch/pytorch#138329: not on CPU/gloo). Imported only when portable meets
a DTensor.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from devrng._base.errors import DevRNGError

__all__ = ["check_placements", "fill_", "new_like", "noise_like", "shard_counters"]

Draw = Callable[[Any, tuple[int, ...]], torch.Tensor]


def check_placements(dt: DTensor) -> None:
    for placement in dt.placements:
        # _StridedShard (FSDP2 + TP) is a Shard whose local elements are not one box.
        if type(placement) not in (Shard, Replicate):
            raise DevRNGError(
                f"devrng.portable draws DTensors placed with Shard and Replicate; this one has "
                f"{placement} in {tuple(dt.placements)}. Redistribute it (e.g. to Replicate) "
                "before the random op."
            )


def shard_counters(global_shape: Sequence[int], local_shape: Sequence[int],
                   offsets: Sequence[int], device: torch.device) -> torch.Tensor:
    """The global row-major index of each element of a box of the full tensor (int64)."""
    counters = torch.zeros((), dtype=torch.int64, device=device)
    stride = 1
    for dim in reversed(range(len(global_shape))):
        view = [1] * len(global_shape)
        view[dim] = int(local_shape[dim])
        along = torch.arange(int(local_shape[dim]), dtype=torch.int64, device=device)
        counters = counters + ((along + int(offsets[dim])) * stride).reshape(view)
        stride *= int(global_shape[dim])
    return counters.expand(tuple(int(n) for n in local_shape)).contiguous()


def _box(dt: DTensor) -> tuple[tuple[int, ...], tuple[int, ...]]:
    check_placements(dt)
    local_shape, offsets = compute_local_shape_and_global_offset(dt.shape, dt.device_mesh,
                                                                 dt.placements)
    return tuple(local_shape), tuple(offsets)


def _local_draw(rng: Any, dt: DTensor, draw: Draw, global_shape: Sequence[int],
                keep_dims: int | None = None) -> torch.Tensor:
    """This rank's part of ``draw`` over ``global_shape`` (the dims of ``dt`` from
    ``keep_dims`` on are size 1 in it: a channel mask)."""
    local_shape, offsets = _box(dt)
    if keep_dims is not None:
        local_shape = (*local_shape[:keep_dims], *([1] * (len(local_shape) - keep_dims)))
        offsets = (*offsets[:keep_dims], *([0] * (len(offsets) - keep_dims)))
    local = dt.to_local()
    counters = shard_counters(global_shape, local_shape, offsets, local.device)
    if math.prod(local_shape) == 0:  # an empty shard still takes its turn in the stream
        rng.next_key(local.device)
        return torch.empty(local_shape, dtype=local.dtype, device=local.device)
    return draw(rng.source(local.device, counters), local_shape)


def fill_(rng: Any, dt: DTensor, draw: Draw) -> DTensor:
    """``dt`` filled in place, each rank writing its own slice of the full draw."""
    values = _local_draw(rng, dt, draw, dt.shape)
    with torch.no_grad():
        dt.to_local().copy_(values)
    return dt


def new_like(rng: Any, like: DTensor, draw: Draw) -> DTensor:
    """A new DTensor laid out as ``like`` holding this rank's slice of the full draw."""
    values = _local_draw(rng, like, draw, like.shape)
    return DTensor.from_local(values, like.device_mesh, like.placements, run_check=False,
                              shape=like.shape, stride=like.stride())


def noise_like(rng: Any, x: DTensor, noise_shape: Sequence[int], draw: Draw) -> DTensor:
    """Dropout noise for ``x``: elementwise (``noise_shape == x.shape``) or one value per
    (batch, channel), as a DTensor that multiplies ``x`` without communication."""
    if tuple(noise_shape) == tuple(x.shape):
        return new_like(rng, x, draw)
    values = _local_draw(rng, x, draw, noise_shape, keep_dims=2)
    # The channel mask is size 1 along the spatial dims: replicated where x is split there.
    placements = [p if not (isinstance(p, Shard) and p.dim >= 2) else Replicate()
                  for p in x.placements]
    stride = torch.empty(tuple(noise_shape), device="meta").stride()
    return DTensor.from_local(values, x.device_mesh, placements, run_check=False,
                              shape=torch.Size(noise_shape), stride=stride)
