"""FSDP2 + tensor parallelism on a 2x2 DeviceMesh, checkpointed with DCP, stopped and resumed.

Run it as it is (it starts its own torchrun jobs, 4 processes each, gloo on the CPU):

    python examples/distributed_checkpoint.py

A small transformer block with dropout is sharded with ``parallelize_module``
(tensor parallel, "tp") and ``fully_shard`` (FSDP2, "dp") on a 2x2 mesh. Its
dropout runs inside the run's portable stream (``TrainingRNG.portable()``), so the
masks of the tensor-parallel (sharded) activations are slices of one full mask,
and batches come from the global generator. Three fresh ``torchrun`` jobs:

1. the uninterrupted run: STEPS steps, a DCP checkpoint after the first half
   (``dcp.save({"model": ..., "optim": ..., "rng": rng})``), every rank's losses and
   weights recorded; the job then ends, as a run killed after its checkpoint;
2. the resumed run: fresh processes load the checkpoint and train the second half:
   every rank's losses and weights equal the uninterrupted run's, bitwise;
3. the control: the same, loading the model and optimizer but not devrng's state:
   the losses differ (dropout masks and batches are drawn anew).

Finally this process runs the same model unsharded on one process inside the same
portable stream, on data-parallel rank 0's batches: its dropout masks equal the full
masks of rank 0's tensor-parallel activations in the 4-rank run.
"""
# launch: python
# timeout: 900
# tested-by: tests/test_dcp.py

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import devrng

SEED, STEPS, VOCAB, DIM, SEQ, BATCH = 1234, 6, 32, 16, 8, 4
HALF = STEPS // 2


class Block(nn.Module):
    """Embedding, one attention-like mixing layer and an MLP, with dropout that records its
    mask (the mask is drawn on a tensor of ones, then applied: one random op per call)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.mix = nn.Linear(3 * DIM, DIM)
        self.up = nn.Linear(DIM, 4 * DIM)
        self.down = nn.Linear(4 * DIM, DIM)
        self.head = nn.Linear(DIM, VOCAB)
        self.masks: list[torch.Tensor] = []

    def dropout(self, x: torch.Tensor) -> torch.Tensor:
        mask = F.dropout(torch.ones_like(x), 0.2)
        full = mask.full_tensor() if hasattr(mask, "full_tensor") else mask
        self.masks.append(full.detach().clone())
        return x * mask

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        h = h + self.mix(self.dropout(torch.relu(self.qkv(h))))   # tensor-parallel activation
        h = h + self.down(self.dropout(torch.relu(self.up(h))))   # tensor-parallel activation
        return self.head(h)


def batch(dp_rank: int, dp_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(0, VOCAB, (BATCH * dp_size, SEQ + 1))  # the global generator
    mine = tokens[dp_rank::dp_size]
    return mine[:, :-1], mine[:, 1:]


def worker(mode: str, out: Path, ckpt: Path) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    rng = devrng.TrainingRNG(seed=SEED)          # seeds everything before the model is built
    stream = rng.portable()                      # the dropout's stream, tracked by rng
    model = Block()
    # Sharded activations stay DTensors, so that a portable draw is a slice of the full one.
    sharded = ColwiseParallel(use_local_output=False)
    parallelize_module(model, mesh["tp"], {
        "qkv": sharded, "mix": RowwiseParallel(input_layouts=Shard(-1)),
        "up": ColwiseParallel(use_local_output=False),
        "down": RowwiseParallel(input_layouts=Shard(-1))})
    fully_shard(model, mesh=mesh["dp"])
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    dp_rank, dp_size = mesh["dp"].get_local_rank(), mesh["dp"].size()

    def state() -> dict[str, Any]:
        model_sd, optim_sd = get_state_dict(model, optim)
        return {"model": model_sd, "optim": optim_sd, "rng": rng}

    def train(steps: int) -> list[float]:
        losses = []
        for _ in range(steps):
            x, y = batch(dp_rank, dp_size)
            with stream:
                logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
            loss.backward()
            optim.step()
            optim.zero_grad()
            losses.append(loss.item())
        return losses

    losses = []
    if mode == "uninterrupted":
        losses += train(HALF)
        dcp.save(state(), checkpoint_id=str(ckpt))
    else:
        states = state()
        if mode == "control":
            del states["rng"]                    # the same program without devrng's state
        dcp.load(states, checkpoint_id=str(ckpt))
        set_state_dict(model, optim, model_state_dict=states["model"],
                       optim_state_dict=states["optim"])
    losses += train(STEPS - HALF)
    weights = [p.full_tensor().detach().reshape(-1).tolist() for p in model.parameters()]
    result = {"losses": losses, "weights": weights,
              "masks": [m.reshape(-1).tolist() for m in model.masks]}
    (out / f"{mode}-{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def launch(mode: str, out: Path, ckpt: Path) -> list[dict[str, Any]]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("RANK", None)
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc_per_node=4", __file__, mode, str(out), str(ckpt)],
                   check=True, env=env, stdout=subprocess.DEVNULL)
    return [json.loads((out / f"{mode}-{r}.json").read_text()) for r in range(4)]


def single_process_masks() -> list[list[float]]:
    """The same model, unsharded, on one process, inside the same portable stream, fed the
    batches of data-parallel rank 0 (each data-parallel replica draws from the same stream)."""
    rng = devrng.TrainingRNG(seed=SEED)
    stream = rng.portable()
    model = Block()
    for _ in range(STEPS):
        x, _ = batch(0, 2)
        with stream:
            model(x)
    return [m.reshape(-1).tolist() for m in model.masks]


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out, ckpt = Path(tmp), Path(tmp, "ckpt")
        full = launch("uninterrupted", out, ckpt)
        resumed = launch("resumed", out, ckpt)
        control = launch("control", out, ckpt)
    for rank in range(4):
        assert resumed[rank]["losses"] == full[rank]["losses"][HALF:], f"rank {rank}: losses"
        assert resumed[rank]["weights"] == full[rank]["weights"], f"rank {rank}: weights"
    assert all(control[r]["losses"] != full[r]["losses"][HALF:] for r in range(4)), \
        "without devrng's state the resumed run should differ"
    masks = single_process_masks()
    assert full[0]["masks"] == masks[:len(full[0]["masks"])], "portable masks differ"
    print("rank 0 losses, uninterrupted:", [f"{x:.4f}" for x in full[0]["losses"]])
    print("rank 0 losses, resumed:      ", [f"{x:.4f}" for x in resumed[0]["losses"]])
    print("rank 0 losses, control:      ", [f"{x:.4f}" for x in control[0]["losses"]])
    print("OK: resumed bitwise on every rank; the control differs; the 2x2 run's dropout "
          "masks are the single-process run's")


if __name__ == "__main__":
    if len(sys.argv) == 4:
        worker(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        main()
