"""Portable draws on torchax tensors: ``jax.random`` with the stream's key.

torchax runs torch ops as JAX ops, and JAX without x64 has no 64-bit
integers, so the int64 arithmetic of ``devrng._portable.threefry`` and ``distributions``
would silently run in 32 bits there. JAX's own ``jax.random`` computes exactly the numbers
those modules are built to equal (same key, same layout), so on torchax the bits,
uniforms, integers and permutations come from it directly; the transforms
built on top of them (normal's erfinv, exponential, bernoulli, multinomial)
are the same torch code, run by torchax as JAX ops.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import torch
from torchax import interop

from devrng._base.errors import DevRNGError
from devrng._portable import devices, distributions
from devrng._portable.distributions import Source
from devrng._portable.rng import FLOAT64_CASTS, PortableRNG
from devrng._portable.threefry import HostKey

__all__ = ["JAX_OPS", "JaxSource", "JaxStream", "key_data", "refuse_float64", "traced_stream"]

_JNP = {torch.float32: jnp.float32, torch.float16: jnp.float16, torch.bfloat16: jnp.bfloat16,
        torch.float64: jnp.float64, torch.int32: jnp.int32, torch.int64: jnp.int64}
JAX_OPS = distributions.Ops(jnp, lambda x, dtype: x.astype(_JNP[dtype]))


def key_data(key: HostKey) -> Any:
    """Host key words as JAX key data (``uint32[2]``)."""
    return jnp.array(key, dtype=jnp.uint32)


def _check_float64(dtype: torch.dtype) -> None:
    if dtype == torch.float64 and not jax.config.jax_enable_x64:
        raise DevRNGError(
            "devrng.portable cannot draw float64 numbers on torchax while JAX has no 64-bit "
            "floats: JAX would make float32 numbers instead, not the float64 draws of every "
            "other device. Call jax.config.update('jax_enable_x64', True) before drawing, or "
            "draw float32.")


def refuse_float64(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Refuse a call inside portable that would make a float64 torchax tensor while JAX has no
    64-bit floats: torchax would make it float32, silently, and every later draw into it
    would be float32 numbers, not the float64 draws of other devices (which the docs promise
    to refuse). Tensors made float32 so outside the portable block cannot be told apart."""
    if jax.config.jax_enable_x64:
        return
    dtype = kwargs.get("dtype") or next((a for a in args if isinstance(a, torch.dtype)), None)
    tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
    if dtype is None and func in FLOAT64_CASTS and tensors:
        dtype = torch.float64 if func is torch.Tensor.double else tensors[0].dtype
    if dtype is not torch.float64:
        return
    named = [torch.device(d) for d in (kwargs.get("device"), *args)
             if isinstance(d, (str, torch.device)) and not isinstance(d, torch.dtype)]
    on_jax = (devices.row(named[0]) is devices.TORCHAX if named
              else any(devices.row(t.device) is devices.TORCHAX for t in tensors))
    if on_jax:
        name = torch.overrides.resolve_name(func) or repr(func)
        raise DevRNGError(
            f"{name} would make a float64 torchax tensor, which torchax makes float32 while "
            f"JAX has no 64-bit floats: draws into it would be float32 numbers, not the float64 "
            f"draws of every other device. Call jax.config.update('jax_enable_x64', True) "
            f"before making it, or make it float32.")


class JaxSource(Source):
    """``Source`` whose numbers come from ``jax.random`` (``key``: host words or key data)."""

    __slots__ = ("jax_key",)

    def __init__(self, key: HostKey | Any, device: torch.device,
                 counters: torch.Tensor | None = None) -> None:
        if counters is not None:
            raise DevRNGError("devrng.portable does not draw shards of DTensors on torchax.")
        data = key_data(key) if isinstance(key, tuple) else key
        super().__init__(key, device)
        self.jax_key = jax.random.wrap_key_data(data)

    def _with_key(self, key: Any) -> JaxSource:
        return JaxSource(jax.random.key_data(key), self.device)

    def split(self, i: int) -> JaxSource:
        return self._with_key(jax.random.fold_in(self.jax_key, i))

    def bits(self, shape: Sequence[int]) -> torch.Tensor:
        raw = jax.random.bits(self.jax_key, tuple(shape), jnp.uint32)
        return interop.torch_view(jax.lax.bitcast_convert_type(raw, jnp.int32))  # type: ignore[no-any-return]

    def words(self, shape: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        raise DevRNGError("This draw needs 64-bit integers, which JAX (so torchax) has only with "
                          "jax.config.update('jax_enable_x64', True).")

    def unit_float32(self, shape: Sequence[int]) -> torch.Tensor:
        return self.unit(shape, torch.float32)

    def unit(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        return interop.torch_view(self._unit(shape, dtype))  # type: ignore[no-any-return]

    def _unit(self, shape: Sequence[int], dtype: torch.dtype) -> Any:
        _check_float64(dtype)  # every float64 draw starts here, or in normal or exponential
        return jax.random.uniform(self.jax_key, tuple(shape), _JNP[dtype])

    def uniform(self, shape: Sequence[int], dtype: torch.dtype, low: float = 0.0,
                high: float = 1.0) -> torch.Tensor:
        # JAX's unit draw, then the bounds as every device applies them (distributions.scale_shift,
        # here in JAX: torchax's float64 tensor ops round through float32). Not JAX's own
        # u * span + lo, which XLA may or may not fuse, and rounds bfloat16 products first.
        values = self._unit(shape, dtype)
        if low != 0.0 or high != 1.0:
            lo, span = distributions.bounds(low, high, dtype, devices.TORCHAX)
            values = distributions.scale_shift(values, lo, span, dtype, False, JAX_OPS,
                                               flushes=devices.TORCHAX.flushes_subnormals)
        return interop.torch_view(values)  # type: ignore[no-any-return]

    # float64 normal and exponential draws in JAX itself: torchax 0.0.13 multiplies float64
    # tensors in float32, which would round their scaling to float32 precision.
    def normal(self, shape: Sequence[int], dtype: torch.dtype, mean: float = 0.0,
               std: float = 1.0) -> torch.Tensor:
        if dtype != torch.float64:
            return super().normal(shape, dtype, mean, std)
        _check_float64(dtype)
        values = jax.random.normal(self.jax_key, tuple(shape), jnp.float64)
        return interop.torch_view(values * std + mean)  # type: ignore[no-any-return]

    def exponential(self, shape: Sequence[int], dtype: torch.dtype,
                    lambd: float = 1.0) -> torch.Tensor:
        if dtype != torch.float64:
            return super().exponential(shape, dtype, lambd)
        _check_float64(dtype)
        values = jax.random.exponential(self.jax_key, tuple(shape), jnp.float64)
        return interop.torch_view(values / lambd)  # type: ignore[no-any-return]

    def randint(self, shape: Sequence[int], low: int, high: int,
                dtype: torch.dtype) -> torch.Tensor:
        if not (low >= -(1 << 31) and high <= (1 << 31) - 1):
            raise DevRNGError(f"On torchax devrng.portable draws integers within int32; "
                              f"[{low}, {high}) is wider.")
        values = jax.random.randint(self.jax_key, tuple(shape), low, high, jnp.int32)
        return interop.torch_view(values).to(dtype)  # type: ignore[no-any-return]

    def randperm(self, n: int, dtype: torch.dtype) -> torch.Tensor:
        return interop.torch_view(jax.random.permutation(self.jax_key, n)).to(dtype)  # type: ignore[no-any-return]

    def search(self, scan: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        # torchax lowers searchsorted for 1-D sequences only; count the sums at or below
        # each target instead (the same index: the sums never decrease).
        return (scan.unsqueeze(1) <= target.unsqueeze(-1)).sum(-1)


class JaxStream:
    """A stream inside one jitted call: the base key is the call's key data (a traced
    argument), the counter a Python int the trace fixes (each call draws from 0)."""

    def __init__(self, base_key_data: Any) -> None:
        self.base = jax.random.wrap_key_data(base_key_data)
        self.counter = 0

    def get(self) -> tuple[int, int]:
        raise DevRNGError("A traced portable stream has no host seed to read.")

    def set(self, seed: int, counter: int) -> None:
        raise DevRNGError("A traced portable stream cannot be loaded.")

    def next_key(self, device: torch.device) -> Any:
        if devices.row(device) is not devices.TORCHAX:  # its keys are JAX key data
            raise DevRNGError(f"Inside seeded_jit(backend='torchax') portable draws on torchax "
                              f"tensors; this op draws on {device}.")
        key = jax.random.fold_in(self.base, self.counter)
        self.counter += 1
        return jax.random.key_data(key)


def traced_stream(key_data: Any, strict: bool) -> PortableRNG:
    """The portable stream of one jitted torchax call, from the call's key data."""
    return PortableRNG(0, strict, stream=JaxStream(key_data))
