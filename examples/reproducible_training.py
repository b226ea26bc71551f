"""Reproducible training on the CPU: devrng.deterministic() plus seeded DataLoader workers.

Trains a small model with dropout for two epochs on data that two DataLoader
workers augment with torch, NumPy and torch.distributions noise, twice from
the same seed, and checks that every loss is bitwise equal. Then it prints
what deterministic() changed. Run: python examples/reproducible_training.py
"""

# timeout: 120

from __future__ import annotations

import random

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

import devrng


class NoisyPoints(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Fixed points; each access adds fresh random augmentation noise."""

    def __init__(self, n: int = 64) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 8, generator=g)
        self.y = (self.x.sum(1) > 0).long()
        self.jitter = torch.distributions.Normal(0.0, 0.1)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        scale = 1.0 + 0.05 * np.random.randn() + 0.05 * (random.random() - 0.5)
        x = self.x[i] * scale + self.jitter.sample((8,)) + 0.01 * torch.randn(8)
        return x, self.y[i]


def train(seed: int) -> list[float]:
    with devrng.deterministic(seed=seed) as handle:
        model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(),
                                    torch.nn.Dropout(0.2), torch.nn.Linear(32, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(NoisyPoints(), batch_size=16, shuffle=True, num_workers=2,
                            **handle.dataloader_kwargs())
        losses = []
        for _epoch in range(2):
            for x, y in loader:
                opt.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                losses.append(loss.item())
        return losses


def main() -> None:
    first, second, other = train(seed=0), train(seed=0), train(seed=1)
    assert first == second, "same seed, different losses"
    assert first != other, "different seeds, same losses"
    print(f"seed 0, run 1: {[round(v, 4) for v in first[:4]]} ...")
    print(f"seed 0, run 2: {[round(v, 4) for v in second[:4]]} ...  (bitwise equal)")
    print(f"seed 1:        {[round(v, 4) for v in other[:4]]} ...")

    with devrng.deterministic(seed=0) as handle:
        report = handle.report()
    print("\nWhat deterministic(seed=0) changed in this process:")
    for name, entry in report.items():
        if name in ("seed", "torch.initial_seed()"):
            continue
        if not entry["available"]:
            print(f"  {name:52} unavailable here")
        elif entry["previous"] != entry["value"]:
            print(f"  {name:52} {entry['previous']!r} -> {entry['value']!r}")
    print("Everything above is back to its old value now:",
          torch.are_deterministic_algorithms_enabled() is False)


if __name__ == "__main__":
    main()
