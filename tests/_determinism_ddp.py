"""A plain data-parallel loop (DDP, gloo, CPU) with ``devrng.TrainingRNG``, for
``devrng check-determinism`` on two ranks (tests/test_check_determinism_ranks.py):

    torchrun --standalone --nproc-per-node=2 tests/_determinism_ddp.py [--unordered-sum RANKS]

``--unordered-sum 1`` (or ``0,1``): on those ranks the model's ``pool`` layer is a
``torch.library`` op (tests/_unordered_sum.py) that sums in an order drawn from ``os.urandom``, as a GPU kernel's
atomic adds do. Without it the script is deterministic.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from tests._unordered_sum import network
from torch.nn.parallel import DistributedDataParallel

import devrng


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--unordered-sum", default="", help="the ranks, as 1 or 0,1")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    unordered = str(rank) in args.unordered_sum.split(",")

    rng = devrng.TrainingRNG(seed=1234)
    model = network(unordered)
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    data = torch.utils.data.TensorDataset(torch.linspace(-1, 1, 64 * 8).reshape(64, 8))
    sampler = torch.utils.data.DistributedSampler(data, seed=rng.seed)
    loader = torch.utils.data.DataLoader(data, batch_size=8, sampler=sampler,
                                         **rng.dataloader_kwargs())
    rng.track("loader", loader)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for (x,) in loader:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp(x), x.sum(1, keepdim=True))
            loss.backward()
            opt.step()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
