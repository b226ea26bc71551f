"""A plain training loop with the flight record on, as the resume page shows it.

    python -m tests._flight_run CONFIG_JSON OUT_JSON

Run in a directory of its own: the loop resumes from ``ckpt.pt`` there when it exists,
keeps its flight record there, and saves ``ckpt.pt`` after each step in ``save_at``.
``DEVRNG_MAX_STEPS`` / ``DEVRNG_STOP_AFTER`` end it where a test wants (as they end a
user's script under ``devrng check-resume``). Configuration (all optional):

- ``augment``: where each sample's noise comes from: ``"sample_rng"`` (inside
  ``devrng.sample_rng(index)``: exact everywhere), ``"torch"`` (torch's generator in the
  worker), ``"none"``;
- ``collate``: ``"numpy"``: the collate_fn adds NumPy noise (NumPy's global generator);
- ``loader``: ``"stateful"`` (torchdata's StatefulDataLoader) or ``"plain"``;
- ``workers``, ``batch``, ``accumulate`` (micro-batches per optimizer step), ``epochs``,
  ``save_at`` (steps), ``seed``, ``loss`` (record the loss: default true);
- ``resumed``: what a resumed run does otherwise: ``"drift"`` (each step's gradient gets
  noise from ``os.urandom``, as a nondeterministic kernel gives), ``"short"`` (it ends
  after two steps).

OUT_JSON gets the losses (``float.hex``), the step the run resumed at, the record's
``verified``, and the ``DevRNGWarning`` messages and ``"devrng"`` log lines of the run.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import warnings
from typing import Any

import numpy as np
import torch

import devrng


class Noisy(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """24 samples of 4 features and a target; each sample's noise drawn as ``augment`` says."""

    def __init__(self, augment: str) -> None:
        self.augment = augment
        self.base = torch.linspace(-1, 1, 24 * 4).reshape(24, 4)

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.base[i]
        if self.augment == "sample_rng":
            with devrng.sample_rng(i):
                x = x + 0.1 * torch.randn(4)
        elif self.augment == "torch":
            x = x + 0.1 * torch.randn(4)
        return x, x.sum(0, keepdim=True)


class _Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def numpy_collate(batch: list[Any]) -> Any:
    x, y = torch.utils.data.default_collate(batch)
    return x + float(np.random.rand()), y


def main(config: dict[str, Any], out: str) -> None:
    keep = _Keep()
    logging.getLogger("devrng").addHandler(keep)
    logging.getLogger("devrng").setLevel(logging.INFO)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = train(config, out)
    result["warnings"] = [str(w.message) for w in caught if w.category.__name__ == "DevRNGWarning"]
    result["logged"] = keep.lines
    with open(out, "w") as fh:
        json.dump(result, fh)


def train(config: dict[str, Any], out: str) -> dict[str, Any]:
    rng = devrng.TrainingRNG(config.get("seed", 1234), flight_record=".")
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Dropout(0.3),
                                torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    stateful = config.get("loader", "stateful") == "stateful"
    if stateful:
        from torchdata.stateful_dataloader import StatefulDataLoader as Loader
    else:
        Loader = torch.utils.data.DataLoader
    kwargs: dict[str, Any] = {"collate_fn": numpy_collate} if config.get("collate") else {}
    loader = rng.track("loader", Loader(
        Noisy(config.get("augment", "sample_rng")), batch_size=config.get("batch", 4),
        shuffle=True, num_workers=config.get("workers", 2), **kwargs,
        **rng.dataloader_kwargs()))
    start_epoch, resumed = 0, None
    if os.path.exists("ckpt.pt"):
        ckpt = torch.load("ckpt.pt", weights_only=True)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        rng.load_state_dict(ckpt["rng"])
        start_epoch, resumed = ckpt["epoch"], ckpt["step"]
    assert rng.flight is not None
    step = rng.flight.step
    losses = []
    accumulate = config.get("accumulate", 1)
    save_at = set(config.get("save_at", []))
    for epoch in range(start_epoch, config.get("epochs", 2)):
        for i, (x, y) in enumerate(loader):
            loss = torch.nn.functional.mse_loss(model(x), y) / accumulate
            loss.backward()
            if resumed is not None and config.get("resumed") == "drift":
                with torch.no_grad():
                    model[0].weight.grad[0, 0] += 1e-3 * (1 + os.urandom(1)[0])
            if config.get("loss", True):
                rng.flight.loss(loss)
            if (i + 1) % accumulate:
                continue
            opt.step()
            opt.zero_grad()
            step += 1
            losses.append(loss.item().hex())
            if resumed is not None and config.get("resumed") == "short" \
                    and step == resumed + 2:
                return {"losses": losses, "resumed": resumed, "verified": rng.flight.verified}
            if step in save_at:
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                            "rng": rng.state_dict(), "epoch": epoch, "step": step}, "ckpt.pt")
    rng.flight.flush()
    return {"losses": losses, "resumed": resumed, "verified": rng.flight.verified}


if __name__ == "__main__":
    main(json.loads(sys.argv[1]), sys.argv[2])
