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
new shuffle, a loader prepared with ``use_stateful_dataloader=True`` does not
come back at its saved place, and under gradient accumulation the gradient
accumulated since the last optimizer step is not saved. ``load_state`` then warns
(``DevRNGWarning``).

A prepared loader counts its epochs (``iteration``; a seedable sampler,
``use_seedable_sampler=True``, shuffles by it), and ``save_state`` does not keep
the count for a map-style dataset: a resumed run would shuffle its next epoch as
the first. The registered state keeps each tracked loader's count and
``load_state`` puts it back.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping
from typing import Any

import accelerate
import torch

from devrng._base.errors import short_repr
from devrng._base.rank import process_rank
from devrng._checks.record import FLIGHT_VARIABLE, FlightRecord
from devrng._generators.saved import SavedForm
from devrng._training.loaders import describe, position_problem, warn_on_resume
from devrng._training.training_rng import TrainingRNG, start_flight_record, tracked_loaders
from devrng.integrations._per_rank import PerRankState, check_entry, seal_entry

__all__ = ["register"]


def register(accelerator: accelerate.Accelerator, rng: TrainingRNG | None = None, *,
             seed: int | None = None, strict: bool = True,
             flight_record: str | os.PathLike[str] | bool = True) -> TrainingRNG:
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
        flight_record: Keep the run's flight record in this directory; ``True`` (the
            default): the accelerator's ``project_dir``, else the current directory;
            ``False``: none. Each training-mode forward of a prepared model is a batch
            its step consumes; a resumed run compares its steps with the interrupted
            run's and warns at the first that differs.

    Returns:
        The ``TrainingRNG``: use its ``dataloader_kwargs()`` and ``track()``.

    Examples:
        >>> import accelerate
        >>> from devrng.integrations.accelerate import register
        >>> rng = register(accelerate.Accelerator(cpu=True), seed=1234)
        >>> rng.seed
        1234
    """
    if not isinstance(flight_record, (bool, str, os.PathLike)):
        raise TypeError(f"register(..., flight_record=...) takes a directory, True (the "
                        f"project_dir) or False, not {short_repr(flight_record)}.")
    if rng is None:
        rng = TrainingRNG(seed)
    if flight_record is not False or os.environ.get(FLIGHT_VARIABLE):
        where = (getattr(accelerator, "project_dir", None) or os.getcwd()) \
            if flight_record in (True, False) else os.fspath(flight_record)  # type: ignore[arg-type]
        _watch_models(accelerator, start_flight_record(rng, where, hooked=True))
    accelerator.register_for_checkpointing(_Registered(rng, strict, accelerator.gradient_state))
    return rng


def _watch_models(accelerator: accelerate.Accelerator, flight: FlightRecord) -> None:
    """Have the flight record see the forward passes of every model ``accelerator`` prepares
    and count the steps of its optimizers (those prepared already, and, through its
    ``prepare``, those to come)."""
    seen: set[int] = set()

    def watch(objects: Iterable[Any]) -> None:
        for obj in objects:
            if isinstance(obj, torch.nn.Module) and id(obj) not in seen:
                seen.add(id(obj))
                flight.watch_model(obj)
            elif isinstance(obj, torch.optim.Optimizer):
                flight.watch_optimizer(obj)

    watch([*getattr(accelerator, "_models", ()), *getattr(accelerator, "_optimizers", ())])
    prepare = accelerator.prepare

    @functools.wraps(prepare)
    def prepare_and_watch(*args: Any, **kwargs: Any) -> Any:
        prepared = prepare(*args, **kwargs)
        watch(prepared if isinstance(prepared, tuple) else (prepared,))
        return prepared

    accelerator.prepare = prepare_and_watch  # type: ignore[method-assign]


# What register_for_checkpointing saves (custom_checkpoint_<i>.pkl), sealed whole: every
# rank's state, the loader whose loop a save is inside, the accumulation window, the
# loaders' epoch counts (devrng 0.4.0 wrote these keys alone, unsealed).
_FORM = SavedForm("devrng.accelerate", (1,), 1, "devrng.integrations.accelerate",
                  "register(accelerator)'s checkpointed object", own=("ranks",))
_KEYS = frozenset({"ranks", "inside_epoch", "accumulating", "epochs"})


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
        gradients = self.gradient_state
        active = gradients.active_dataloader if gradients.in_dataloader else None
        state["inside_epoch"] = None if active is None else describe(active)
        # Batches whose gradient is accumulated and not yet applied (save_state keeps no .grad)
        state["accumulating"] = gradients.num_steps if gradients.num_steps > 1 \
            and not gradients.sync_gradients else None
        state["epochs"] = {name: loader.iteration
                           for name, loader in tracked_loaders(self.rng).items()
                           if _counts_epochs(loader)}
        return seal_entry(_FORM, state)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        check_entry(state_dict, _FORM, _KEYS)  # all of it, before any of it is used
        super().load_state_dict(state_dict)
        epochs = state_dict.get("epochs")
        loaders = tracked_loaders(self.rng)
        for name, epoch in (epochs.items() if isinstance(epochs, Mapping) else ()):
            if _counts_epochs(loaders.get(name)) and type(epoch) is int and epoch >= 0:
                loaders[name].set_epoch(epoch)  # the count the next epoch shuffles by
        warn_on_resume(_problems(state_dict), flight=self.rng.flight, stacklevel=2)


def _counts_epochs(loader: Any) -> bool:
    """Whether ``loader`` is a prepared loader that counts its epochs (``iteration``)."""
    return type(getattr(loader, "iteration", None)) is int \
        and callable(getattr(loader, "set_epoch", None))


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
    steps = saved.get("accumulating")
    if type(steps) is int:
        yield (f"the checkpoint was written inside a window of gradient_accumulation_steps="
               f"{steps}: the gradient accumulated since the last optimizer step is not in it "
               "(save_state keeps weights and optimizer state, not .grad), so the first "
               "optimizer step after the resume differs; save right after an optimizer step "
               "(when accelerator.sync_gradients is True)")
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
