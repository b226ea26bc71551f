"""A tiny training script per trainer, wired to devrng as its docs page says, for
``devrng check-determinism`` (tests/integrations/test_check_determinism.py).

    python tests/integrations/_determinism_trainers.py --trainer lightning [--unordered-sum]
        [--shuffle urandom]

- ``--unordered-sum``: the model's ``pool`` layer is a ``torch.library`` op
  (``determinism_test::unordered_sum``, tests/_unordered_sum.py) that sums in an order
  drawn from ``os.urandom``, as a GPU kernel's atomic adds do;
- ``--shuffle urandom``: the training data is shuffled by a generator seeded from
  ``os.urandom`` (the loader's for Lightning and accelerate; the Trainer's sampler for HF).

Without a flag each is deterministic.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from tests._unordered_sum import network, urandom_generator

import devrng


class Points(torch.utils.data.Dataset[Any]):
    def __init__(self, as_dict: bool = False) -> None:
        self.x = torch.linspace(-1, 1, 64 * 8).reshape(64, 8)
        self.as_dict = as_dict

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> Any:
        x, y = self.x[i], self.x[i].sum(0, keepdim=True)
        return {"x": x, "labels": y} if self.as_dict else (x, y)


class UrandomSampler(torch.utils.data.Sampler[int]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Any:
        return iter(torch.randperm(self.n, generator=urandom_generator()).tolist())


def loader_kwargs(rng: devrng.TrainingRNG, shuffle: str) -> dict[str, Any]:
    kwargs = dict(rng.dataloader_kwargs())
    if shuffle == "urandom":
        kwargs["generator"] = urandom_generator()
    return kwargs


def lightning(args: argparse.Namespace) -> None:
    import lightning.pytorch as pl

    from devrng.integrations.lightning import DevRNGCallback

    class Net(pl.LightningModule):
        def __init__(self, loader_kwargs: dict[str, Any]) -> None:
            super().__init__()
            self.loader_kwargs = loader_kwargs
            self.net = network(args.unordered_sum)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.05)

        def train_dataloader(self) -> torch.utils.data.DataLoader[Any]:
            return torch.utils.data.DataLoader(Points(), batch_size=8, shuffle=True,
                                               **self.loader_kwargs)

    callback = DevRNGCallback(seed=1234)
    model = Net(loader_kwargs(callback.rng, args.shuffle))
    trainer = pl.Trainer(max_epochs=2, callbacks=[callback], logger=False, accelerator="cpu",
                         enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False)
    trainer.fit(model)


def accelerate_(args: argparse.Namespace) -> None:
    import accelerate

    from devrng.integrations.accelerate import register

    accelerator = accelerate.Accelerator(cpu=True)
    rng = register(accelerator, seed=1234)
    model = network(args.unordered_sum)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    # (With torch_xla installed, accelerate replaces a shuffling loader's generator by its
    # own seeded sampler: the OS-shuffled twin is a sampler of the user's own there too.)
    order: dict[str, Any] = ({"sampler": UrandomSampler(len(Points()))}
                             if args.shuffle == "urandom" else {"shuffle": True})
    loader = torch.utils.data.DataLoader(Points(), batch_size=8, **order,
                                         **loader_kwargs(rng, "devrng"))
    model, opt, loader = accelerator.prepare(model, opt, loader)
    rng.track("loader", loader)
    for _epoch in range(2):
        for x, y in loader:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            opt.step()


def transformers_(args: argparse.Namespace) -> None:
    from transformers import Trainer, TrainingArguments, set_seed

    from devrng.integrations.transformers import DevRNGTrainerCallback

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = network(args.unordered_sum)

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"loss": torch.nn.functional.mse_loss(self.net(x), labels)}

    class Shuffled(Trainer):  # type: ignore[misc]
        """A Trainer with a sampler of the user's own that shuffles from the OS. (A
        ``RandomSampler`` would not do: accelerate, under the Trainer, replaces it by one it
        seeds, use_seedable_sampler.)"""

        def _get_train_sampler(self, *a: Any, **k: Any) -> Any:
            return UrandomSampler(len(self.train_dataset))

    set_seed(1234)
    targs = TrainingArguments(output_dir="out", max_steps=16, save_strategy="no",
                              per_device_train_batch_size=8, optim="sgd", learning_rate=0.05,
                              lr_scheduler_type="constant", seed=1234, use_cpu=True,
                              report_to=[], disable_tqdm=True, remove_unused_columns=False)
    trainer_class = Shuffled if args.shuffle == "urandom" else Trainer
    trainer = trainer_class(model=Model(), args=targs, train_dataset=Points(as_dict=True),
                            callbacks=[DevRNGTrainerCallback()])
    trainer.train()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trainer", choices=("lightning", "accelerate", "transformers"),
                        required=True)
    parser.add_argument("--unordered-sum", action="store_true")
    parser.add_argument("--shuffle", choices=("devrng", "urandom"), default="devrng")
    args = parser.parse_args()
    {"lightning": lightning, "accelerate": accelerate_,
     "transformers": transformers_}[args.trainer](args)


if __name__ == "__main__":
    main()
