"""The HF Trainer programs of the resume matrix (jobs: see ``tests/integrations/_runs.py``).

    python -m tests.integrations._transformers_run OUT JOBS_JSON

A ``Trainer`` on a small module (dropout 0.3, label noise in ``forward``), 48 samples
whose augmentation draws from torch, NumPy and Python (inside ``devrng.sample_rng`` where
the configuration says so), batch 4, 2 workers, 2 epochs of 12 steps, plain SGD with a
constant learning rate. The uninterrupted run saves every 6 steps (``save_steps``):
``checkpoint-6`` and ``checkpoint-18`` inside epochs 0 and 1, ``checkpoint-12`` at the end
of epoch 0. Some configurations save every 5 steps, or set ``ignore_data_skip=True``;
``fix_off`` turns devrng's fixes off (``tests/_internals.py``'s ``FIXES``); a resume may set
another ``data_seed`` or number of ``workers``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from tests._datasets import Augmented, small_model
from tests._internals import set_fix
from tests.integrations._runs import SEED, Result, devrng_messages, digest, job_runner, main
from transformers import Trainer, TrainingArguments, set_seed

from devrng.integrations.transformers import DevRNGTrainerCallback

EPOCHS = 2
# devrng: DevRNGTrainerCallback (with sample_rng=True when the samples draw inside it);
# without it, the Trainer's own seeding and rng_state.pth.
CONFIGS: dict[str, dict[str, Any]] = {
    "devrng": {"devrng": True, "sample_rng": True},
    "plain": {"devrng": False, "sample_rng": True},
    "workers0": {"devrng": True, "sample_rng": True, "workers": 0},
    "nosample": {"devrng": True, "sample_rng": False},
    "persistent": {"devrng": True, "sample_rng": True, "persistent": True},
    # save_steps=5: checkpoints at odd places in both epochs; ignore_data_skip=True
    "save5": {"devrng": True, "sample_rng": True, "save_steps": 5},
    "save5-plain": {"devrng": False, "sample_rng": True, "save_steps": 5},
    "skipless": {"devrng": True, "sample_rng": True, "ignore_data_skip": True},
}


class Rows(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self, per_sample: bool) -> None:
        self.data = Augmented(size=48, per_sample=per_sample)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x = self.data[i]
        return {"x": x, "labels": x.sum(dim=0, keepdim=True) * 0.5}


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = small_model(seeded=False)
        self.losses: list[str] = []

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        loss = torch.nn.functional.mse_loss(self.net(x), labels + torch.randn(len(x), 1) * 0.01)
        self.losses.append(float(loss).hex())
        return {"loss": loss}


def train(config: dict[str, Any], out: Path, resume: Path | None = None) -> Result:
    for name in config.get("fix_off", []):  # devrng's fixes turned off (tests/_internals.py)
        set_fix(name, False)
    with devrng_messages() as (found, logged, flight):
        callbacks: list[Any] = []
        if config["devrng"]:
            callbacks.append(DevRNGTrainerCallback(sample_rng=config["sample_rng"]))
        set_seed(SEED)  # before the model: the Trainer seeds again only when training starts
        model = Model()
        workers = config.get("workers", 2)
        args = TrainingArguments(
            output_dir=str(out / "ck"), per_device_train_batch_size=config.get("batch", 4),
            num_train_epochs=EPOCHS, save_strategy="steps", save_steps=config.get("save_steps", 6),
            ignore_data_skip=bool(config.get("ignore_data_skip")), seed=SEED,
            data_seed=config.get("data_seed"),
            use_cpu=True, report_to=[], disable_tqdm=True, logging_strategy="no",
            dataloader_num_workers=workers,
            dataloader_persistent_workers=bool(config.get("persistent")) and workers > 0,
            remove_unused_columns=False, optim="sgd", learning_rate=0.05,
            lr_scheduler_type="constant", max_grad_norm=0.0)
        trainer = Trainer(model=model, args=args, train_dataset=Rows(config["sample_rng"]),
                          callbacks=callbacks)
        trainer.train(resume_from_checkpoint=None if resume is None else str(resume))
    result = Result(model.losses, [], digest(model), trainer.state.global_step)
    result.warnings, result.logged, result.flight = found, logged, flight
    return result


if __name__ == "__main__":
    main(sys.argv[1:], job_runner(train, CONFIGS))
