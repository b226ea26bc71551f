"""seeded_jit on torch_xla.compile: a reproducible dropout training step, one compilation.

Run:  PJRT_DEVICE=CPU python examples/seeded_jit_torch_xla.py
"""
# requires: torch_xla

from __future__ import annotations

import torch
import torch_xla
import torch_xla.core.xla_model as xm

import devrng


def main() -> None:
    device = torch_xla.device()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.5),
                                torch.nn.Linear(16, 1)).to(device)
    initial = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 8).to(device), torch.randn(4, 1).to(device)
    torch_xla.sync()

    @devrng.seeded_jit(backend="torch_xla")
    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    def train(seeds: list[int]) -> list[float]:
        model.load_state_dict(initial)
        torch_xla.sync()
        return [step(x, y, seed=s).item() for s in seeds]

    first, second = train([11, 12, 13]), train([11, 12, 13])
    assert first == second, "same weights and seeds: the same losses, bit for bit"
    assert train([21, 22, 23]) != first, "other seeds, other dropout masks"
    xm.set_rng_state(1234, device)
    step(x, y, seed=5)
    assert xm.get_rng_state(device) == 1234, "the caller's XLA seed is untouched"
    print("losses:", first)
    print("XLA compilations:", step.compile_count)
    assert step.compile_count == 1


if __name__ == "__main__":
    main()
