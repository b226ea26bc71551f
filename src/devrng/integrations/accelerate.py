"""accelerate: TrainingRNG in ``Accelerator.save_state`` / ``load_state``, per process.

accelerate's own ``save_state`` keeps, per process, Python's, NumPy's and torch's
CPU generator, the CUDA/XPU/... and XLA generators; it does not keep torchax's key,
``seeded_jit`` streams, ``RNGStreams``, or a DataLoader generator you created, and
objects registered with ``register_for_checkpointing`` are written by the main
process only. ``register`` registers one object that carries every process's
``devrng.TrainingRNG`` state; ``load_state`` restores it after
accelerate's own states, so devrng's is what the resumed run continues from.
"""

from __future__ import annotations

import accelerate

from devrng._training import TrainingRNG
from devrng.integrations._per_rank import PerRankState

__all__ = ["register"]


def register(accelerator: accelerate.Accelerator, rng: TrainingRNG | None = None, *,
             seed: int | None = None, strict: bool = True) -> TrainingRNG:
    """Make ``accelerator.save_state`` / ``load_state`` carry every process's ``TrainingRNG``.

    Args:
        accelerator: The ``accelerate.Accelerator`` of the run.
        rng: The ``devrng.TrainingRNG`` to carry; ``None`` makes one from ``seed``.
        seed: The seed of a new ``TrainingRNG`` (``None``: ``DEVRNG_SEED``, else
            drawn from OS entropy).
        strict: ``False`` resumes on another device count or world size with a
            warning (as ``TrainingRNG.load_state_dict(strict=False)``).

    Returns:
        The ``TrainingRNG``: use its ``dataloader_kwargs()`` and ``track()``.

    Examples:
        >>> import accelerate
        >>> from devrng.integrations.accelerate import register
        >>> rng = register(accelerate.Accelerator(cpu=True), seed=1234)
        >>> rng.seed
        1234
    """
    if rng is None:
        rng = TrainingRNG(seed)
    accelerator.register_for_checkpointing(_Registered(rng, strict))
    return rng


class _Registered(PerRankState):
    """What ``register_for_checkpointing`` stores (it needs only the two methods)."""

    def __init__(self, rng: TrainingRNG, strict: bool) -> None:
        super().__init__(rng, strict=strict, owner="devrng.integrations.accelerate")

    def __repr__(self) -> str:  # accelerate logs it by name
        return f"devrng TrainingRNG (seed {self.rng.seed})"
