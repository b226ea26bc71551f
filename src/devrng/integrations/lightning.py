"""Lightning: a ``Callback`` that seeds the run and makes its checkpoints resume bitwise.

Lightning's checkpoints hold no random state (measured with Lightning 2.6.6: the
resumed epoch after ``fit(ckpt_path=...)`` draws different shuffles, worker
augmentations and dropout masks). ``DevRNGCallback`` keeps a
``devrng.TrainingRNG`` in the checkpoint, one state per rank, and
puts it back when the resumed run starts training.
"""

from __future__ import annotations

import os
from typing import Any

import lightning.pytorch as pl
import torch

from devrng._training import TrainingRNG
from devrng.integrations._per_rank import PerRankState

__all__ = ["DevRNGCallback"]


class DevRNGCallback(pl.Callback):
    """Seed a Lightning run at setup and resume it exactly from its checkpoints.

    At ``setup`` it seeds like ``lightning.seed_everything(seed, workers=True)``
    (the same draws for the same seed; ``seed=None`` takes ``DEVRNG_SEED``, then
    ``PL_GLOBAL_SEED``), and every device type Lightning does not reach (XLA,
    torchax); DataLoader workers are seeded by Lightning's own worker seeding.
    Each checkpoint holds every rank's ``devrng.TrainingRNG`` state;
    ``fit(ckpt_path=...)`` puts this rank's back as Lightning restores the
    callbacks, before it builds the resumed epoch's DataLoader iterator.

    Args:
        seed: The run's seed; ``None`` takes ``DEVRNG_SEED``, then
            ``PL_GLOBAL_SEED``, else draws one.
        deterministic: Also apply ``devrng.deterministic()``.
        per_rank: Seed each rank with its own ``devrng.distributed.rank_seed``.
        strict: ``False`` resumes on another device count or world size with a
            warning (as ``TrainingRNG.load_state_dict(strict=False)``).

    Examples:
        >>> from devrng.integrations.lightning import DevRNGCallback
        >>> callback = DevRNGCallback(seed=1234)
        >>> callback.state_key
        'DevRNGCallback'
    """

    def __init__(self, seed: int | None = None, *, deterministic: bool = False,
                 per_rank: bool = False, strict: bool = True) -> None:
        self.seed = seed
        self.deterministic = deterministic
        self.per_rank = per_rank
        self.strict = strict
        self.rng: TrainingRNG | None = None
        self._restored_cpu: torch.Tensor | None = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._ensure_rng()

    def _ensure_rng(self) -> TrainingRNG:
        if self.rng is None:
            self.rng = TrainingRNG(self.seed, deterministic=self.deterministic,
                                   per_rank=self.per_rank)
            # What seed_everything(seed, workers=True) leaves for Lightning's own code: spawned
            # processes reseed from PL_GLOBAL_SEED, and the loaders it builds get its worker
            # seeding (distinct per worker and rank, from the loader's base seed).
            os.environ["PL_GLOBAL_SEED"] = str(self.rng.seed)
            os.environ["PL_SEED_WORKERS"] = "1"
        return self.rng

    # -- checkpoints: every rank's state, in the one file rank 0 writes
    def state_dict(self) -> dict[str, Any]:
        return {} if self.rng is None else self._per_rank().state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict:  # empty: saved before setup ran, nothing to put back
            self._per_rank().load_state_dict(state_dict)
            self._restored_cpu = torch.get_rng_state()

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        cpu, self._restored_cpu = self._restored_cpu, None
        if cpu is not None and getattr(trainer.fit_loop, "restarted_mid_epoch", False):
            # Resuming in the middle of an epoch, Lightning builds the loader's iterator after
            # the restore, and it draws the epoch's base seed from torch's generator (which a
            # StatefulDataLoader then replaces with the saved one): undo that draw.
            torch.set_rng_state(cpu)

    def _per_rank(self) -> PerRankState:
        return PerRankState(self._ensure_rng(), strict=self.strict, owner="DevRNGCallback")
