"""seeded_jit on torchax (JAX jit): fresh dropout masks per seed instead of one baked-in mask.

torchax 0.0.13's ``interop.jax_jit`` reads the PRNG key while tracing, so the
compiled program returns the same mask on every call. seeded_jit passes the
key in as an argument instead.

Run:  python examples/seeded_jit_torchax.py
"""
# requires: torchax, jax

from __future__ import annotations

import numpy as np
import torch
import torchax
from torchax import interop

import devrng


def draws(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.dropout(x, 0.5, training=True)


def main() -> None:
    env = torchax.default_env()
    with env:
        x = torch.ones(4, 4, device="jax")

    def host(t: torch.Tensor) -> np.ndarray:
        return np.asarray(interop.jax_view(t))

    baked = interop.jax_jit(draws)
    print("interop.jax_jit, two calls, same mask:", np.array_equal(host(baked(x)), host(baked(x))))

    seeded = devrng.seeded_jit(draws, backend="torchax")
    a, b, c = host(seeded(x, seed=1)), host(seeded(x, seed=1)), host(seeded(x, seed=2))
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    print("seeded_jit: seed 1 twice equal, seed 2 different; compilations:", seeded.compile_count)
    assert seeded.compile_count == 1


if __name__ == "__main__":
    main()
