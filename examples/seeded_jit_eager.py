"""seeded_jit without a compiler: the seed as an argument, the caller's RNG left alone.

Run:  python examples/seeded_jit_eager.py
"""

from __future__ import annotations

import torch

import devrng


@devrng.seeded_jit(backend="eager")
def noisy(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.dropout(x, 0.5, training=True) + 0.01 * torch.randn_like(x)


def main() -> None:
    torch.manual_seed(0)
    x = torch.ones(6)
    before = torch.get_rng_state()
    a, b, c = noisy(x, seed=1), noisy(x, seed=1), noisy(x, seed=2)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(before, torch.get_rng_state())  # the caller's stream did not move
    print("seed 1:", a)
    print("seed 2:", c)
    # Without seed=, each call takes the next seed of the function's own stream;
    # state_dict() / load_state_dict() resume that stream after a restart.
    saved = noisy.state_dict()
    first = noisy(x)
    noisy.load_state_dict(saved)
    assert torch.equal(first, noisy(x))
    print("stream state:", noisy.state_dict())


if __name__ == "__main__":
    main()
