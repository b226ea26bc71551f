"""A small accelerate run that records its per-step losses (float.hex) for the resume tests.

    python -m tests.integrations._accelerate_run MODE EPOCHS OUT.json [--save DIR] [--resume DIR]

MODE: ``plain`` (accelerate's ``set_seed`` and its own ``save_state`` RNG states),
``plain-seeded-jit`` (the same with a ``seeded_jit`` step, whose stream accelerate does
not save), ``devrng`` (``devrng.integrations.accelerate.register``), or
``devrng-without-state`` (devrng seeding, but nothing registered).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import accelerate
import torch
from tests._datasets import Augmented, small_model

import devrng
from devrng.integrations.accelerate import register

SEED = 1234


def main(argv: list[str]) -> None:
    mode, epochs, out = argv[0], int(argv[1]), argv[2]
    save = argv[argv.index("--save") + 1] if "--save" in argv else None
    resume = argv[argv.index("--resume") + 1] if "--resume" in argv else None
    accelerator = accelerate.Accelerator(cpu=True)
    loader_kwargs: dict[str, Any] = {}
    rng = None
    if mode.startswith("plain"):
        accelerate.utils.set_seed(SEED)
    elif mode == "devrng":
        rng = register(accelerator, seed=SEED)
        loader_kwargs = rng.dataloader_kwargs()
    else:
        rng = devrng.TrainingRNG(SEED)
        loader_kwargs = rng.dataloader_kwargs()
    model = small_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = torch.utils.data.DataLoader(Augmented(size=32), batch_size=4, shuffle=True, num_workers=2,
                                         **loader_kwargs)
    model, opt, loader = accelerator.prepare(model, opt, loader)

    def train_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        opt.step()
        return loss.detach()

    step: Any = train_step
    if mode != "plain":
        step = devrng.seeded_jit(train_step, backend="eager")
        if rng is not None and mode == "devrng":
            rng.track("step", step)
    start = 0
    if resume:
        accelerator.load_state(resume)
        start = 1
    losses = []
    for _epoch in range(start, epochs):
        for x in loader:
            losses.append(float(step(x, x.sum(dim=1, keepdim=True) * 0.5)).hex())
    if save:
        accelerator.save_state(save)
    with open(out, "w") as fh:
        json.dump(losses, fh)


if __name__ == "__main__":
    main(sys.argv[1:])
