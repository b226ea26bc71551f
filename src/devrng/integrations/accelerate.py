"""accelerate: TrainingRNG in ``Accelerator.save_state`` / ``load_state``, per process.

accelerate's own ``save_state`` keeps, per process, Python's, NumPy's and torch's CPU
generator, the CUDA/XPU/... and XLA generators; it does not keep torchax's key,
``seeded_jit`` streams, ``RNGStreams``, or a DataLoader generator you created, and
objects registered with ``register_for_checkpointing`` are written by the main
process only. ``register`` registers one object that carries every process's
``devrng.TrainingRNG`` state; ``load_state`` restores it after
accelerate's own states, so devrng's is what the resumed run continues from.

A checkpoint written inside an epoch's loop cannot be resumed exactly with
accelerate 1.15 (measured): ``skip_first_batches`` starts the epoch again with a
new shuffle, and a loader prepared with ``use_stateful_dataloader=True`` does not
come back at its saved place. ``load_state`` then warns (``DevRNGWarning``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import accelerate

from devrng._loaders import describe, position_problem, warn_on_resume
from devrng._rank import process_rank
from devrng._training import TrainingRNG
from devrng.integrations._per_rank import PerRankState

__all__ = ["register"]


def register(accelerator: accelerate.Accelerator, rng: TrainingRNG | None = None, *,
             seed: int | None = None, strict: bool = True) -> TrainingRNG:
    """Make ``accelerator.save_state`` / ``load_state`` carry every process's ``TrainingRNG``.

    A new ``TrainingRNG`` seeds at once: call this before building the model.
    ``load_state`` warns (``DevRNGWarning``) when the resumed run cannot be bitwise
    the uninterrupted one: a state saved inside an epoch's loop, a loader prepared
    with ``use_stateful_dataloader=True``, and what the ``TrainingRNG`` finds for
    the loaders it tracks (``rng.track("loader", loader)``: another batch size or
    number of workers, workers kept across epochs).

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
    accelerator.register_for_checkpointing(_Registered(rng, strict, accelerator.gradient_state))
    return rng


class _Registered(PerRankState):
    """What ``register_for_checkpointing`` stores (it needs only the two methods)."""

    def __init__(self, rng: TrainingRNG, strict: bool, gradient_state: Any) -> None:
        super().__init__(rng, strict=strict, owner="devrng.integrations.accelerate",
                         lenient="register(accelerator, strict=False)")
        self.gradient_state = gradient_state  # tells which prepared loader is being iterated

    def __repr__(self) -> str:  # accelerate logs it by name
        return f"devrng TrainingRNG (seed {self.rng.seed})"

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        active = self.gradient_state.active_dataloader if self.gradient_state.in_dataloader \
            else None
        state["inside_epoch"] = None if active is None else describe(active)
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        warn_on_resume(_problems(state_dict), stacklevel=2)


def _problems(saved: Mapping[str, Any]) -> Iterable[str]:
    """What accelerate cannot resume exactly, from what ``_Registered.state_dict`` saved."""
    inside = saved.get("inside_epoch")
    if isinstance(inside, Mapping):
        if inside.get("stateful"):
            yield ("the checkpoint was written inside an epoch's loop, and a loader prepared "
                   "with use_stateful_dataloader=True does not come back at its saved place in "
                   f"accelerate {accelerate.__version__} (measured: it yields other batches); "
                   "checkpoint after the epoch's loop")
        else:
            yield position_problem("the loader", str(inside.get("kind")),
                                   "in its loop over the loader",
                                   "accelerate's skip_first_batches starts the epoch again")
    ranks = saved.get("ranks")
    rank = process_rank()
    own = ranks[rank] if isinstance(ranks, list) and rank < len(ranks) else None
    records = own.get("loaders") if isinstance(own, Mapping) else None
    for name, record in (records.items() if isinstance(records, Mapping) else ()):
        if isinstance(record, Mapping) and record.get("stateful") \
                and not isinstance(inside, Mapping):
            yield (f"the loader {name!r} was prepared with use_stateful_dataloader=True, which "
                   f"in accelerate {accelerate.__version__} does not resume the next epoch's "
                   "shuffle either (measured, with or without devrng); prepare a plain "
                   "DataLoader and checkpoint after the epoch's loop")
