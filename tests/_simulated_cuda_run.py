"""A training loop whose model scatters with ``index_add_``, on the CPU, with the CPU kernel
of ``aten::index_add_`` replaced by one that adds in an order drawn from the OS: what
CUDA's atomic adds do (SIMULATED: CUDA cannot run here). With ``--mm``, ``aten::mm``'s CPU
kernel is replaced instead by one that sums in an order drawn from the OS unless
``CUBLAS_WORKSPACE_CONFIG`` is ``:4096:8`` or ``:16:8``: what cuBLAS's workspace does
(SIMULATED as well).

    python -m tests._simulated_cuda_run [--mm] [--deterministic]

``--deterministic`` turns on ``devrng.deterministic()`` as the verdict's fix says; the
simulated kernels then sum in a fixed order, as torch's deterministic CUDA paths do.
"""

from __future__ import annotations

import os
import sys

import torch

import devrng

_deterministic = "--deterministic" in sys.argv
_lib = torch.library.Library("aten", "IMPL")


def _index_add_(self: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor, *,
                alpha: float = 1) -> torch.Tensor:
    order = list(range(len(index)))
    if not torch.are_deterministic_algorithms_enabled():  # atomics: any order
        order.sort(key=lambda _: os.urandom(4))
    for i in order:
        row = self.select(dim, int(index[i]))
        row.add_(source.select(dim, i), alpha=alpha)
    return self


def _mm(self: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    order = list(range(self.shape[1]))
    if os.environ.get("CUBLAS_WORKSPACE_CONFIG") not in (":4096:8", ":16:8"):
        order.sort(key=lambda _: os.urandom(4))  # the workspace splits the sum its own way
    out = torch.zeros(self.shape[0], other.shape[1], dtype=self.dtype)
    for k in order:
        out += self[:, k:k + 1] * other[k:k + 1, :]
    return out


if "--mm" in sys.argv:
    _lib.impl("mm", _mm, "CPU")
else:
    _lib.impl("index_add_", _index_add_, "CPU")


class Scatter(torch.nn.Module):
    """Adds each of 64 hidden rows into one of 4 buckets (index_add_): in 16 terms a bucket's
    sum comes out of another order another float (the same in 1 pair of runs in 200; with 16
    rows, in 55)."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        index = torch.arange(h.shape[1]) % 4
        out = torch.zeros(h.shape[0], 4)
        return out.index_add_(1, index, h * 1.1)


def main() -> None:
    rng = devrng.TrainingRNG(seed=0, deterministic=_deterministic)
    model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Tanh(), Scatter(),
                                torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.linspace(-1, 1, 64).reshape(8, 8)
    for _ in range(4):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
        opt.step()
    del rng


if __name__ == "__main__":
    main()
