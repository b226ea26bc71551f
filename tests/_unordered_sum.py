"""A layer that sums in an order drawn from ``os.urandom``, as a GPU kernel's atomic adds
do, for the scripts ``devrng check-determinism`` is tested on: the ``torch.library`` op
``determinism_test::unordered_sum`` and ``network(unordered)``, whose ``pool`` layer is
that op or a plain sum."""

from __future__ import annotations

import os
from typing import Any

import torch

__all__ = ["Pool", "network", "urandom_generator"]

lib = torch.library.Library("determinism_test", "DEF")
lib.define("unordered_sum(Tensor x) -> Tensor")


def urandom_generator() -> torch.Generator:
    """A CPU generator seeded from the OS: another stream in every run."""
    return torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little"))


def _unordered_sum(x: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(x[0])
    for i in torch.randperm(len(x), generator=urandom_generator()).tolist():
        out = out + x[i]
    return out


def _backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
    return grad.expand(ctx.n, *grad.shape)


def _save_n(ctx: Any, inputs: tuple[torch.Tensor], output: torch.Tensor) -> None:
    ctx.n = len(inputs[0])


lib.impl("unordered_sum", _unordered_sum, "CompositeExplicitAutograd")
torch.library.register_autograd("determinism_test::unordered_sum", _backward,
                                setup_context=_save_n)


class Pool(torch.nn.Module):
    """Sums the hidden units in groups of eight (in a fixed order, or not: of 8! orders, two
    runs rarely draw ones with equal sums)."""

    def __init__(self, unordered: bool) -> None:
        super().__init__()
        self.unordered = unordered

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        groups = h.reshape(len(h), -1, 8).permute(2, 0, 1)
        if self.unordered:
            return torch.ops.determinism_test.unordered_sum(groups)
        return groups.sum(0)


def network(unordered: bool) -> torch.nn.Sequential:
    """``encoder``, ``pool`` (the layer ``unordered`` makes nondeterministic), ``head``."""
    model = torch.nn.Sequential()
    model.add_module("encoder", torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh()))
    model.add_module("pool", Pool(unordered))
    model.add_module("head", torch.nn.Linear(4, 1))
    return model
