"""The accelerate programs of the resume matrix (jobs: see ``tests/integrations/_runs.py``).

    python -m tests.integrations._accelerate_run OUT JOBS_JSON

The loop the accelerate page documents: ``register`` before the model, a DataLoader with
``rng.dataloader_kwargs()`` tracked by the TrainingRNG, the epoch and step counters
registered for checkpointing, ``skip_first_batches`` to resume inside an epoch. 48
samples whose augmentation draws inside ``devrng.sample_rng``, batch 4, 2 workers, dropout,
label noise; 2 epochs of 12 steps. The uninterrupted run saves after each epoch's loop
(``epoch1``) and inside the loop after step 6 (``step6``; ``save_at`` names other steps).

Some configurations add: ``seedable`` -- ``DataLoaderConfiguration(use_seedable_sampler=
True)``; ``accumulate`` -- ``gradient_accumulation_steps`` with ``accelerator.accumulate``;
``epochs`` -- more epochs; ``alone`` -- accelerate's own seeding (``set_seed``), no devrng
at all; ``ranks`` -- a job of that many processes (the program started by
``torch.distributed.run``; rank r > 0 writes ``*.rank{r}.json``), with ``dispatch``,
``split`` or ``even=False`` (``DataLoaderConfiguration``'s ``dispatch_batches``,
``split_batches``, ``even_batches``) and another ``batch``; ``loopnoise`` -- the loop
adds noise to the inputs from a generator kept on the model. Every run records each epoch's
order of sample indices (the result's ``samples``). A resume with ``chain`` resumes twice: a first resumed run (a process of
its own) saves after each epoch's loop too, and the second resumes from its state
``chain`` (see ``tests/integrations/_runs.py``).
"""

from __future__ import annotations

import os
import socket
import sys
import time
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
    "seedable": {"register": True, "seedable": True},
    "seedable-alone": {"alone": True, "seedable": True},
    "accumulate": {"register": True, "accumulate": 2, "save_at": [5]},
    "epochs3": {"register": True, "epochs": 3},
    # issue 37, on 2 processes: batches dispatched from rank 0, split, or uneven (48 samples
    # in batches of 5: the last batch of an epoch is short on one rank)
    "dispatch": {"register": True, "ranks": 2, "dispatch": True},
    "split": {"register": True, "ranks": 2, "split": True},
    "uneven": {"register": True, "ranks": 2, "even": False, "batch": 5},
    # issue 44: the loop adds noise to the inputs from a generator kept on the model, which
    # nothing saves (the resumed run draws it from its seed again)
    "loopnoise": {"register": True, "loopnoise": True},
}


class Progress:
    """The epoch and step counters, saved with ``accelerator.save_state``."""

    def __init__(self) -> None:
        self.epoch = self.step = 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.step = state["epoch"], state["step"]


def own_process_group(folder: Path) -> None:
    """Have this job's processes meet on a port of their own (rank 0 picks a free one and
    leaves it in ``folder``), not on the launcher's store, which every job of the program
    would share."""
    path = folder / "port"
    if int(os.environ["RANK"]) == 0:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        folder.mkdir(parents=True, exist_ok=True)
        path.with_suffix(".tmp").write_text(str(port))
        path.with_suffix(".tmp").replace(path)
    else:
        deadline = time.monotonic() + 300
        while not path.exists():
            assert time.monotonic() < deadline, f"rank 0 left no port in {folder}"
            time.sleep(0.05)
        port = int(path.read_text())
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                       "TORCHELASTIC_USE_AGENT_STORE": "False"})


def train(config: dict[str, Any], out: Path, resume: Path | None = None) -> Result:
    if config.get("ranks"):
        own_process_group(out)
    with devrng_messages() as (found, logged, flight):
        accelerator = accelerate.Accelerator(
            cpu=True, gradient_accumulation_steps=config.get("accumulate", 1),
            dataloader_config=DataLoaderConfiguration(
                use_stateful_dataloader=bool(config.get("stateful")),
                use_seedable_sampler=bool(config.get("seedable")),
                dispatch_batches=config.get("dispatch"),
                split_batches=bool(config.get("split")),
                even_batches=config.get("even", True)))
        kwargs: dict[str, Any] = {}
        if config.get("alone"):
            accelerate.utils.set_seed(SEED)
        else:
            # register seeds now, before the model; without it, accelerate does not save the rng
            rng = register(accelerator, seed=SEED) if config["register"] \
                else devrng.TrainingRNG(SEED)
            kwargs = rng.dataloader_kwargs()
        model = small_model(seeded=False)
        model.noise = torch.Generator().manual_seed(7)  # type: ignore[assignment]
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        workers = config.get("workers", 2)
        loader = torch.utils.data.DataLoader(
            Augmented(size=48, per_sample=True, indexed=True), batch_size=config.get("batch", 4),
            shuffle=True, num_workers=workers, persistent_workers=bool(config.get("persistent")),
            **kwargs)
        model, opt, loader = accelerator.prepare(model, opt, loader)
        if not config.get("alone"):
            rng.track("loader", loader)
        progress = Progress()
        accelerator.register_for_checkpointing(progress)
        if resume is not None:
            accelerator.load_state(str(resume))
        losses, order = [], []
        saves = resume is None or config.get("saves")
        while progress.epoch < config.get("epochs", EPOCHS):
            done = progress.step - progress.epoch * len(loader)  # batches of this epoch done
            batches = accelerator.skip_first_batches(loader, done) if done else loader
            order.append([])
            for batch in batches:
                index, x = batch[:, 0], batch[:, 1:]
                order[-1] += index.long().tolist()
                if config.get("loopnoise"):
                    noise = accelerator.unwrap_model(model).noise
                    x = x + torch.randn(x.shape, generator=noise) * 0.01
                with accelerator.accumulate(model):
                    y = x.sum(dim=1, keepdim=True) * 0.5 + torch.randn(len(x), 1) * 0.01
                    loss = torch.nn.functional.mse_loss(model(x), y)
                    accelerator.backward(loss)
                    opt.step()
                    opt.zero_grad()
                losses.append(float(loss).hex())
                progress.step += 1
                if progress.step in config.get("save_at", [6]) and resume is None:
                    accelerator.save_state(str(out / "ck" / f"step{progress.step}"))
            progress.epoch += 1
            if saves:
                accelerator.save_state(str(out / "ck" / f"epoch{progress.epoch}"))
        if config.get("ranks"):
            accelerator.wait_for_everyone()
    result = Result(losses, [], digest(model), progress.step)
    result.warnings, result.logged, result.flight = found, logged, flight
    result.samples = [",".join(map(str, epoch)) for epoch in order]
    return result


if __name__ == "__main__":
    main(sys.argv[1:], job_runner(train, CONFIGS))
