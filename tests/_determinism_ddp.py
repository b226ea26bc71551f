"""A plain data-parallel loop (DDP, gloo, CPU) with ``devrng.TrainingRNG``, for
``devrng check-determinism`` on two ranks (tests/test_check_determinism_ranks.py):

    torchrun --standalone --nproc-per-node=2 tests/_determinism_ddp.py [--unordered-sum RANKS]

``--unordered-sum 1`` (or ``0,1``): on those ranks the model's ``pool`` layer is a
``torch.library`` op that sums in an order drawn from ``os.urandom``, as a GPU kernel's
atomic adds do. Without it the script is deterministic.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import devrng

lib = torch.library.Library("determinism_ddp", "DEF")
lib.define("unordered_sum(Tensor x) -> Tensor")


def _unordered_sum(x: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(x[0])
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(
        int.from_bytes(os.urandom(8), "little")))
    for i in order.tolist():
        out = out + x[i]
    return out


def _backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
    return grad.expand(ctx.n, *grad.shape)  # type: ignore[attr-defined]


def _save_n(ctx: object, inputs: tuple[torch.Tensor], output: torch.Tensor) -> None:
    ctx.n = len(inputs[0])  # type: ignore[attr-defined]


lib.impl("unordered_sum", _unordered_sum, "CompositeExplicitAutograd")
torch.library.register_autograd("determinism_ddp::unordered_sum", _backward,
                                setup_context=_save_n)


class Pool(torch.nn.Module):
    """Sums the hidden units in groups of eight (in a fixed order, or not)."""

    def __init__(self, unordered: bool) -> None:
        super().__init__()
        self.unordered = unordered

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        groups = h.reshape(len(h), -1, 8).permute(2, 0, 1)
        if self.unordered:
            return torch.ops.determinism_ddp.unordered_sum(groups)
        return groups.sum(0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--unordered-sum", default="", help="the ranks, as 1 or 0,1")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    unordered = str(rank) in args.unordered_sum.split(",")

    rng = devrng.TrainingRNG(seed=1234)
    model = torch.nn.Sequential()
    model.add_module("encoder", torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh()))
    model.add_module("pool", Pool(unordered))
    model.add_module("head", torch.nn.Linear(4, 1))
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
