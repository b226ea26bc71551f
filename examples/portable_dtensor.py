"""Tensor-parallel init and dropout on DTensors, the same numbers as on one process.

Run on this machine (CPU, gloo):

    torchrun --standalone --nproc-per-node=2 examples/portable_dtensor.py

A column-parallel linear layer keeps its weight sharded by rows across the ranks
(``Shard(0)``). Inside ``devrng.portable``, ``nn.init`` fills each rank's rows with
exactly the values the same call gives the whole weight in a single process, and
dropout on the sharded activation draws each rank's slice of the full mask: no
communication, and no warning, on a CPU mesh where PyTorch's own DTensor random ops
do not work (pytorch/pytorch#138329). Every rank checks its shards against the
single-process result.
"""
# launch: torchrun --standalone --nproc-per-node=2
# timeout: 300

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

import devrng

IN, OUT, BATCH = 8, 12, 4


def main() -> None:
    dist.init_process_group("gloo")  # torchrun provides the rendezvous
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    x = torch.ones(BATCH, IN)

    with devrng.portable(seed=1234):
        weight = distribute_tensor(torch.empty(OUT, IN), mesh, [Shard(0)])  # rows on ranks
        torch.nn.init.kaiming_uniform_(weight)
        hidden = distribute_tensor(x @ weight.full_tensor().T, mesh, [Shard(1)])
        dropped = F.dropout(hidden, 0.5)  # each rank: its columns of the full mask

    # The same ops on whole tensors, in this process alone.
    with devrng.portable(seed=1234):
        full_weight = torch.nn.init.kaiming_uniform_(torch.empty(OUT, IN))
        full_dropped = F.dropout(x @ full_weight.T, 0.5)

    rows = OUT // world
    assert torch.equal(weight.to_local(), full_weight[rank * rows:(rank + 1) * rows])
    assert torch.equal(dropped.to_local(), full_dropped[:, rank * rows:(rank + 1) * rows])
    print(f"rank {rank}: weight rows {rank * rows}..{(rank + 1) * rows - 1} and dropout "
          "columns equal the single-process draw")
    dist.barrier()
    if rank == 0:
        print(f"OK: {world} ranks, each holding its slice of the full draw")
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # skip gloo's exit-time teardown (see docs/known-issues.md)


if __name__ == "__main__":
    main()
