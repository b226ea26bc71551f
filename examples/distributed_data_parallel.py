"""Data parallel with devrng: the same initial weights on every rank, a different dropout per rank.

Run on this machine (CPU, gloo):

    torchrun --nproc_per_node=2 examples/distributed_data_parallel.py

On GPUs pass ``--backend nccl``; each rank then drives ``cuda:<LOCAL_RANK>``.
"""
# tested-by: tests/test_distributed.py
# launch: torchrun --standalone --nproc-per-node=2


from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import devrng
from devrng import distributed as ddist

SEED = 1234


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()

    # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; devrng starts no group itself.
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu")
    if args.backend == "nccl":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)

    # 1. Same init: one seed on every rank, so every replica starts from the same weights.
    devrng.manual_seed(SEED)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 1)).to(device)
    ddist.assert_rng_in_sync()  # every rank drew exactly the same numbers so far
    ddp = DistributedDataParallel(model)

    # 2. Different dropout per rank: each rank gets its own well-mixed seed.
    my_seed = ddist.manual_seed_ranks(SEED)
    try:
        ddist.assert_rng_in_sync()
    except ddist.RNGSyncError as err:  # intended: the streams differ now
        if rank == 0:
            print(f"streams differ per rank, as intended: ranks {err.ranks} differ from rank 0")

    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for _ in range(args.steps):
        x = torch.randn(16, 8, device=device)  # stands in for this rank's shard of the data
        loss = ddp(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    # Dropout masks differ across ranks ...
    mask = (torch.nn.functional.dropout(torch.ones(32, device=device), 0.5) > 0).to(torch.uint8)
    masks = [torch.empty_like(mask) for _ in range(world)]
    dist.all_gather(masks, mask)
    assert all(not torch.equal(masks[0], m) for m in masks[1:]), "dropout masks should differ"
    # ... and the weights stay identical, because DDP averages the gradients.
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    every = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(every, flat)
    assert all(torch.equal(every[0], w) for w in every[1:]), "replicas should hold equal weights"

    # A checkpoint keeps each rank's stream: save one snapshot per rank.
    state = devrng.get_rng_state()
    print(f"rank {rank}: seed {my_seed}, rng fingerprint {state.fingerprint()}")
    if rank == 0:
        print(f"OK: {world} ranks, same weights, different dropout per rank")
    dist.barrier()  # no rank closes its connections while a peer may still be sending
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
