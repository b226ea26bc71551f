"""The plain-loop programs of the resume tests for changes between runs (jobs: see
``tests/integrations/_runs.py``).

    python -m tests._loop_run OUT JOBS_JSON

The loop docs/resume.md shows: ``TrainingRNG(seed)``, a DataLoader built with
``rng.dataloader_kwargs()`` and tracked (unless the configuration says otherwise), a
``seeded_jit`` step tracked, label noise drawn in the main process. 26 samples whose
augmentation draws inside ``devrng.sample_rng``, batch 4 (so the last batch of an epoch
has 2 samples: ``drop_last`` matters), 2 workers, dropout; 3 epochs of 7 steps. The
uninterrupted run saves after each epoch's loop (``epoch1.pt``, ``epoch2.pt``), as the
docs advise. A result's ``samples`` holds, per epoch, a digest of every sample's
augmentation by index: equal digests are epochs that augmented alike.
"""

from __future__ import annotations

import hashlib
import random
import sys
from pathlib import Path
from typing import Any

import torch
from tests._datasets import Augmented
from tests._resume import model_and_optimizer, sgd_step
from tests.integrations._runs import SEED, Result, devrng_messages, digest, job_runner, main

import devrng

EPOCHS = 3
# devrng: TrainingRNG (else the seeding people write: manual_seed and a seeded loader
# generator); track: rng.track("loader", loader); persistent: persistent_workers=True.
# A resume changes size, shuffle or drop_last.
CONFIGS: dict[str, dict[str, Any]] = {
    "loader": {},
    "weighted": {"weighted": True},  # WeightedRandomSampler with replacement
    "persistent": {"persistent": True},
    "persistent-untracked": {"persistent": True, "track": False},
    "persistent-alone": {"persistent": True, "devrng": False},
}


def train(config: dict[str, Any], out: Path, resume: Path | None = None) -> Result:
    with devrng_messages() as (found, logged, flight):
        model, opt = model_and_optimizer()
        rng = None
        if config.get("devrng", True):
            rng = devrng.TrainingRNG(SEED)
            kwargs = rng.dataloader_kwargs()
        else:
            torch.manual_seed(SEED)
            kwargs = {"generator": torch.Generator().manual_seed(SEED)}
        persistent = bool(config.get("persistent"))
        size = config.get("size", 26)
        if config.get("weighted"):  # it draws from torch's global generator, which devrng keeps
            kwargs["sampler"] = torch.utils.data.WeightedRandomSampler(
                torch.linspace(1, 2, size), num_samples=size, replacement=True)
        else:
            kwargs["shuffle"] = config.get("shuffle", True)
        loader = torch.utils.data.DataLoader(
            Augmented(size=size, per_sample=True, indexed=True), batch_size=4,
            drop_last=config.get("drop_last", False), num_workers=2,
            persistent_workers=persistent, **kwargs)
        step: Any = sgd_step(model, opt)
        if rng is not None:
            step = rng.track("step", devrng.seeded_jit(step, backend="eager"))
            if config.get("track", True):
                rng.track("loader", loader)
        epoch = steps = 0
        if resume is not None:
            ckpt = torch.load(resume, weights_only=True)
            model.load_state_dict(ckpt["model"])
            opt.load_state_dict(ckpt["optimizer"])
            epoch, steps = ckpt["epoch"], ckpt["step"]
            assert rng is not None, "the resumes here are devrng's"
            rng.load_state_dict(ckpt["rng"])
        losses, samples = [], []
        while epoch < EPOCHS:
            augmented: dict[int, list[float]] = {}
            for batch in loader:
                index, x = batch[:, 0], batch[:, 1:]
                y = x.sum(dim=1, keepdim=True) * 0.5 + torch.randn(len(x), 1) * 0.01 \
                    + random.gauss(0, 0.01)
                losses.append(float(step(x, y)).hex())
                augmented.update(zip(index.long().tolist(), x.tolist(), strict=True))
                steps += 1
            samples.append(hashlib.sha256(repr(sorted(augmented.items())).encode()).hexdigest())
            epoch += 1
            if resume is None and rng is not None:  # after the epoch's loop
                (out / "ck").mkdir(parents=True, exist_ok=True)
                torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                            "epoch": epoch, "step": steps, "rng": rng.state_dict()},
                           out / "ck" / f"epoch{epoch}.pt")
    result = Result(losses, [], digest(model), steps)
    result.warnings, result.logged, result.samples = found, logged, samples
    result.flight = flight
    return result


if __name__ == "__main__":
    main(sys.argv[1:], job_runner(train, CONFIGS))
