"""Tiny datasets for the DataLoader seeding tests.

They live in an importable module (not in a test file) so that workers started
with the 'spawn' method can unpickle them.
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch
from torch.utils.data import Dataset, get_worker_info

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
