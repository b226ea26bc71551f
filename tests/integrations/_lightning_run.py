"""The Lightning programs of the resume matrix (jobs: see ``tests/integrations/_runs.py``).

    python -m tests.integrations._lightning_run OUT JOBS_JSON

A LightningModule with dropout 0.3 and label noise drawn in the step; 48 samples whose
augmentation draws from torch, NumPy and Python (inside ``devrng.sample_rng`` where the
configuration says so), batch 4, 2 workers, 2 epochs of 12 steps. The uninterrupted run
checkpoints with ``ModelCheckpoint(every_n_train_steps=6)`` (``step=6`` is the middle of
epoch 0, ``step=12`` its last batch) and at every epoch's end (``epoch=0``).

Some configurations add: ``save_at`` -- ``trainer.save_checkpoint`` at the end of those
batches of epoch 0 (``batch5.ckpt``: after its fifth batch); ``signal`` -- the run is a
task of a SLURM job with Lightning's auto-requeue on (``SLURMEnvironment``; ``scontrol`` a
stand-in that records the requeue), and the uninterrupted run gets a real SIGUSR1, as SLURM
sends before a time limit, inside the training step of batch 4 and at the end of batch 8
(Lightning's handler writes ``hpc_ckpt_1.ckpt`` and ``hpc_ckpt_2.ckpt``); a resume with
``requeued`` picks the newest as a requeued job does (``fit()`` without ``ckpt_path``);
``ddp`` -- ``strategy="ddp"`` on 2 CPU processes (Lightning starts the second; its result
goes to ``*.rank1.json``); ``indexed`` -- each epoch's order of sample indices in the
result's ``samples``; ``iterable`` -- ``tests/_datasets.py``'s ``SizedShards``;
``sampler="subset"`` -- a ``SubsetRandomSampler`` drawing from torch's
generator (torchdata replays it); ``val="random"`` -- a validation loader that shuffles
and augments from the generators devrng does not give it (no generator, 1 worker), run in
the sanity check too (``sanity``); ``reload``, ``precision`` -- the Trainer's
``reload_dataloaders_every_n_epochs`` and ``precision``; ``fix_off`` -- devrng's fixes
turned off (``tests/_internals.py``'s ``FIXES``). A resume that fails records its error.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.plugins.environments import SLURMEnvironment
from tests._datasets import Augmented, SizedShards, small_model
from tests._internals import set_fix
from tests.integrations._runs import SEED, Result, devrng_messages, digest, main, target
from torchdata.stateful_dataloader import StatefulDataLoader

from devrng.integrations.lightning import DevRNGCallback

EPOCHS = 2
# name -> configuration. devrng: DevRNGCallback (else seed_everything, as Lightning users
# seed); kwargs: the loaders take callback.rng.dataloader_kwargs(), made before fit.
CONFIGS: dict[str, dict[str, Any]] = {
    "stateful": {"devrng": True, "loader": "stateful", "val": "stateful", "kwargs": True,
                 "sample_rng": True, "signal": {"step": 4, "end": 8}},
    "stateful-plain": {"devrng": False, "loader": "stateful", "val": "stateful",
                       "sample_rng": True, "signal": {"step": 4, "end": 8}},
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
    # a checkpoint inside an accumulation window (after batch 5) and where one ends (6)
    "stateful-accumulate": {"devrng": True, "loader": "stateful", "kwargs": True,
                            "sample_rng": True, "accumulate": 2, "save_at": [5, 6]},
    "stateful-accumulate-plain": {"devrng": False, "loader": "stateful", "sample_rng": True,
                                  "accumulate": 2, "save_at": [6]},
    # DDP on 2 processes, a DataLoader with 1 worker (Lightning's DistributedSampler)
    "ddp": {"devrng": True, "loader": "plain", "ddp": True, "workers": 1, "indexed": True},
    "ddp-plain": {"devrng": False, "loader": "plain", "ddp": True, "workers": 1,
                  "indexed": True},
    # issue 37: augmentation outside sample_rng; a sampler torchdata replays; a random
    # validation loader in the sanity check, loaders reloaded each epoch, bf16-mixed
    "stateful-outside": {"devrng": True, "loader": "stateful", "kwargs": True},
    "stateful-subset": {"devrng": True, "loader": "stateful", "kwargs": True,
                        "sample_rng": True, "sampler": "subset", "reload": 1},
    # issue 44: a sharded IterableDataset whose workers shuffle with torch.randperm and
    # augment from their own generators (torchdata fast-forwards them when it resumes)
    "stateful-iterable": {"devrng": True, "loader": "stateful", "kwargs": True,
                          "iterable": True, "indexed": True},
    "extras": {"devrng": True, "loader": "stateful", "val": "random", "kwargs": True,
               "sample_rng": True, "sanity": 2, "reload": 1, "precision": "bf16-mixed"},
}


class Net(pl.LightningModule):
    def __init__(self, config: dict[str, Any], kwargs: dict[str, Any],
                 val_kwargs: dict[str, Any]) -> None:
        super().__init__()
        self.config, self.kwargs, self.val_kwargs = config, kwargs, val_kwargs
        self.net = small_model(seeded=False)  # initialised from the run's seed
        self.losses: list[str] = []
        self.val_losses: list[str] = []
        self.order: dict[int, list[int]] = {}  # epoch -> sample indices, with "indexed"
        self.signal_step: int | None = None  # the batch of epoch 0 whose step gets SIGUSR1

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        if self.config.get("indexed"):
            self.order.setdefault(self.current_epoch, []).extend(batch[:, 0].long().tolist())
            batch = batch[:, 1:]
        y = batch.sum(dim=1, keepdim=True) * 0.5 + torch.randn(len(batch), 1) * 0.01
        loss = torch.nn.functional.mse_loss(self.net(batch).float(), y)
        if self.current_epoch == 0 and batch_idx + 1 == self.signal_step:
            os.kill(os.getpid(), signal.SIGUSR1)  # in the middle of the step: loss, no backward
        self.losses.append(float(loss).hex())
        return loss

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        loss = torch.nn.functional.mse_loss(self.net(batch).float(),
                                            batch.sum(dim=1, keepdim=True))
        if not self.trainer.sanity_checking:
            self.val_losses.append(float(loss).hex())

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def loader(self, kind: str, size: int, kwargs: dict[str, Any]) -> Any:
        workers = self.config.get("workers", 2)
        options = {"batch_size": self.config.get("batch", 4), "shuffle": True,
                   "num_workers": workers,
                   "persistent_workers": bool(self.config.get("persistent")) and workers > 0,
                   **kwargs}
        if kind == "random":  # shuffled and augmented by generators devrng does not give it
            return torch.utils.data.DataLoader(Augmented(size=size), batch_size=4,
                                               shuffle=True, num_workers=1)
        data: Any = Augmented(size=size, per_sample=bool(self.config.get("sample_rng")),
                              indexed=bool(self.config.get("indexed")))
        if self.config.get("iterable") and size == 48:  # the training loader's
            del options["shuffle"]
            data = SizedShards(size)
        if self.config.get("sampler") == "subset" and size == 48:  # the training loader's
            del options["shuffle"]
            options["sampler"] = torch.utils.data.SubsetRandomSampler(range(40))
        if kind == "stateful":
            return StatefulDataLoader(data, **options)
        return torch.utils.data.DataLoader(data, **options)

    def train_dataloader(self) -> Any:
        return self.loader(self.config["loader"], 48, self.kwargs)

    def val_dataloader(self) -> Any:
        return self.loader(self.config["val"], 16, self.val_kwargs) if "val" in self.config \
            else []


class SaveAt(pl.Callback):
    """Saves at the end of the given batches of epoch 0, as a user's own callback would; sends
    SIGUSR1 at the end of ``signal``'s batch."""

    def __init__(self, out: Path, batches: list[int], signal_at: int | None) -> None:
        self.out, self.batches, self.signal_at = out, batches, signal_at

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.current_epoch == 0 and batch_idx + 1 in self.batches:
            trainer.save_checkpoint(self.out / f"batch{batch_idx + 1}.ckpt")
        if trainer.current_epoch == 0 and batch_idx + 1 == self.signal_at:
            os.kill(os.getpid(), signal.SIGUSR1)


def slurm_job(out: Path) -> None:
    """This process as a task of SLURM job 4242 (one task), with a stand-in for ``scontrol``
    that records the requeue Lightning asks for in ``OUT/requeued``."""
    bin_dir = out / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f'#!/bin/sh\necho "$@" >> {out / "requeued"}\n')
    scontrol.chmod(0o755)
    os.environ.update({"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "train", "SLURM_NTASKS": "1",
                       "SLURM_NTASKS_PER_NODE": "1", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
                       "SLURM_NODEID": "0", "SLURM_NNODES": "1",
                       "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})


def fit(config: dict[str, Any], out: Path, *, resume: Path | None = None,
        checkpoints: bool = True, epochs: int = EPOCHS) -> tuple[Result, pl.Trainer]:
    for name in config.get("fix_off", []):
        set_fix(name, False)
    callbacks: list[Any] = []
    ckpt_path: Path | str | None = resume
    root = out / "ck"
    if "signal" in config and checkpoints:  # (a "first" part would resume from A's hpc_ckpt)
        slurm_job(out)
        if resume is not None and config.get("requeued"):
            # the requeued job: fit() finds the newest hpc_ckpt_N.ckpt in its root itself
            root, ckpt_path = resume.parent, None
    whole = resume is None and checkpoints  # the uninterrupted run (not a "first" part)
    if whole and (config.get("save_at") or "signal" in config):
        callbacks.append(SaveAt(out / "ck", config.get("save_at", []),
                                config.get("signal", {}).get("end")))
    kwargs: dict[str, Any] = {}
    val_kwargs: dict[str, Any] = {}
    with devrng_messages() as (found, logged, flight):
        if config["devrng"]:
            callback = DevRNGCallback(SEED)  # seeds now: the model below is built after it
            callbacks.append(callback)
            if config.get("kwargs"):
                kwargs = callback.rng.dataloader_kwargs()
                val_kwargs = callback.rng.dataloader_kwargs()
        else:
            pl.seed_everything(SEED, workers=True, verbose=False)
        model = Net(config, kwargs, val_kwargs)
        if whole:
            model.signal_step = config.get("signal", {}).get("step")
        if checkpoints:
            callbacks += [
                pl.callbacks.ModelCheckpoint(dirpath=out / "ck", filename="{step}",
                                             every_n_train_steps=6, save_top_k=-1),
                pl.callbacks.ModelCheckpoint(dirpath=out / "ck", filename="{epoch}",
                                             save_top_k=-1)]
        ddp = {"devices": 2, "strategy": "ddp"} if config.get("ddp") else {"devices": 1}
        plugins = [SLURMEnvironment(auto_requeue=True)] if "signal" in config and checkpoints \
            else []
        trainer = pl.Trainer(max_epochs=epochs, accelerator="cpu", logger=False,
                             enable_checkpointing=checkpoints, enable_progress_bar=False,
                             enable_model_summary=False,
                             num_sanity_val_steps=config.get("sanity", 0),
                             limit_val_batches=1.0 if "val" in config else 0,
                             accumulate_grad_batches=config.get("accumulate", 1),
                             reload_dataloaders_every_n_epochs=config.get("reload", 0),
                             precision=config.get("precision", "32-true"),
                             callbacks=callbacks, default_root_dir=root, plugins=plugins,
                             **ddp)
        error = ""
        try:
            trainer.fit(model, ckpt_path=ckpt_path)
        except Exception as err:  # a resume that fails: what the user reads last
            if resume is None:
                raise
            error = f"{type(err).__name__}: {err}"
        for process in getattr(trainer.strategy.launcher, "procs", []):  # DDP: rank 1's result
            process.wait()
    result = Result(model.losses, model.val_losses, digest(model), trainer.global_step,
                    error=error)
    result.warnings, result.logged, result.flight = found, logged, flight
    result.samples = [",".join(map(str, model.order[e])) for e in sorted(model.order)]
    return result, trainer


def run_job(out: Path, job: dict[str, Any]) -> None:
    name = job["name"]
    # Lightning's DDP starts rank 1 as this program with this process's arguments: this job
    sys.argv[1:] = [str(out), json.dumps([job])]
    if job["mode"] == "A":
        result, trainer = fit(CONFIGS[name], out / name)
    elif job["mode"] == "B":
        config = {**CONFIGS[name], **job.get("changes", {})}
        result, trainer = fit(config, out / name / job["tag"], resume=Path(job["checkpoint"]))
    else:  # "first": one epoch, then Trainer.save_checkpoint, as the Lightning docs did it
        result, trainer = fit(CONFIGS[name], out / name, checkpoints=False, epochs=1)
        trainer.save_checkpoint(out / name / "first.ckpt")
    path = target(out, job)
    if trainer.global_rank:
        path = path.with_name(f"{path.stem}.rank{trainer.global_rank}.json")
    result.write(path)


if __name__ == "__main__":
    main(sys.argv[1:], run_job)
