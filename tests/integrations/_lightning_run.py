"""A small Lightning run that records its per-step losses (float.hex) for the resume tests.

    python -m tests.integrations._lightning_run MODE EPOCHS OUT.json [--save CKPT] [--resume CKPT]

MODE: ``plain`` (``seed_everything(1234, workers=True)``, Lightning's own way),
``devrng`` (``DevRNGCallback(1234)``) or ``devrng-without-state`` (the callback
with its checkpoint state left out, to show the test would see it); with
``-stateful`` appended, the loader is torchdata's ``StatefulDataLoader`` and the
dataset draws inside ``devrng.sample_rng``. ``--max-steps N`` stops (and saves)
after N steps, in the middle of an epoch.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import lightning.pytorch as pl
import torch
from tests._datasets import Augmented, small_model

from devrng.integrations.lightning import DevRNGCallback

SEED = 1234


class Net(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = small_model()
        self.losses: list[str] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch, batch.sum(dim=1, keepdim=True) * 0.5
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.losses.append(float(loss).hex())
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.05)

    stateful = False

    def train_dataloader(self) -> Any:
        if self.stateful:
            from torchdata.stateful_dataloader import StatefulDataLoader

            return StatefulDataLoader(Augmented(size=32, per_sample=True), batch_size=4,
                                      shuffle=True, num_workers=2)
        return torch.utils.data.DataLoader(Augmented(size=32), batch_size=4, shuffle=True,
                                           num_workers=2)


class WithoutState(DevRNGCallback):
    def state_dict(self) -> dict[str, Any]:
        return {}


def main(argv: list[str]) -> None:
    mode, epochs, out = argv[0], int(argv[1]), argv[2]
    save = argv[argv.index("--save") + 1] if "--save" in argv else None
    resume = argv[argv.index("--resume") + 1] if "--resume" in argv else None
    max_steps = int(argv[argv.index("--max-steps") + 1]) if "--max-steps" in argv else -1
    stateful = mode.endswith("-stateful")
    mode = mode.removesuffix("-stateful")
    callbacks: list[Any] = []
    if mode == "plain":
        pl.seed_everything(SEED, workers=True, verbose=False)
    else:
        callbacks.append((WithoutState if mode == "devrng-without-state" else DevRNGCallback)(SEED))
    model = Net()
    model.stateful = stateful
    if save and max_steps > 0:  # a checkpoint in the middle of an epoch, as Lightning writes one
        import os

        callbacks.append(pl.callbacks.ModelCheckpoint(
            dirpath=os.path.dirname(save), filename=os.path.basename(save).removesuffix(".ckpt"),
            every_n_train_steps=max_steps, save_top_k=-1, enable_version_counter=False))
        save = None
    trainer = pl.Trainer(max_epochs=epochs, max_steps=max_steps, accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=max_steps > 0, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0,
                         callbacks=callbacks)
    trainer.fit(model, ckpt_path=resume)
    if save:
        trainer.save_checkpoint(save)
    with open(out, "w") as fh:
        json.dump(model.losses, fh)


if __name__ == "__main__":
    main(sys.argv[1:])
