"""The accelerate programs of the resume matrix (jobs: see ``tests/integrations/_runs.py``).

    python -m tests.integrations._accelerate_run OUT JOBS_JSON

The loop the accelerate page documents: ``register`` before the model, a DataLoader with
``rng.dataloader_kwargs()`` tracked by the TrainingRNG, the epoch and step counters
registered for checkpointing, ``skip_first_batches`` to resume inside an epoch. 48
samples whose augmentation draws inside ``devrng.sample_rng``, batch 4, 2 workers, dropout,
label noise; 2 epochs of 12 steps. The uninterrupted run saves after each epoch's loop
(``epoch1``) and inside the loop after step 6 (``step6``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import accelerate
import torch
from accelerate.utils import DataLoaderConfiguration
from tests._datasets import Augmented, small_model
from tests.integrations._runs import SEED, Result, devrng_messages, digest, job_runner, main

import devrng
from devrng.integrations.accelerate import register

EPOCHS = 2
# register: devrng.integrations.accelerate.register (else a TrainingRNG accelerate does
# not save, to show what register adds); stateful: use_stateful_dataloader=True.
CONFIGS: dict[str, dict[str, Any]] = {
    "devrng": {"register": True},
    "unregistered": {"register": False},
    "stateful": {"register": True, "stateful": True},
    "persistent": {"register": True, "persistent": True},
}


class Progress:
    """The epoch and step counters, saved with ``accelerator.save_state``."""

    def __init__(self) -> None:
        self.epoch = self.step = 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.step = state["epoch"], state["step"]


def train(config: dict[str, Any], out: Path, resume: Path | None = None) -> Result:
    with devrng_messages() as (found, logged):
        accelerator = accelerate.Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(
            use_stateful_dataloader=bool(config.get("stateful"))))
        # register seeds now, before the model; without it, accelerate does not save the rng
        rng = register(accelerator, seed=SEED) if config["register"] else devrng.TrainingRNG(SEED)
        model = small_model(seeded=False)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        workers = config.get("workers", 2)
        loader = torch.utils.data.DataLoader(
            Augmented(size=48, per_sample=True), batch_size=config.get("batch", 4), shuffle=True,
            num_workers=workers, persistent_workers=bool(config.get("persistent")),
            **rng.dataloader_kwargs())
        model, opt, loader = accelerator.prepare(model, opt, loader)
        rng.track("loader", loader)
        progress = Progress()
        accelerator.register_for_checkpointing(progress)
        if resume is not None:
            accelerator.load_state(str(resume))
        losses = []
        while progress.epoch < EPOCHS:
            done = progress.step - progress.epoch * len(loader)  # batches of this epoch done
            batches = accelerator.skip_first_batches(loader, done) if done else loader
            for x in batches:
                opt.zero_grad()
                y = x.sum(dim=1, keepdim=True) * 0.5 + torch.randn(len(x), 1) * 0.01
                loss = torch.nn.functional.mse_loss(model(x), y)
                accelerator.backward(loss)
                opt.step()
                losses.append(float(loss).hex())
                progress.step += 1
                if progress.step == 6 and resume is None:
                    accelerator.save_state(str(out / "ck" / "step6"))
            progress.epoch += 1
            if resume is None:
                accelerator.save_state(str(out / "ck" / f"epoch{progress.epoch}"))
    result = Result(losses, [], digest(model), progress.step)
    result.warnings, result.logged = found, logged
    return result


if __name__ == "__main__":
    main(sys.argv[1:], job_runner(train, CONFIGS))
