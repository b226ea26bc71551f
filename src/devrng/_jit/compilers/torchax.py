"""``backend="torchax"``: JAX jit through torchax with the PRNG key as an argument.

torchax's own ``interop.jax_jit`` (0.0.13) reads the environment's key while
tracing, so the key becomes a constant of the compiled program and every call
draws the same numbers. Here the key data is an argument of the jitted
function: inside the trace the environment's key is overridden with it. The
caller's key is never touched, and a new seed is new data, not a new program.
Nothing else leaves the program: a returned key (the advanced one) is one
more output to allocate and hand back on every call, for nobody.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torchax
from torchax import interop

from devrng._base.lazy import load
from devrng._base.seeds import seed_key
from devrng._jit.compilers.runner import seed_lock, seed_to_int

__all__ = ["TorchaxRunner", "make_runner"]

_cpu = torch.default_generator
_BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"
_compiles = 0  # XLA compilations JAX has reported in this process


def _on_duration(event: str, duration: float, **kwargs: Any) -> None:
    # The jitted object's _cache_size() counts dispatch-cache entries: a host and a
    # device argument of the same type make two entries for one compilation.
    # JAX reports each real backend compilation as this event.
    global _compiles
    if event == _BACKEND_COMPILE:
        _compiles += 1


jax.monitoring.register_event_duration_secs_listener(_on_duration)


def _key_data(seed: int | torch.Tensor) -> Any:
    """Threefry key data ``[hi, lo]`` for a seed, as ``devrng.manual_seed`` makes it."""
    if isinstance(seed, torchax.tensor.Tensor):
        # Stays on the device: split the seed into 32-bit halves with JAX ops.
        value = interop.jax_view(seed)
        if value.dtype.itemsize == 8:
            wide = value.astype(jnp.uint64)
            return jnp.stack([(wide >> 32).astype(jnp.uint32), wide.astype(jnp.uint32)])
        # Narrower ints: a negative one wraps to 64 bits as a CPU tensor(-1) does, so
        # its high word is all ones.
        negative = jnp.issubdtype(value.dtype, jnp.signedinteger) & (value < 0)
        high = jnp.where(negative, jnp.uint32(0xFFFFFFFF), jnp.uint32(0))
        return jnp.stack([high, value.astype(jnp.uint32)])
    return np.array(seed_key(seed_to_int(seed)), dtype=np.uint32)


class TorchaxRunner:
    """``jax.jit`` of ``fn`` whose random ops draw from a key passed in with each call."""

    def __init__(self, fn: Callable[..., Any], compile_kwargs: dict[str, Any]) -> None:
        kwargs = dict(compile_kwargs)
        # The key data is argument 0 of the jitted function: shift the user's positions.
        for name in ("static_argnums", "donate_argnums"):
            if name in kwargs:
                nums = kwargs[name]
                nums = (nums,) if isinstance(nums, int) else tuple(nums)
                kwargs[name] = tuple(n + 1 if n >= 0 else n for n in nums)
        self._fn = fn
        self._env = torchax.default_env()
        self._jit_kwargs = kwargs
        self._jitted = jax.jit(self._traced, **kwargs)
        # One more program per portable strictness, made on first use.
        self._portable_jitted: dict[bool, Any] = {}
        self._compiles = 0

    def _traced(self, key_data: Any, *args: Any, _portable: bool | None = None,
                **kwargs: Any) -> Any:
        env = self._env
        key = jax.random.wrap_key_data(key_data)
        t_args, t_kwargs = interop.torch_view((args, kwargs))
        # torchax's override_property does not pop its entry when the body raises;
        # cut the stack back to where it was whatever happens.
        stack = env._property.content
        depth = len(stack)
        stack.append(env.param.override(prng=key))
        try:
            with env:
                if _portable is None:
                    out = self._fn(*t_args, **t_kwargs)
                else:  # portable's mode on top of torchax's, so that it answers first
                    stream = load("devrng._portable.jax:traced_stream",
                                  what="devrng.portable on torchax")(key_data, _portable)
                    with stream:
                        out = self._fn(*t_args, **t_kwargs)
        finally:
            del stack[depth:]
        return interop.jax_view(out)

    def _jitted_for(self, portable: bool | None) -> Any:
        if portable is None:
            return self._jitted
        jitted = self._portable_jitted.get(portable)
        if jitted is None:
            jitted = self._portable_jitted[portable] = jax.jit(
                functools.partial(self._traced, _portable=portable), **self._jit_kwargs)
        return jitted

    @property
    def compile_count(self) -> int:
        return self._compiles

    def __call__(self, seed: int | torch.Tensor, args: tuple[Any, ...],
                 kwargs: dict[str, Any], portable: bool | None = None) -> Any:
        key_data = _key_data(seed)
        try:
            j_args, j_kwargs = interop.jax_view((args, kwargs))
        except AssertionError:  # torchax's bare assert on a tensor that is not its own
            _explain_inputs(args, kwargs)
            raise
        with seed_lock:  # tracing touches the CPU generator and JAX's compile counter
            cpu = _cpu.get_state()
            before = _compiles
            try:
                out = self._jitted_for(portable)(key_data, *j_args, **j_kwargs)
            finally:
                self._compiles += _compiles - before
                _cpu.set_state(cpu)  # tracing runs torch code, which may draw on the CPU
        return interop.torch_view(out)


def _explain_inputs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Raise a TypeError naming the first tensor that is not a torchax tensor."""
    from torch.utils._pytree import tree_leaves

    for leaf in tree_leaves((args, kwargs)):
        if isinstance(leaf, torch.Tensor) and not isinstance(leaf, torchax.tensor.Tensor):
            raise TypeError(
                f"seeded_jit(backend='torchax') got a {leaf.device.type} tensor of shape "
                f"{tuple(leaf.shape)}; it compiles functions of torchax tensors. Move the inputs "
                "first, as in: with torchax.default_env(): x = x.to('jax')  (or use "
                "backend='eager' / 'inductor' for CPU tensors)."
            )


def make_runner(fn: Callable[..., Any], compile_kwargs: dict[str, Any]) -> TorchaxRunner:
    return TorchaxRunner(fn, compile_kwargs)
