"""A small Lightning run that records its per-step losses (float.hex) for the resume tests.

    python -m tests.integrations._lightning_run MODE EPOCHS OUT.json [--save CKPT] [--resume CKPT]

MODE: ``plain`` (``seed_everything(1234, workers=True)``, Lightning's own way),
``devrng`` (``DevRNGCallback(1234)``) or ``devrng-without-state`` (the callback
with its checkpoint state left out, to show the test would see it).
"""

from __future__ import annotations

import json
import random
import sys
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch

from devrng.integrations.lightning import DevRNGCallback

SEED = 1234


class Augmented(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.linspace(-1, 1, 4) * (i + 1) / 32
        x = x + torch.randn(4) * 0.1 + float(np.random.normal()) * 0.05 + random.random() * 0.05
        return x, x.sum(dim=0, keepdim=True) * 0.5


class Net(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(),
                                       torch.nn.Dropout(0.3), torch.nn.Linear(16, 1))
        with torch.no_grad():
            for p in self.net.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
        self.losses: list[str] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.losses.append(float(loss).hex())
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def train_dataloader(self) -> Any:
        return torch.utils.data.DataLoader(Augmented(), batch_size=4, shuffle=True, num_workers=2)


class WithoutState(DevRNGCallback):
    def state_dict(self) -> dict[str, Any]:
        return {}


def main(argv: list[str]) -> None:
    mode, epochs, out = argv[0], int(argv[1]), argv[2]
    save = argv[argv.index("--save") + 1] if "--save" in argv else None
    resume = argv[argv.index("--resume") + 1] if "--resume" in argv else None
    callbacks: list[Any] = []
    if mode == "plain":
        pl.seed_everything(SEED, workers=True, verbose=False)
    else:
        callbacks.append((WithoutState if mode == "devrng-without-state" else DevRNGCallback)(SEED))
    model = Net()
    trainer = pl.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0,
                         callbacks=callbacks)
    trainer.fit(model, ckpt_path=resume)
    if save:
        trainer.save_checkpoint(save)
    with open(out, "w") as fh:
        json.dump(model.losses, fh)


if __name__ == "__main__":
    main(sys.argv[1:])
