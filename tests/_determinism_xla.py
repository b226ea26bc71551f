"""A plain loop on an XLA device (``torch_xla``; PJRT_DEVICE=CPU here) with
``devrng.TrainingRNG``, for ``devrng check-determinism`` on XLA (tests/test_check_determinism_xla.py):

    PJRT_DEVICE=CPU python tests/_determinism_xla.py [--unordered-sum] [--shuffle urandom]

- ``--unordered-sum``: the model's ``pool`` layer is a ``torch.library`` op
  (tests/_unordered_sum.py) that sums its XLA tensors in an order drawn from ``os.urandom``;
- ``--shuffle urandom``: the loader shuffles with a generator seeded from ``os.urandom``.

Without a flag the script is deterministic.
"""

from __future__ import annotations

import argparse

import torch
import torch_xla.core.xla_model as xm
from tests._unordered_sum import network, urandom_generator

import devrng


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--unordered-sum", action="store_true")
    parser.add_argument("--shuffle", choices=("devrng", "urandom"), default="devrng")
    args = parser.parse_args()

    device = xm.xla_device()
    rng = devrng.TrainingRNG(seed=1234)
    model = network(args.unordered_sum).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    kwargs = dict(rng.dataloader_kwargs())
    if args.shuffle == "urandom":
        kwargs["generator"] = urandom_generator()
    data = torch.utils.data.TensorDataset(torch.linspace(-1, 1, 64 * 8).reshape(64, 8))
    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True, **kwargs)
    rng.track("loader", loader)
    for _epoch in range(2):
        for (x,) in loader:
            x = x.to(device)
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
            loss.backward()
            opt.step()
            xm.mark_step()


if __name__ == "__main__":
    main()
