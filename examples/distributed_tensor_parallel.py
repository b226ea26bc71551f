"""Tensor parallel with devrng: one stream inside each tensor-parallel group, one per shard.

Run on this machine (CPU, gloo):

    torchrun --nproc_per_node=2 examples/distributed_tensor_parallel.py

Ranks are laid out as tensor-parallel groups of ``--tp`` consecutive ranks
(with 4 ranks and --tp 2: TP groups {0, 1} and {2, 3}, data-parallel groups
{0, 2} and {1, 3}). A toy column-parallel layer shows the two kinds of
randomness in tensor parallelism:

* activations every rank of a TP group holds whole (the layer's input) must get
  the *same* dropout mask on each of them: the default stream is seeded by the
  rank in the data-parallel group, which TP peers share;
* each rank's shard of the hidden layer needs its *own* mask: a named
  ``RNGStreams`` stream seeded per rank, forked around the sharded dropout.
"""
# tested-by: tests/test_distributed.py
# launch: torchrun --standalone --nproc-per-node=2


from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F

import devrng
from devrng import distributed as ddist

SEED = 1234
IN, HIDDEN, BATCH = 8, 16, 4


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, default=2, help="tensor-parallel group size")
    args = parser.parse_args()

    dist.init_process_group("gloo")  # torchrun provides the rendezvous; devrng starts nothing
    rank, world = dist.get_rank(), dist.get_world_size()
    tp = args.tp if world % args.tp == 0 else 1
    # Every rank must create every group, in the same order.
    tp_groups = [dist.new_group(list(range(s, s + tp))) for s in range(0, world, tp)]
    dp_groups = [dist.new_group(list(range(i, world, tp))) for i in range(tp)]
    tp_group, dp_group = tp_groups[rank // tp], dp_groups[rank % tp]
    tp_rank = rank % tp

    # The full weight is made from one seed everywhere; each rank keeps its columns.
    devrng.manual_seed(SEED)
    weight = torch.randn(HIDDEN, IN)
    shard = weight.chunk(tp)[tp_rank]

    # Same stream within a TP group: seed by the rank in the data-parallel group.
    ddist.manual_seed_ranks(SEED, group=dp_group)
    ddist.assert_rng_in_sync(group=tp_group)

    # One stream per shard, independent of the default stream.
    streams = devrng.RNGStreams()
    streams.add("tensor-parallel", ddist.rank_seed(SEED, rank))

    x = torch.randn(BATCH, IN)  # TP peers read the same batch
    x_mask = F.dropout(torch.ones_like(x), 0.5) > 0  # replicated activation: same mask
    h = (x * x_mask) @ shard.T
    with streams.fork("tensor-parallel"):
        h_mask = F.dropout(torch.ones_like(h), 0.5) > 0  # sharded activation: own mask
    h = h * h_mask
    ddist.assert_rng_in_sync(group=tp_group)  # the fork left the default stream alone

    # Check the promise across the TP group.
    def gather(t: torch.Tensor) -> list[torch.Tensor]:
        out = [torch.empty_like(t) for _ in range(tp)]
        dist.all_gather(out, t.contiguous(), group=tp_group)
        return out

    x_masks = gather(x_mask.to(torch.uint8))
    h_masks = gather(h_mask.to(torch.uint8))
    assert all(torch.equal(x_masks[0], m) for m in x_masks), "replicated masks must agree"
    assert tp == 1 or not torch.equal(h_masks[0], h_masks[1]), "shard masks must differ"
    full = torch.cat(gather(h), dim=1)  # the layer's whole output, on every TP rank
    print(f"rank {rank}: tp group {rank // tp}, output {tuple(full.shape)}, "
          f"{len(streams.names)} stream(s) to checkpoint")
    dist.barrier()
    if rank == 0:
        print(f"OK: {world} ranks, TP groups of {tp}: same input mask in a group, own shard masks")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
