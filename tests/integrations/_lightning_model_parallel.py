"""Lightning's ModelParallelStrategy (FSDP2 through DCP) with DevRNGCallback, on 2 CPU ranks.

    torchrun --nproc_per_node=2 tests/integrations/_lightning_model_parallel.py OUT MODE

Each rank seeds its own stream (``DevRNGCallback(per_rank=True)``), so dropout differs
from rank to rank. ``MODE`` ``A``: two epochs, a checkpoint after each (a DCP directory
for the model and optimizer, and ``meta.pt`` that rank 0 writes with the callbacks'
state); ``B``: fresh processes resume from the first epoch's checkpoint. Each rank writes
its losses (``float.hex``) and the devrng warnings it saw to ``OUT/MODE-<rank>.json``.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import ModelParallelStrategy

import devrng
from devrng.integrations.lightning import DevRNGCallback


class Net(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(),
                                       torch.nn.Dropout(0.3), torch.nn.Linear(32, 1))
        self.losses: list[str] = []

    def configure_model(self) -> None:
        from torch.distributed.fsdp import fully_shard

        fully_shard(self.net, mesh=self.device_mesh["data_parallel"])

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = self.net(batch).pow(2).mean() + torch.rand(()) * 0  # a draw of the global stream
        self.losses.append(float(loss).hex())
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=0.01)

    def train_dataloader(self) -> Any:
        data = torch.randn(32, 8, generator=torch.Generator().manual_seed(0))  # fixed data
        return torch.utils.data.DataLoader(data, batch_size=4)


class Record(pl.Callback):
    """The host generators when the callbacks are set up, after the strategy reseeded every
    rank from PL_GLOBAL_SEED and devrng's callback seeded each its own stream again."""

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.fingerprint = devrng.get_rng_state(devices=[]).fingerprint()


def main(out: Path, mode: str) -> None:
    callback = DevRNGCallback(1234, per_rank=True)
    record = Record()
    model = Net()
    checkpoints = pl.callbacks.ModelCheckpoint(dirpath=out / "ck", filename="{epoch}",
                                               save_top_k=-1)
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", devices=2, logger=False,
                         strategy=ModelParallelStrategy(data_parallel_size=2,
                                                        tensor_parallel_size=1),
                         callbacks=[callback, record, checkpoints], enable_progress_bar=False,
                         enable_model_summary=False, use_distributed_sampler=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model, ckpt_path=out / "ck" / "epoch=0.ckpt" if mode == "B" else None)
    found = [str(w.message) for w in caught if issubclass(w.category, devrng.DevRNGWarning)]
    result = {"losses": model.losses, "warnings": found, "fingerprint": record.fingerprint}
    (out / f"{mode}-{trainer.global_rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
