"""DevRNGCallback's seeding under Lightning's DDP strategy on CPU processes.

    python -m tests.integrations._lightning_seeds OUT DEVICES

Fits a tiny model three times in one program with ``Trainer(strategy="ddp",
devices=DEVICES)`` (Lightning starts the other processes itself, as the program again):
with ``DevRNGCallback(2**40 + 7)``, the same with ``per_rank=True``, and with
``DevRNGCallback(321)``. DDP's setup reseeds every process from ``PL_GLOBAL_SEED``
(``reset_seed()``) before the callbacks' ``setup``; a callback after devrng's records, in
its own ``setup``, the fingerprint of the CPU, Python and NumPy generators there, and the
losses of two steps follow. Each process writes ``OUT/<DEVICES>-<rank>.json``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

import devrng
from devrng.integrations.lightning import DevRNGCallback

FITS = {"large": {"seed": 2**40 + 7}, "large_per_rank": {"seed": 2**40 + 7, "per_rank": True},
        "small": {"seed": 321}}


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.Dropout(0.5),
                                         torch.nn.Linear(4, 1))
        self.losses: list[str] = []

    def training_step(self, batch: torch.Tensor, _index: int) -> torch.Tensor:
        loss = self.layer(batch).pow(2).mean()
        self.losses.append(float(loss).hex())
        return loss

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        data = torch.randn(16, 2, generator=torch.Generator().manual_seed(0))
        return torch.utils.data.DataLoader(data, batch_size=4)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Record(pl.Callback):
    """What the generators hold when the callbacks are set up (after devrng's)."""

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.fingerprint = devrng.get_rng_state(devices=[]).fingerprint()
        self.exported = os.environ["PL_GLOBAL_SEED"]


def fit(devices: int, options: dict[str, Any]) -> dict[str, Any]:
    callback = DevRNGCallback(**options)
    record = Record()
    model = Tiny()
    trainer = pl.Trainer(strategy="ddp", devices=devices, accelerator="cpu", max_steps=2,
                         callbacks=[callback, record], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model)
    return {"rank": trainer.global_rank, "fingerprint": record.fingerprint,
            "exported": record.exported, "losses": model.losses}


def main(out: Path, devices: int) -> None:
    results = {name: fit(devices, options) for name, options in FITS.items()}
    rank = results["large"]["rank"]
    (out / f"{devices}-{rank}.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
