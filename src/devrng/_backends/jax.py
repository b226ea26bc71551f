"""torchax tensors (device type ``jax``): the environment's JAX PRNG key.

torchax draws every random op from ``env.param.prng`` and rotates it. The
state devrng hands out is the key's raw data as a CPU int64 tensor (so it can
be saved, compared and broadcast like any other state) plus whether the key is
a typed JAX key or a legacy uint32 key, so the same kind is put back.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import torch
import torchax

from devrng._base.seeds import seed_key

__all__ = ["JaxBackend", "backend"]


class JaxBackend:
    """The PRNG key of torchax's default environment; one stream, index 0.

    Examples:
        >>> import torchax
        >>> sorted(devrng.get_backend("jax").get_rng_state(0))
        ['key', 'typed']
    """

    name = "jax"

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return torchax.env is not None  # the default environment exists once used

    def device_count(self) -> int:
        return 1

    def current_device(self) -> int:
        return 0

    def get_rng_state(self, index: int = 0) -> dict[str, Any]:
        key = torchax.default_env().param.prng
        typed = jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)
        data = jax.random.key_data(key) if typed else key
        return {"key": torch.from_numpy(np.asarray(data).astype(np.int64)), "typed": typed}

    def set_rng_state(self, state: dict[str, Any], index: int = 0) -> None:
        data = np.asarray(state["key"].numpy(), dtype=np.uint32)
        key = jax.random.wrap_key_data(data) if state["typed"] else jax.numpy.asarray(data)
        torchax.default_env().param.prng = key

    def manual_seed(self, seed: int) -> None:
        # The full 64-bit seed as threefry key data (what jax.random.key gives with
        # 64-bit ints enabled), set in place: env.manual_seed pushes a new
        # override on every call and takes only 63 bits.
        data = np.array(seed_key(seed), dtype=np.uint32)
        torchax.default_env().param.prng = jax.random.wrap_key_data(data)

    # -- state encoding (optional members): torch's RNG sites carry one tensor, so
    # the key data comes first and the last element says whether the key is typed.
    def state_to_tensor(self, state: dict[str, Any]) -> torch.Tensor:
        key = state["key"].detach().cpu().to(torch.int64).flatten()
        return torch.cat([key, torch.tensor([int(bool(state["typed"]))], dtype=torch.int64)])

    def tensor_to_state(self, tensor: torch.Tensor) -> dict[str, Any]:
        if (not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.int64
                or tensor.dim() != 1 or tensor.numel() < 2):
            got = (f"a {tensor.dtype} tensor of shape {tuple(tensor.shape)}"
                   if isinstance(tensor, torch.Tensor) else f"{tensor!r} (a {type(tensor).__name__})")
            raise TypeError(
                f"torch.jax.set_rng_state got {got}; it accepts the 1-D int64 tensor that "
                "get_rng_state() returns (the key data followed by a typed-key flag)."
            )
        t = tensor.detach().cpu()
        return {"key": t[:-1].clone(), "typed": bool(t[-1].item())}


backend = JaxBackend()
