"""The Lightning programs of the resume matrix (jobs: see ``tests/integrations/_runs.py``).

    python -m tests.integrations._lightning_run OUT JOBS_JSON

A LightningModule with dropout 0.3 and label noise drawn in the step; 48 samples whose
augmentation draws from torch, NumPy and Python (inside ``devrng.sample_rng`` where the
configuration says so), batch 4, 2 workers, 2 epochs of 12 steps. The uninterrupted run
checkpoints with ``ModelCheckpoint(every_n_train_steps=6)`` (``step=6`` is the middle of
epoch 0, ``step=12`` its last batch) and at every epoch's end (``epoch=0``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from tests._datasets import Augmented, small_model
from tests.integrations._runs import SEED, Result, devrng_messages, digest, main, target
from torchdata.stateful_dataloader import StatefulDataLoader

from devrng.integrations.lightning import DevRNGCallback

EPOCHS = 2
# name -> configuration. devrng: DevRNGCallback (else seed_everything, as Lightning users
# seed); kwargs: the loaders take callback.rng.dataloader_kwargs(), made before fit.
CONFIGS: dict[str, dict[str, Any]] = {
    "stateful": {"devrng": True, "loader": "stateful", "val": "stateful", "kwargs": True,
                 "sample_rng": True},
    "stateful-plain": {"devrng": False, "loader": "stateful", "val": "stateful",
                       "sample_rng": True},
    "stateful-nokwargs": {"devrng": True, "loader": "stateful", "val": "stateful",
                          "sample_rng": True},
    "dataloader": {"devrng": True, "loader": "plain", "val": "plain"},
    "dataloader-plain": {"devrng": False, "loader": "plain", "val": "plain"},
    "persistent": {"devrng": True, "loader": "plain", "persistent": True, "kwargs": True,
                   "sample_rng": True},
    "persistent-plain": {"devrng": False, "loader": "plain", "persistent": True,
                         "sample_rng": True},
    "persistent-nosample": {"devrng": True, "loader": "plain", "persistent": True,
                            "kwargs": True},
    "persistent-stateful": {"devrng": True, "loader": "stateful", "persistent": True,
                            "kwargs": True, "sample_rng": True},
    "accumulate": {"devrng": True, "loader": "plain", "workers": 0, "accumulate": 2},
    "accumulate-plain": {"devrng": False, "loader": "plain", "workers": 0, "accumulate": 2},
}


class Net(pl.LightningModule):
    def __init__(self, config: dict[str, Any], kwargs: dict[str, Any],
                 val_kwargs: dict[str, Any]) -> None:
        super().__init__()
        self.config, self.kwargs, self.val_kwargs = config, kwargs, val_kwargs
        self.net = small_model(seeded=False)  # initialised from the run's seed
        self.losses: list[str] = []
        self.val_losses: list[str] = []

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        y = batch.sum(dim=1, keepdim=True) * 0.5 + torch.randn(len(batch), 1) * 0.01
        loss = torch.nn.functional.mse_loss(self.net(batch), y)
        self.losses.append(float(loss).hex())
        return loss

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        loss = torch.nn.functional.mse_loss(self.net(batch), batch.sum(dim=1, keepdim=True))
        self.val_losses.append(float(loss).hex())

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def loader(self, kind: str, size: int, kwargs: dict[str, Any]) -> Any:
        workers = self.config.get("workers", 2)
        options = {"batch_size": self.config.get("batch", 4), "shuffle": True,
                   "num_workers": workers,
                   "persistent_workers": bool(self.config.get("persistent")) and workers > 0,
                   **kwargs}
        data = Augmented(size=size, per_sample=bool(self.config.get("sample_rng")))
        if kind == "stateful":
            return StatefulDataLoader(data, **options)
        return torch.utils.data.DataLoader(data, **options)

    def train_dataloader(self) -> Any:
        return self.loader(self.config["loader"], 48, self.kwargs)

    def val_dataloader(self) -> Any:
        return self.loader(self.config["val"], 16, self.val_kwargs) if "val" in self.config \
            else []


def fit(config: dict[str, Any], out: Path, *, resume: Path | None = None,
        checkpoints: bool = True, epochs: int = EPOCHS) -> tuple[Result, pl.Trainer]:
    callbacks: list[Any] = []
    kwargs: dict[str, Any] = {}
    val_kwargs: dict[str, Any] = {}
    with devrng_messages() as (found, logged):
        if config["devrng"]:
            callback = DevRNGCallback(SEED)  # seeds now: the model below is built after it
            callbacks.append(callback)
            if config.get("kwargs"):
                kwargs = callback.rng.dataloader_kwargs()
                val_kwargs = callback.rng.dataloader_kwargs()
        else:
            pl.seed_everything(SEED, workers=True, verbose=False)
        model = Net(config, kwargs, val_kwargs)
        if checkpoints:
            callbacks += [
                pl.callbacks.ModelCheckpoint(dirpath=out / "ck", filename="{step}",
                                             every_n_train_steps=6, save_top_k=-1),
                pl.callbacks.ModelCheckpoint(dirpath=out / "ck", filename="{epoch}",
                                             save_top_k=-1)]
        trainer = pl.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, logger=False,
                             enable_checkpointing=checkpoints, enable_progress_bar=False,
                             enable_model_summary=False, num_sanity_val_steps=0,
                             limit_val_batches=1.0 if "val" in config else 0,
                             accumulate_grad_batches=config.get("accumulate", 1),
                             callbacks=callbacks)
        trainer.fit(model, ckpt_path=resume)
    result = Result(model.losses, model.val_losses, digest(model), trainer.global_step)
    result.warnings, result.logged = found, logged
    return result, trainer


def run_job(out: Path, job: dict[str, Any]) -> None:
    name = job["name"]
    if job["mode"] == "A":
        result, _ = fit(CONFIGS[name], out / name)
    elif job["mode"] == "B":
        config = {**CONFIGS[name], **job.get("changes", {})}
        result, _ = fit(config, out / name / job["tag"], resume=Path(job["checkpoint"]))
    else:  # "first": one epoch, then Trainer.save_checkpoint, as the Lightning docs did it
        result, trainer = fit(CONFIGS[name], out / name, checkpoints=False, epochs=1)
        trainer.save_checkpoint(out / name / "first.ckpt")
    result.write(target(out, job))


if __name__ == "__main__":
    main(sys.argv[1:], run_job)
