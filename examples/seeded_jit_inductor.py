"""seeded_jit on torch.compile (inductor): one compilation for every seed.

Run:  python examples/seeded_jit_inductor.py
(the first call compiles for a few seconds to a minute on a small CPU)
"""
# timeout: 600

from __future__ import annotations

import torch

import devrng


def main() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5))
    x = torch.ones(2, 4)
    forward = devrng.seeded_jit(model, backend="inductor")
    outs = {seed: forward(x, seed=seed).detach() for seed in (11, 12)}
    again = forward(x, seed=11).detach()
    assert torch.equal(outs[11], again), "the first (compiling) call is reproducible too"
    assert not torch.equal(outs[11], outs[12])
    for seed in range(20):  # new seeds are runtime values: no recompilation
        forward(x, seed=100 + seed)
    print("compilations after 23 calls with 21 seeds:", forward.compile_count)
    assert forward.compile_count == 1


if __name__ == "__main__":
    main()
