"""Threefry-2x32 on XLA devices as one XLA computation, built once per shape.

torch_xla traces every tensor op in Python on every step (only compilation is
cached): the ~250 elementwise ops of the generator as tensor ops cost about
20 ms of tracing per draw. Built with torch_xla's XlaBuilder, the whole
generator is one node of the lazy graph (a few microseconds to trace) whose
body is the uint32 arithmetic itself; XLA fuses it into its graph like any
other op, with the key as runtime data. Loaded only for draws on XLA devices.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch_xla.core.xla_builder as xb

__all__ = ["xla_bits"]

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = 0x1BD11BDA
_built: dict[tuple[int, int], Callable[[list[torch.Tensor]], list[torch.Tensor]]] = {}


def _computation(numel: int, words: int) -> Callable[[list[torch.Tensor]], list[torch.Tensor]]:
    builder = xb.create_builder("devrng_threefry")
    key = xb.mkparam(builder, 0, xb.mkshape(xb.Type.S32, [2])).bitcast(xb.Type.U32)

    def const(value: int) -> Any:
        return xb.Op.scalar(builder, value, dtype=xb.Type.U32).broadcast([numel])

    def spread(scalar: Any) -> Any:
        return scalar.reshape([]).broadcast([numel])

    k0, k1 = key.slice([0], [1]), key.slice([1], [2])
    ks = (spread(k0), spread(k1), spread(k0 ^ k1) ^ const(_PARITY))
    x0 = ks[0]
    x1 = xb.Op.iota(builder, xb.Shape.create(xb.Type.U32, [numel]), 0) + ks[1]
    for group in range(5):
        for r in _ROTATIONS[group % 2]:
            x0 = x0 + x1
            # A logical right shift as unsigned division by a power of two (XLA turns it
            # back into a shift): plain op names, the same in every torch_xla.
            x1 = ((x1 << const(r)) | (x1 / const(1 << (32 - r)))) ^ x0
        x0 = x0 + ks[(group + 1) % 3]
        x1 = x1 + ks[(group + 2) % 3] + const(group + 1)
    outputs = [x0 ^ x1] if words == 1 else [x0, x1]
    root = xb.Op.tuple([o.bitcast(xb.Type.S32) for o in outputs])
    return xb.xla_computation_as_func(root.build("devrng_threefry"), "devrng_threefry")  # type: ignore[no-any-return]


def xla_bits(key: torch.Tensor, shape: tuple[int, ...], words: int) -> torch.Tensor:
    """``x0 ^ x1`` (words=1) or both words stacked (words=2) for counters 0..numel-1, as
    int32 bit patterns on ``key``'s XLA device (key: int32 [2] on that device)."""
    numel = 1
    for n in shape:
        numel *= int(n)
    if numel == 0:
        return torch.empty((words, *shape) if words == 2 else shape, dtype=torch.int32,
                           device=key.device)
    fn = _built.get((numel, words))
    if fn is None:
        fn = _built[(numel, words)] = _computation(numel, words)
    out = fn([key])
    if words == 1:
        return out[0].reshape(shape)
    return torch.stack(out).reshape(2, *shape)
