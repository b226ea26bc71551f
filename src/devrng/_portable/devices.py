"""Which code draws a portable number on which device: one row per device type.

Every choice in ``devrng._portable`` that depends on the output device reads the
device's row here (``row(device)``) instead of testing ``device.type`` itself
(``tests/test_layering.py`` keeps it so). In short:

| device | the key | the bits | inside ``torch.compile`` |
|---|---|---|---|
| ``cpu`` | host ints, handed to the fused C kernel (``threefry_cpu``); an int32 tensor where the kernel cannot run | the kernel's one pass (tensor ops without it) | ``devrng::bits`` reads the key back to host ints and runs the kernel |
| ``xla`` | an int32 tensor copied to the device (under ``seeded_jit``: the call's key, ``rng.TracedStream``) | one prebuilt XLA computation (``threefry_xla``); tensor ops for a shard | refused (``compile_error``) |
| ``jax`` (torchax) | JAX key data (under ``seeded_jit``: the call's key, ``jax.JaxStream``) | ``jax.random`` itself (``devrng._portable.jax.JaxSource``) | not a torchax path (torchax compiles with ``jax.jit``) |
| any other (``cuda``, ``xpu``, ``meta``, ...) | an int32 tensor copied to the device | the Threefry rounds as tensor ops on the device | ``devrng::bits``, one opaque op running those tensor ops |

Eager draws take the key as host ints everywhere (the stream folds it in with Python
ints); compiled code reads it from ``devrng::next_key`` as a tensor on the device. Three
facts of arithmetic complete the rows: MPS and JAX draw as the others but without float64
(``Device.float64``), XLA's ``>>`` is a division (``Device.shift_divides``), and XLA and
JAX flush subnormal numbers to zero (``Device.flushes_subnormals``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["CPU", "DEVICES", "OTHER", "TORCHAX", "XLA", "Device", "row"]


class Device(NamedTuple):
    """How portable draws run on one device type.

    Attributes:
        name: The device as messages name it.
        host_memory: Its tensors are this process's memory: an eager draw fills
            them with the fused C kernel straight from the key's host ints, and
            op handlers may read argument values (``normal``'s std) without
            waiting on a device.
        source: ``"module:attr"`` of the ``Source`` class that draws there, loaded
            on first use; ``None``: ``devrng._portable.distributions.Source``.
        whole_draw: ``"module:attr"`` of ``f(key, shape, words)`` that makes a
            whole draw's bits (no shard counters) in one piece, loaded on first
            use; ``None``: the Threefry rounds as tensor ops.
        extra: devrng's pip extra that installs what ``source`` or ``whole_draw``
            imports.
        compile_error: The sentence that refuses a draw traced by ``torch.compile``
            on this device; ``None``: such draws read their key from
            ``devrng::next_key``.
        float64: float64 arithmetic is there to lean on (``distributions.affine``
            rounds once through it, ``distributions.scale_shift`` makes float32
            products exact in it, ``distributions.sqrt32`` corrects the device's root
            in it). MPS has none, JAX only with x64 (and XLA's fused multiply-add
            and square root need no correction).
        shift_divides: torch's ``>>`` is a division there, which rounds negative
            values towards zero (``threefry.shr`` shifts the sign bit apart).
        flushes_subnormals: float32, bfloat16 and float64 numbers below the smallest
            normal one become zero there (XLA and JAX on the CPU, measured; float16 ones
            are kept): bounded uniforms that would reach them are refused
            (``distributions.bounds``).
    """

    name: str
    host_memory: bool = False
    source: str | None = None
    whole_draw: str | None = None
    extra: str | None = None
    compile_error: str | None = None
    float64: bool = True
    shift_divides: bool = False
    flushes_subnormals: bool = False


CPU = Device("the CPU", host_memory=True)
XLA = Device(
    "XLA", whole_draw="devrng._portable.threefry_xla:xla_bits", extra="xla", shift_divides=True,
    flushes_subnormals=True,
    compile_error=(
        "devrng.portable cannot draw inside torch.compile(backend='openxla'): XLA's "
        "bridge would keep the first step's key. Use devrng.seeded_jit(fn, "
        "backend='openxla') inside portable, or torch_xla.compile."))
TORCHAX = Device("torchax", source="devrng._portable.jax:JaxSource", extra="torchax",
                 float64=False, flushes_subnormals=True)
OTHER = Device("another device")  # cuda, xpu, privateuse1 devices, meta, ...

DEVICES = {"cpu": CPU, "xla": XLA, "jax": TORCHAX, "mps": Device("MPS", float64=False)}


def row(device: torch.device) -> Device:
    """The row of ``device``'s type (``OTHER`` for a type the table does not name).

    Examples:
        >>> row(torch.device("cpu")).host_memory, row(torch.device("cuda", 1)) is OTHER
        (True, True)
    """
    return DEVICES.get(device.type, OTHER)
