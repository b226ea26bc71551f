"""Tiny datasets for the DataLoader seeding and resume tests.

They live in an importable module (not in a test file) so that workers started
with the 'spawn' method can unpickle them.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

import devrng

# Columns of one item.
INDEX, TORCH, NUMPY, PYTHON, NORMAL, UNIFORM, WORKER, RANK = range(8)


class RandomDraws(Dataset[torch.Tensor]):
    """Item i: its index, one draw from each RNG an augmentation might use, the worker id and rank.

    ``torch.distributions`` samples stand for augmentations that draw their
    parameters from distributions (the Lightning complaint).
    """

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self.normal = torch.distributions.Normal(torch.tensor(0.0), torch.tensor(1.0))
        self.uniform = torch.distributions.Uniform(torch.tensor(-1.0), torch.tensor(1.0))

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        info = get_worker_info()
        return torch.tensor(
            [
                index,
                torch.rand(()).item(),
                np.random.rand(),
                random.random(),
                self.normal.sample().item(),
                self.uniform.sample().item(),
                -1 if info is None else info.id,
                int(os.environ.get("RANK", "0")),
            ],
            dtype=torch.float64,
        )


class Augmented(Dataset[torch.Tensor]):
    """Samples whose augmentation draws from torch, NumPy and Python's random; with
    ``per_sample``, inside ``devrng.sample_rng(index)``; with ``indexed``, the index in a
    first column (to tell which sample a row is); with ``augment=False``, none at all."""

    def __init__(self, size: int = 24, per_sample: bool = False, indexed: bool = False,
                 augment: bool = True) -> None:
        self.base = torch.linspace(-1, 1, size * 4).reshape(size, 4)
        self.per_sample = per_sample
        self.indexed = indexed
        self.augment = augment

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int) -> torch.Tensor:
        if not self.augment:
            sample = self.base[i]
        elif self.per_sample:
            with devrng.sample_rng(i):
                sample = self._augment(i)
        else:
            sample = self._augment(i)
        return torch.cat([torch.tensor([float(i)]), sample]) if self.indexed else sample

    def _augment(self, i: int) -> torch.Tensor:
        noise = torch.randn(4) * 0.1 + float(np.random.normal()) * 0.05 + random.random() * 0.05
        return self.base[i] + noise


class Streamed(IterableDataset[torch.Tensor]):
    """``Augmented``'s samples as a stream without a length (as a streaming dataset), each
    worker taking every ``num_workers``-th one; a run sets ``max_steps``."""

    def __init__(self, size: int = 24) -> None:
        self.data = Augmented(size=size)

    def __iter__(self) -> Iterator[torch.Tensor]:
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        i = start
        while True:
            yield self.data[i % len(self.data)]
            i += step


class ShardedShuffled(torch.utils.data.IterableDataset[torch.Tensor]):
    """An iterable dataset each worker reads its shard of (every ``num_workers``-th sample),
    in an order it draws with ``torch.randperm`` from its own generator, augmenting each
    sample from it too; rows indexed as ``Augmented(indexed=True)``'s."""

    def __init__(self, size: int = 26) -> None:
        self.base = torch.linspace(-1, 1, size * 4).reshape(size, 4)

    def __iter__(self) -> Iterator[torch.Tensor]:
        info = get_worker_info()
        shard = torch.arange(len(self.base))
        if info is not None:
            shard = shard[info.id::info.num_workers]
        for i in shard[torch.randperm(len(shard))].tolist():
            sample = self.base[i] + torch.randn(4) * 0.1
            yield torch.cat([torch.tensor([float(i)]), sample])


class SizedShards(ShardedShuffled):
    """``ShardedShuffled`` with a length (its number of samples), from which a trainer counts
    an epoch's steps."""

    def __len__(self) -> int:
        return len(self.base)


def noisy_collate(rows: list[torch.Tensor]) -> torch.Tensor:
    """A collate_fn that draws batch-level noise from NumPy (as MixUp draws its weight), outside
    ``devrng.sample_rng``; the first column (the index, in indexed rows) is left as it is."""
    batch = torch.stack(rows)
    noise = torch.from_numpy(np.random.normal(size=batch.shape)).to(batch.dtype) * 0.05
    noise[:, 0] = 0.0
    return batch + noise


def small_model(device: str = "cpu", *, seeded: bool = True) -> torch.nn.Module:
    """Linear, ReLU, dropout 0.3, Linear; the same initial weights in every run, or with
    ``seeded=False`` torch's default initialisation, from its global generator (so that
    a run's seeding decides them, as in a user's program)."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Dropout(0.3),
                                torch.nn.Linear(16, 1))
    if seeded:
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return model.to(device)
