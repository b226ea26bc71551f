"""The plain-loop programs of the resume tests for changes between runs and for the cases of
issue 37 (jobs: see ``tests/integrations/_runs.py``).

    python -m tests._loop_run OUT JOBS_JSON

The loop docs/resume.md shows: ``TrainingRNG(seed)``, a DataLoader built with
``rng.dataloader_kwargs()`` and tracked (unless the configuration says otherwise), a
``seeded_jit`` step tracked, label noise drawn in the main process. 26 samples whose
augmentation draws inside ``devrng.sample_rng``, batch 4 (so the last batch of an epoch
has 2 samples: ``drop_last`` matters), 2 workers, dropout; 3 epochs of 7 steps. The
uninterrupted run saves after each epoch's loop (``epoch1.pt``, ``epoch2.pt``), as the
docs advise, and, with ``save_at``, inside the loop after those steps (``step3.pt``: after
the third batch), as a run with torchdata's ``StatefulDataLoader`` (``stateful``) can.
A result's ``samples`` holds, per epoch, a digest of every sample's augmentation by index
(equal digests are epochs that augmented alike), and ``order`` the indices in the order the
loader yielded them.

Configurations may also set: ``augment`` -- "inside" (``sample_rng``, the default),
"outside" (the workers' own generators) or "none"; ``kwargs=False`` -- a loader built
without ``rng.dataloader_kwargs()``; ``sampler`` -- "subset" (``SubsetRandomSampler``),
"weighted" (``WeightedRandomSampler``), both drawing from torch's generator, or
"replacement" (``RandomSampler(replacement=True, num_samples=40)`` with the loader's
generator): samplers without a state of their own, which torchdata replays; ``collate`` --
a ``collate_fn`` drawing NumPy noise; ``workers``; ``pin`` -- ``pin_memory=True``;
``iterable`` -- ``tests/_datasets.py``'s ``ShardedShuffled`` (its workers shuffle their
shard with ``torch.randperm`` and augment outside ``sample_rng``); ``fix_off`` -- devrng's fixes turned
off in the run (``tests/_internals.py``'s ``FIXES``). A resume refused with a
``DevRNGError`` records its message (the result's ``error``).

Samplers of issue 44 (section 6): ``sampler`` -- "distributed" (a ``DistributedSampler``
of rank 0 of 2, whose epoch the loop sets with ``set_epoch`` before each epoch's loop),
"python" / "randperm" (a sampler of the user's that shuffles with Python's ``random`` /
torch's global ``randperm`` when ``iter`` is called), or "batches" (a ``batch_sampler`` of
the user's shuffling with a ``torch.Generator`` of its own, which the run tracks).
"""

from __future__ import annotations

import hashlib
import random
import sys
from pathlib import Path
from typing import Any

import torch
from tests._datasets import Augmented, ShardedShuffled, noisy_collate
from tests._internals import set_fix
from tests._resume import model_and_optimizer, sgd_step
from tests.integrations._runs import SEED, Result, devrng_messages, digest, job_runner, main

import devrng

EPOCHS = 3
# devrng: TrainingRNG (else the seeding people write: manual_seed and a seeded loader
# generator); track: rng.track("loader", loader); persistent: persistent_workers=True.
# A resume changes size, shuffle or drop_last.
_STATEFUL = {"stateful": True, "save_at": [3]}
CONFIGS: dict[str, dict[str, Any]] = {
    "loader": {},
    "weighted": {"weighted": True},  # WeightedRandomSampler with replacement
    "persistent": {"persistent": True},
    "persistent-untracked": {"persistent": True, "track": False},
    "persistent-alone": {"persistent": True, "devrng": False},
    # issue 37: a StatefulDataLoader with 2 workers, saved after batch 3 too
    "stateful": _STATEFUL,
    "stateful-none": {**_STATEFUL, "augment": "none"},
    "stateful-outside": {**_STATEFUL, "augment": "outside"},
    "stateful-unseeded": {**_STATEFUL, "augment": "outside", "kwargs": False},
    "stateful-collate": {**_STATEFUL, "collate": True},
    "stateful-collate-main": {**_STATEFUL, "collate": True, "workers": 0},
    "stateful-subset": {**_STATEFUL, "sampler": "subset", "save_at": [3, 10]},
    "stateful-weighted": {**_STATEFUL, "sampler": "weighted"},
    "stateful-replacement": {**_STATEFUL, "sampler": "replacement", "save_at": [5]},
    # issue 44, section 6: saved inside epoch 1 (a DistributedSampler's epoch: 4 batches)
    "stateful-distributed": {**_STATEFUL, "sampler": "distributed", "save_at": [6]},
    "stateful-distributed-main": {**_STATEFUL, "sampler": "distributed", "save_at": [6],
                                  "workers": 0},
    "stateful-batches": {**_STATEFUL, "sampler": "batches", "save_at": [10]},
    "stateful-batches-main": {**_STATEFUL, "sampler": "batches", "save_at": [10], "workers": 0},
    "stateful-python": {**_STATEFUL, "sampler": "python", "save_at": [10]},
    "stateful-python-main": {**_STATEFUL, "sampler": "python", "save_at": [10], "workers": 0},
    "stateful-randperm": {**_STATEFUL, "sampler": "randperm", "save_at": [10]},
    "stateful-randperm-main": {**_STATEFUL, "sampler": "randperm", "save_at": [10],
                               "workers": 0},
    # issue 44: exact resumes no load-time warning may call inexact
    "stateful-persistent": {**_STATEFUL, "persistent": True, "pin": True, "save_at": [3, 10]},
    "stateful-iterable": {**_STATEFUL, "iterable": True, "save_at": [3, 10]},
}


class ShuffledAtIter(torch.utils.data.Sampler[int]):
    """Shuffles when ``iter`` is called, with Python's ``random`` or torch's global
    ``randperm`` (a sampler of the user's: no state of its own, no generator)."""

    def __init__(self, size: int, how: str) -> None:
        self.size, self.how = size, how

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Any:
        if self.how == "python":
            order = list(range(self.size))
            random.shuffle(order)
        else:
            order = torch.randperm(self.size).tolist()
        return iter(order)


class OwnBatches:
    """A batch sampler of the user's: batches of 4 of a permutation drawn from its own
    generator (kept under a name of its own, ``rng``) as each epoch's iteration begins."""

    def __init__(self, size: int, generator: torch.Generator) -> None:
        self.size, self.rng = size, generator

    def __len__(self) -> int:
        return (self.size + 3) // 4

    def __iter__(self) -> Any:
        order = torch.randperm(self.size, generator=self.rng).tolist()
        for start in range(0, self.size, 4):
            yield order[start:start + 4]


def _loader(config: dict[str, Any], kwargs: dict[str, Any],
            batches: torch.Generator | None = None) -> Any:
    size = config.get("size", 26)
    augment = config.get("augment", "inside")
    data: Any = Augmented(size=size, per_sample=augment == "inside", indexed=True,
                          augment=augment != "none")
    sampler = config.get("sampler")
    if config.get("iterable"):
        data = ShardedShuffled(size)
    elif sampler == "subset":
        kwargs["sampler"] = torch.utils.data.SubsetRandomSampler(range(size - 2))
    elif sampler == "weighted" or config.get("weighted"):
        # it draws from torch's global generator, which devrng keeps
        kwargs["sampler"] = torch.utils.data.WeightedRandomSampler(
            torch.linspace(1, 2, size), num_samples=size, replacement=True)
    elif sampler == "replacement":
        kwargs["sampler"] = torch.utils.data.RandomSampler(
            data, replacement=True, num_samples=40, generator=kwargs.get("generator"))
    elif sampler == "distributed":
        kwargs["sampler"] = torch.utils.data.DistributedSampler(data, num_replicas=2, rank=0,
                                                                seed=SEED)
    elif sampler in ("python", "randperm"):
        kwargs["sampler"] = ShuffledAtIter(size, sampler)
    elif sampler != "batches":
        kwargs["shuffle"] = config.get("shuffle", True)
    workers = config.get("workers", 2)
    if batches is not None:
        kwargs["batch_sampler"] = OwnBatches(size, batches)
    batching = {} if batches is not None else {"batch_size": 4,
                                               "drop_last": config.get("drop_last", False)}
    options = {**batching,
               "num_workers": workers, "persistent_workers": bool(config.get("persistent")),
               "collate_fn": noisy_collate if config.get("collate") else None,
               "pin_memory": bool(config.get("pin")), **kwargs}
    if config.get("stateful"):
        from torchdata.stateful_dataloader import StatefulDataLoader

        return StatefulDataLoader(data, **options)
    return torch.utils.data.DataLoader(data, **options)


def train(config: dict[str, Any], out: Path, resume: Path | None = None) -> Result:
    for name in config.get("fix_off", []):
        set_fix(name, False)
    with devrng_messages() as (found, logged, flight):
        model, opt = model_and_optimizer()
        rng = None
        kwargs: dict[str, Any] = {}
        if config.get("devrng", True):
            rng = devrng.TrainingRNG(SEED)
            if config.get("kwargs", True):
                kwargs = rng.dataloader_kwargs()
        else:
            torch.manual_seed(SEED)
            kwargs = {"generator": torch.Generator().manual_seed(SEED)}
        batches = torch.Generator().manual_seed(SEED + 1) \
            if config.get("sampler") == "batches" else None
        loader = _loader(config, kwargs, batches)
        step: Any = sgd_step(model, opt)
        if rng is not None:
            step = rng.track("step", devrng.seeded_jit(step, backend="eager"))
            if batches is not None:
                rng.track("batches", batches)
            if config.get("track", True):
                rng.track("loader", loader)
        epoch = steps = 0
        if resume is not None:
            ckpt = torch.load(resume, weights_only=True)
            model.load_state_dict(ckpt["model"])
            opt.load_state_dict(ckpt["optimizer"])
            epoch, steps = ckpt["epoch"], ckpt["step"]
            assert rng is not None, "the resumes here are devrng's"
            try:
                rng.load_state_dict(ckpt["rng"])
            except devrng.DevRNGError as err:
                result = Result([], [], digest(model), steps, error=str(err))
                result.warnings, result.logged = found, logged
                return result
        losses, samples, order = [], [], []
        while epoch < EPOCHS:
            augmented: dict[int, list[float]] = {}
            indices: list[int] = []
            if config.get("sampler") == "distributed":
                loader.sampler.set_epoch(epoch)
            for batch in loader:
                index, x = batch[:, 0], batch[:, 1:]
                y = x.sum(dim=1, keepdim=True) * 0.5 + torch.randn(len(x), 1) * 0.01 \
                    + random.gauss(0, 0.01)
                losses.append(float(step(x, y)).hex())
                augmented.update(zip(index.long().tolist(), x.tolist(), strict=True))
                indices += index.long().tolist()
                steps += 1
                if resume is None and rng is not None and steps in config.get("save_at", []):
                    _save(out / "ck" / f"step{steps}.pt", model, opt, epoch, steps, rng)
            samples.append(hashlib.sha256(repr(sorted(augmented.items())).encode()).hexdigest())
            order.append(",".join(map(str, indices)))
            epoch += 1
            if resume is None and rng is not None:  # after the epoch's loop
                _save(out / "ck" / f"epoch{epoch}.pt", model, opt, epoch, steps, rng)
    result = Result(losses, [], digest(model), steps)
    result.warnings, result.logged, result.samples, result.order = found, logged, samples, order
    result.flight = flight
    return result


def _save(path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, epoch: int,
          steps: int, rng: devrng.TrainingRNG) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch,
                "step": steps, "rng": rng.state_dict()}, path)


if __name__ == "__main__":
    main(sys.argv[1:], job_runner(train, CONFIGS))
