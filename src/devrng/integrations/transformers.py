"""HF transformers: activation checkpointing on XLA, and devrng's seeding for ``Trainer``.

``model.gradient_checkpointing_enable()`` runs ``torch.utils.checkpoint``, which
looks up ``torch.xla`` to save and restore the device's RNG state; torch has no
such module, so on XLA it fails with ``AttributeError: module 'torch' has no
attribute 'xla'`` (both ``use_reentrant`` values, measured with transformers 5.23
and torch_xla 2.9). ``devrng.patch_torch`` gives torch that module,
and the checkpointed gradients equal the plain ones bitwise. ``DevRNGTrainerCallback``
does that for ``Trainer`` users, and seeds what the Trainer's ``set_seed`` does not
reach (torchax's key).
"""

from __future__ import annotations

from typing import Any

import transformers

from devrng._fork import fork_rng
from devrng._patch import patch_torch
from devrng._registry import available_backends
from devrng._seeding import manual_seed

__all__ = ["DevRNGTrainerCallback"]


class DevRNGTrainerCallback(transformers.TrainerCallback):
    """Make a ``transformers.Trainer`` device-correct: ``patch_torch()`` and full seeding.

    When the Trainer is built it calls ``devrng.patch_torch``, so
    ``gradient_checkpointing=True`` works on XLA and torchax and recomputes the
    same dropout masks. When training begins it seeds every device type
    available (XLA and torchax included) with ``args.seed``, as the Trainer's
    ``set_seed`` seeds the CPU, CUDA, Python and NumPy.

    Examples:
        >>> from devrng.integrations.transformers import DevRNGTrainerCallback
        >>> callback = DevRNGTrainerCallback()   # Trainer(..., callbacks=[callback])
    """

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        patch_torch()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        patch_torch()  # idempotent: picks up a device package imported since
        devices = [name for name in available_backends() if name != "cpu"]
        if devices and state.global_step == 0:  # a resumed run keeps the Trainer's restored state
            with fork_rng(devices=[]):  # the Trainer seeded the CPU itself: leave it as it is
                manual_seed(int(args.seed), device_type=devices, python=False, numpy=False)
