"""``manual_seed``: seed the CPU, every device type, Python and NumPy at once, all or nothing."""

from __future__ import annotations

import random
from typing import Any

from devrng._backends import host
from devrng._backends.registry import (
    Backend,
    available_backends,
    device_count,
    get_backend,
    is_initialized,
)
from devrng._base.errors import check_flags
from devrng._base.seeds import check_seed
from devrng._base.sigint import deliver, guard
from devrng._generators.plan import make_plan
from devrng._generators.undo import Undo, read_devices, read_started

__all__ = ["manual_seed", "reseed"]


@guard
def manual_seed(seed: int, *, devices: Any = None, device_type: Any = None, python: bool = True,
                numpy: bool = True) -> int:
    """Seed torch's CPU generator, every available device backend, Python and NumPy.

    Unlike ``torch.manual_seed`` this reaches XLA and torchax too. With
    ``devices`` / ``device_type`` only those device types are seeded (all
    devices of each). All or nothing: if seeding one generator fails, every
    generator seeded before it is put back; a Ctrl-C that arrives meanwhile is
    raised once everything is seeded.

    Args:
        seed: An int in ``[0, 2**64)``; all 64 bits reach every generator (torch's
            CPU generator too, which ``torch.manual_seed`` seeds from the low 32 only;
            below 2**32 it is seeded as ``torch.manual_seed(seed)`` seeds it).
        devices: Seed only the device types found here (every device of each).
        device_type: Seed only these device types (one or a sequence).
        python: Also seed Python's ``random``.
        numpy: Also seed NumPy's global generator.

    Returns:
        ``seed``, as an int.

    Raises:
        TypeError: ``seed`` is not an int, or a flag is not ``True`` / ``False``.
        ValueError: ``seed`` is outside ``[0, 2**64)``, or a device type does
            not exist here.
        DevRNGError: Seeding a generator failed; every generator is as it was.

    Examples:
        >>> devrng.manual_seed(1234)
        1234
    """
    try:
        seed = check_seed(seed)
        check_flags(python=python, numpy=numpy)
        backends = None if devices is None and device_type is None else [
            b for b, _ in make_plan(devices, device_type, caller="manual_seed", warn=False)]
        _seed_all(seed, backends, python=python, numpy=numpy)
    finally:
        deliver()
    return seed


def _seed_all(seed: int, backends: list[Backend] | None, *, python: bool, numpy: bool) -> None:
    """Seed ``backends`` (None: every available device backend), the CPU, and Python's and
    NumPy's generators if asked, with a checked ``seed``: all, or every one put back."""
    if backends is None:
        backends = [get_backend(name) for name in available_backends() if name != "cpu"]
    # Started devices are read first so that a failure can be undone; a device that
    # has not started is seeded last and never read (reading would start it).
    started = [b for b in backends if is_initialized(b)]
    with Undo(f"manual_seed({seed})") as undo:
        undo.save_devices(read_devices((b, range(device_count(b))) for b in started))
        undo.save_host(python=python, numpy=numpy)
        for backend in started:
            backend.manual_seed(seed)
        for backend in backends:
            if backend not in started:
                backend.manual_seed(seed)
        host.seed_cpu(seed)
        if python:
            random.seed(seed)
        if numpy:
            host.seed_numpy(seed)


def reseed(undo: Undo, seed: int) -> None:
    """``manual_seed(seed)`` as one step of a larger change: every started generator, and
    Python's and NumPy's, saved on ``undo`` first, so that the caller can put them back.
    ``seed`` was checked by the caller (``check_seed``), inside a guarded call.

    Examples:
        >>> undo = Undo("example")
        >>> reseed(undo, 3)
        >>> undo.run()       # every generator as before
    """
    undo.save_devices(read_started())
    undo.save_host(python=True, numpy=True)
    _seed_all(seed, None, python=True, numpy=True)
