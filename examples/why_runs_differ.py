"""A training script to try ``devrng check-determinism`` on: each flag plants one cause of
runs that differ though every seed is set.

    devrng check-determinism --steps 6 -- python examples/why_runs_differ.py
    devrng check-determinism --steps 6 -- python examples/why_runs_differ.py --unordered-sum
    devrng check-determinism --steps 6 -- python examples/why_runs_differ.py --shuffle urandom

- ``--unordered-sum``: the encoder's pooling layer sums in an order that changes from run
  to run, as a GPU kernel's atomic adds do (a ``torch.library`` op);
- ``--shuffle urandom``: the loader shuffles with a generator seeded from ``os.urandom``;
- ``--noise urandom``: the model adds noise from a generator seeded from ``os.urandom``;
- ``--augment urandom``: the dataset jitters each sample with NumPy noise seeded from
  ``os.urandom``;
- ``--workers N`` with ``--out-of-order``: workers that take random time, and a loader
  that hands over batches as they are ready (``in_order=False``).

Without a flag the script is deterministic: the check passes.
"""

# tested-by: tests/test_check_determinism.py

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

import devrng

lib = torch.library.Library("why_runs_differ", "DEF")
lib.define("unordered_sum(Tensor x) -> Tensor")


def _unordered_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum over the first dimension in an order drawn from the OS: float sums are not
    associative, so the last bits change from run to run."""
    out = torch.zeros_like(x[0])
    for i in torch.randperm(len(x), generator=torch.Generator().manual_seed(
            int.from_bytes(os.urandom(8), "little"))).tolist():
        out = out + x[i]
    return out


def _unordered_sum_backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
    return grad.expand(ctx.n, *grad.shape)  # type: ignore[attr-defined]


def _save_n(ctx: object, inputs: tuple[torch.Tensor], output: torch.Tensor) -> None:
    ctx.n = len(inputs[0])  # type: ignore[attr-defined]


lib.impl("unordered_sum", _unordered_sum, "CompositeExplicitAutograd")
torch.library.register_autograd("why_runs_differ::unordered_sum", _unordered_sum_backward,
                                setup_context=_save_n)


class Pool(torch.nn.Module):
    """Sums the hidden units in groups of four (in a fixed order, or not)."""

    def __init__(self, unordered: bool) -> None:
        super().__init__()
        self.unordered = unordered

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        groups = h.reshape(len(h), -1, 4).permute(2, 0, 1)
        if self.unordered:
            return torch.ops.why_runs_differ.unordered_sum(groups)
        return groups.sum(0)


class Noise(torch.nn.Module):
    """Adds noise from a generator of its own (seeded from the OS: not reproducible)."""

    def __init__(self) -> None:
        super().__init__()
        self.generator = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little"))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + 0.01 * torch.randn(h.shape, generator=self.generator)


class Points(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, slow: bool, augment: bool) -> None:
        self.x = torch.linspace(-1, 1, 96 * 8).reshape(96, 8)
        self.slow = slow
        self.noise = np.random.default_rng(int.from_bytes(os.urandom(8), "little")) \
            if augment else None

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.slow and os.urandom(1)[0] < 64:  # a quarter take longer: out of turn
            time.sleep(0.03)
        x = self.x[i]
        if self.noise is not None:
            x = x + torch.from_numpy(self.noise.normal(0, 0.01, 8).astype("float32"))
        return x, self.x[i].sum(0, keepdim=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--unordered-sum", action="store_true")
    parser.add_argument("--shuffle", choices=("devrng", "urandom"), default="devrng")
    parser.add_argument("--noise", choices=("none", "urandom"), default="none")
    parser.add_argument("--augment", choices=("none", "urandom"), default="none")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--out-of-order", action="store_true")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()

    rng = devrng.TrainingRNG(seed=0)
    model = torch.nn.Sequential()
    model.add_module("encoder", torch.nn.Sequential(
        torch.nn.Linear(8, 32), torch.nn.Tanh(), Pool(args.unordered_sum),
        *([Noise()] if args.noise == "urandom" else [])))
    model.add_module("head", torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    kwargs = dict(rng.dataloader_kwargs())
    if args.shuffle == "urandom":
        kwargs["generator"] = torch.Generator().manual_seed(
            int.from_bytes(os.urandom(8), "little"))
    if args.out_of_order:
        kwargs["in_order"] = False
    loader = DataLoader(Points(slow=args.out_of_order, augment=args.augment == "urandom"), batch_size=8, shuffle=True,
                        num_workers=args.workers, **kwargs)
    rng.track("loader", loader)

    for _epoch in range(args.epochs):
        for x, y in loader:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
    print(f"final loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
