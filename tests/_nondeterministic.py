"""Real nondeterminism on the CPU, for locating it: a ``torch.library`` op that sums over the
batch in an order drawn from ``os.urandom`` (as GPU atomics reorder a sum), and modules that
use it in their forward, only in their backward, or draw from a generator seeded from
``os.urandom``. Imported once per process (an op is registered once)."""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any

import torch


def _urandom_seed() -> int:
    return int.from_bytes(os.urandom(8), "little")


@torch.library.custom_op("devrng_test::unordered_sum", mutates_args=())
def unordered_sum(x: torch.Tensor) -> torch.Tensor:
    """``x.sum(0)``, adding the rows in an order drawn from os.urandom."""
    order = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(_urandom_seed()))
    total = torch.zeros_like(x[0])
    for row in order.tolist():  # one rounding per addition (cumsum adds in double)
        total = total + x[row]
    return total


@unordered_sum.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[1:])


def _setup(ctx: Any, inputs: tuple[torch.Tensor], output: torch.Tensor) -> None:
    ctx.rows = inputs[0].shape[0]


def _backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
    return grad.expand(ctx.rows, *grad.shape)


unordered_sum.register_autograd(_backward, setup_context=_setup)


class Pool(torch.nn.Module):
    """Sums the batch with the unordered op: nondeterministic in the forward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return unordered_sum(x)


class _ScaleFn(torch.autograd.Function):
    """``x * w``, whose weight gradient sums the batch in an unordered way (as a GPU kernel
    with atomic adds does): nondeterministic only in the backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        return x * w

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, w = ctx.saved_tensors
        return grad * w, unordered_sum(grad * x)


class Scale(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.linspace(0.5, 1.5, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ScaleFn.apply(x, self.w)  # type: ignore[no-any-return]


class Noise(torch.nn.Module):
    """Adds noise from a generator seeded from os.urandom (one devrng does not seed)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        generator = torch.Generator().manual_seed(_urandom_seed())
        return x + 0.1 * torch.randn(x.shape, generator=generator)


def model(middle: torch.nn.Module, width: int = 8) -> torch.nn.Sequential:
    """``embed`` (Linear), ``middle`` under the name its class gives, ``head`` (Linear)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(OrderedDict([
        ("embed", torch.nn.Linear(width, width)),
        (type(middle).__name__.lower(), middle),
        ("head", torch.nn.Linear(width, 2)),
    ]))


def batch(rows: int = 64, width: int = 8) -> torch.Tensor:
    """Rows of very different magnitudes: adding them in another order rounds otherwise."""
    torch.manual_seed(1)
    return torch.randn(rows, width) * torch.logspace(0, 6, rows)[:, None]
