"""Lightning: a ``Callback`` that seeds the run and makes its checkpoints resume bitwise, or says why not.

Lightning's checkpoints hold no random state (measured with Lightning 2.6.6: the
resumed epoch after ``fit(ckpt_path=...)`` draws different shuffles, worker
augmentations and dropout masks). ``DevRNGCallback`` keeps a
``devrng.TrainingRNG`` in the checkpoint, one state per rank, and puts it back
when the resumed run starts training. What a generator state cannot carry -- a
loader that cannot restore its place in an epoch, workers kept across epochs,
another batch size -- it names in a ``DevRNGWarning`` when the run resumes.

Lightning builds the loaders after it restored the callbacks, and makes their first
iterator at once, before any callback hook: a resumed run's first epoch draws its
shuffle from the generators as restored. A loader's own generator must therefore
exist, restored, before Lightning builds the loader: that is why the loaders take
``callback.rng.dataloader_kwargs()`` made when the callback is.
"""

from __future__ import annotations

import logging
import math
import os
import weakref
from collections.abc import Iterable, Mapping
from typing import Any

import lightning.pytorch as pl
import torch

from devrng._base.errors import DevRNGError, check_flags, short_repr
from devrng._base.rank import process_rank
from devrng._base.seeds import seed32
from devrng._checks.record import FLIGHT_VARIABLE
from devrng._generators.saved import SavedForm
from devrng._generators.seeding import manual_seed
from devrng._generators.snapshot import get_rng_state, set_rng_state
from devrng._generators.undo import Undo
from devrng._training.loaders import (
    EpochStart,
    EpochStarts,
    describe,
    differences,
    inside_epoch_problem,
    out_of_order_problem,
    persistent_workers_problem,
    position_problem,
    private_shuffle_problem,
    replays_sampler,
    unreplayable_problem,
    warn_on_resume,
    worker_count_problem,
)
from devrng._training.training_rng import (
    TrainingRNG,
    generator_states,
    set_generator_states,
    start_flight_record,
)
from devrng._training.workers import WorkerSeeding
from devrng.distributed import rank_seed
from devrng.integrations._per_rank import PerRankState, check_entry, gather, seal_entry

__all__ = ["DevRNGCallback"]

# The callback's entry in a checkpoint, sealed whole (every rank's state, the loaders'
# descriptions, the place in the epoch, the epoch starts): its digest is checked before any
# of it is used (devrng 0.4.0 wrote these keys alone, unsealed).
_FORM = SavedForm("devrng.DevRNGCallback", (1,), 1, "DevRNGCallback",
                  "DevRNGCallback.state_dict()", own=("ranks",))
_KEYS = frozenset({"ranks", "loaders", "position"})
_OPTIONAL = frozenset({"epoch_starts"})

#: Say in a sentence why a resume inside an epoch failed when a training loader has another
#: number of workers (torchdata's empty assertion, then Lightning's teardown error, hide it).
_FIX_WORKER_COUNT = True


class DevRNGCallback(pl.Callback):
    """Seed a Lightning run when created, and resume it exactly from its checkpoints.

    Creating the callback seeds like ``lightning.seed_everything(seed,
    workers=True)`` (the same draws for the same seed), plus every device type
    Lightning does not reach (XLA, torchax): create it before the model, so that
    the initial weights are seeded too. ``callback.rng`` is its
    ``devrng.TrainingRNG``; pass ``**callback.rng.dataloader_kwargs()`` (made
    once, before ``fit``) to a torchdata ``StatefulDataLoader`` or a loader with
    ``persistent_workers=True``. Each checkpoint holds every rank's state and a
    description of the loaders; ``fit(ckpt_path=...)`` puts this rank's state
    back as Lightning restores the callbacks, and warns (``DevRNGWarning``) when
    the resumed run cannot be bitwise the uninterrupted one.

    Args:
        seed: The run's seed, an int in ``[0, 2**64)``; ``None`` takes
            ``DEVRNG_SEED``, then ``PL_GLOBAL_SEED``, else draws one. Lightning
            takes seeds below ``2**32`` only: for a larger one ``PL_GLOBAL_SEED``
            holds a stand-in below ``2**32``, and when a strategy reseeds the
            process from it (DDP, FSDP, DeepSpeed and ModelParallel do, as they
            set up), ``setup`` seeds it again with the run's seed.
        deterministic: Also apply ``devrng.deterministic()``.
        per_rank: Seed each rank with its own ``devrng.distributed.rank_seed``.
        strict: ``False`` resumes on another device count or world size with a
            warning (as ``TrainingRNG.load_state_dict(strict=False)``).
        flight_record: Keep the run's flight record (``devrng-flight.rank<r>.jsonl``)
            in this directory; ``True`` (the default): the Trainer's
            ``default_root_dir``; ``False``: no record. A resumed run compares its
            steps with the interrupted run's and warns at the first that differs.

    Examples:
        >>> from devrng.integrations.lightning import DevRNGCallback
        >>> callback = DevRNGCallback(seed=1234)
        >>> callback.rng.seed, callback.state_key
        (1234, 'DevRNGCallback')
    """

    def __init__(self, seed: int | None = None, *, deterministic: bool = False,
                 per_rank: bool = False, strict: bool = True,
                 flight_record: str | os.PathLike[str] | bool = True) -> None:
        check_flags(deterministic=deterministic, per_rank=per_rank, strict=strict)
        if not isinstance(flight_record, (bool, str, os.PathLike)):
            raise TypeError(f"DevRNGCallback(flight_record=...) takes a directory, True (the "
                            f"Trainer's default_root_dir) or False, not {short_repr(flight_record)}.")
        self.flight_record = flight_record
        self.seed = seed
        self.deterministic = deterministic
        self.per_rank = per_rank
        self.strict = strict
        self.rng = TrainingRNG(seed, deterministic=deterministic, per_rank=per_rank)
        # What seed_everything(seed, workers=True) leaves for Lightning's own code: spawned
        # processes reseed from PL_GLOBAL_SEED, and the loaders it builds without a
        # worker_init_fn get its worker seeding (distinct per worker and rank). Lightning
        # takes seeds below 2**32 there; a larger one has a stand-in (see setup).
        os.environ["PL_GLOBAL_SEED"] = str(seed32(self.rng.seed))
        os.environ["PL_SEED_WORKERS"] = "1"
        self._seeded_in = (os.getpid(), process_rank(strict=False))
        self._trainer: pl.Trainer | None = None
        self._resumed: dict[str, Any] | None = None  # what the last load_state_dict restored
        self._ended: dict[str, Any] | None = None  # the state when the last fit ended
        self._iterated: set[int] = set()  # ids of training loaders that ran an epoch here

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._trainer = trainer
        if self.flight_record is not False or os.environ.get(FLIGHT_VARIABLE):
            where = trainer.default_root_dir if self.flight_record in (True, False) \
                else os.fspath(self.flight_record)  # type: ignore[arg-type]
            start_flight_record(self.rng, where, hooked=True,
                                log=logging.getLogger("lightning.pytorch").info)
            self._watch_before_the_first_iterator(trainer)
            if self.rng.flight is not None and isinstance(pl_module, torch.nn.Module):
                self.rng.flight.name_modules(pl_module)  # (training_step runs no forward of it)
        here = (os.getpid(), process_rank(strict=False))
        seed = rank_seed(self.rng.seed, here[1]) if self.per_rank else self.rng.seed
        moved = here != self._seeded_in and (self.per_rank or here[0] != self._seeded_in[0])
        if moved or _reseeded_by_lightning(seed32(self.rng.seed), seed):
            # A process Lightning started (spawn), a rank known only now, or a process a
            # strategy reseeded from PL_GLOBAL_SEED with another seed than devrng's (a seed
            # of 2**32 or more, or per_rank): seed it as the callback seeds.
            manual_seed(seed)
            self._seeded_in = here

    # -- checkpoints: every rank's state, in the one file rank 0 writes ----------------------
    def state_dict(self) -> dict[str, Any]:
        if self._ended is not None:
            # trainer.save_checkpoint after fit: Lightning has already asked a
            # StatefulDataLoader for its state, which builds a new iterator that draws from
            # the loader's generator; the run's state is the one it ended with.
            return self._ended
        state = self._per_rank().state_dict()
        # One description per rank (each rank has its own DistributedSampler), as the states.
        state["loaders"] = gather({stage: [describe(loader) for loader in loaders]
                                   for stage, loaders in self._loaders().items()})
        state["position"] = _position(self._trainer)
        training = self._loaders().get("training", [])
        if any(map(replays_sampler, training)):
            state["epoch_starts"] = gather([_last_start(loader) for loader in training])
        return seal_entry(_FORM, state)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._ended = self.state_dict()
        if self.rng.flight is not None:
            self.rng.flight.finish()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            self._no_state(f"its DevRNGCallback entry is {short_repr(state_dict)}")
            return
        check_entry(state_dict, _FORM, _KEYS, _OPTIONAL)  # all of it, before any is used
        starts = _read_starts(state_dict.get("epoch_starts"))
        self._per_rank().load_state_dict(state_dict)
        self._ended = None
        loaders = state_dict.get("loaders")
        if isinstance(loaders, list):  # one per rank (devrng 0.1 wrote rank 0's alone)
            rank = process_rank()
            loaders = loaders[rank] if rank < len(loaders) else None
        position = state_dict.get("position")
        self._resumed = {"host": get_rng_state(devices=[]),
                         "generators": generator_states(self.rng),
                         "loaders": loaders if isinstance(loaders, Mapping) else {},
                         "position": position if isinstance(position, Mapping) else {},
                         "starts": starts}

    def _per_rank(self) -> PerRankState:
        return PerRankState(self.rng, strict=self.strict, owner="DevRNGCallback",
                            lenient="DevRNGCallback(strict=False)")

    def _no_state(self, why: str) -> None:
        """The run resumes from a checkpoint that holds no devrng state: refuse (strict), or
        say that it will not be exact."""
        problem = (f"DevRNGCallback: the checkpoint the run resumes from holds no devrng RNG "
                   f"state ({why}); it was saved without DevRNGCallback, so the resumed run "
                   "cannot draw what the uninterrupted one drew")
        if self.strict:
            raise DevRNGError(problem + ". Resume from a checkpoint saved with the callback, "
                              "or pass DevRNGCallback(strict=False) to go on with a warning.")
        warn_on_resume([problem], flight=self.rng.flight, stacklevel=3)

    def _loaders(self) -> dict[str, list[Any]]:
        trainer = self._trainer
        if trainer is None:
            return {}
        return {"training": _flatten(trainer.train_dataloader),
                "validation": _flatten(trainer.val_dataloaders)}

    def _watch_training(self) -> None:
        """Have the flight record see the batches of the training loaders."""
        if self.rng.flight is not None:
            for i, loader in enumerate(self._loaders().get("training", [])):
                self.rng.flight.watch(f"train{i or ''}", loader)

    def _watch_before_the_first_iterator(self, trainer: pl.Trainer) -> None:
        """Watch the training loaders as soon as Lightning has them: its fit loop makes their
        first iterator (the first epoch's, or the resumed one's) before ``on_train_start``,
        right after it restores their states, where this hooks in."""
        loop: Any = getattr(trainer, "fit_loop", None)  # (absent from a simulated Trainer)
        restore = getattr(loop, "_load_combined_loader_states", None)
        if not callable(restore) or getattr(restore, "_devrng_watches", False):
            return
        callback = weakref.ref(self)

        def restore_then_watch() -> None:
            restore()
            this = callback()
            if this is not None:
                this._watch_training()

        restore_then_watch._devrng_watches = True  # type: ignore[attr-defined]
        loop._load_combined_loader_states = restore_then_watch

    # -- the resumed run ------------------------------------------------------------------
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._trainer = trainer
        resumed, self._resumed, self._ended = self._resumed, None, None
        loaders = self._loaders()
        mid_epoch = bool(trainer.fit_loop.restarted_mid_epoch)
        # The first epoch of this process iterates what Lightning built before this hook; a
        # restart in the middle of an epoch has no on_train_epoch_start for it.
        self._iterated = {id(loader) for loader in loaders["training"]} if mid_epoch else set()
        if self.rng.flight is not None:
            self._watch_training()
            for optimizer in trainer.optimizers:
                self.rng.flight.watch_optimizer(optimizer)
        if resumed is None:
            if getattr(trainer, "ckpt_path", None):  # resumed, and Lightning had nothing for us
                self._no_state("it has no DevRNGCallback entry")
            self._watch_epoch_starts(trainer, loaders["training"], None)
            return
        stateful = bool(loaders["training"]) and all(describe(loader)["stateful"]
                                                     for loader in loaders["training"])
        problems = []
        if mid_epoch and stateful:
            problems += self._replay_samplers(trainer, loaders["training"], resumed["starts"])
            # Lightning built the resumed loaders' iterators after the restore, and they drew
            # what the loaders' saved positions then replaced (a base seed, the sampler's
            # seed, a permutation): undo those draws.
            self._put_back(resumed)
        elif not mid_epoch:
            problems += self._start_at_the_epoch(trainer, loaders["training"], resumed)
        problems += _problems(trainer, loaders, resumed["loaders"], mid_epoch)
        problems += _position_problems(resumed["position"])
        warn_on_resume(problems, flight=self.rng.flight, stacklevel=2)

    def _put_back(self, resumed: Mapping[str, Any]) -> None:
        """The generators as the checkpoint restored them: torch's, Python's, NumPy's and
        the loaders'."""
        set_rng_state(resumed["host"])
        set_generator_states(self.rng, resumed["generators"])

    def _watch_epoch_starts(self, trainer: pl.Trainer, loaders: list[Any],
                            resumed: Mapping[str, Any] | None) -> None:
        """Record, on each training loader that replays its sampler (``replays_sampler``), the
        generators of each epoch's iterator it makes. Lightning made the first one before this
        hook: it makes it again, under the watch, from the same generators (the restored ones,
        in a resumed run), so that a checkpoint written inside this epoch holds its start."""
        unseen = [loader for loader in loaders
                  if replays_sampler(loader) and EpochStarts.watch(loader).last is None]
        fetcher = getattr(trainer.fit_loop, "_data_fetcher", None)  # Lightning 2.6's
        if not unseen or fetcher is None:
            return
        if resumed is not None:
            self._put_back(resumed)
        for loader in unseen:
            loader.load_state_dict({})  # (a StatefulDataLoader: no place; a new iterator)
        iter(fetcher)

    def _replay_samplers(self, trainer: pl.Trainer, loaders: list[Any],
                         starts: list[EpochStart | None]) -> list[str]:
        """Make the resumed iterators of the training loaders that replay their samplers again,
        each from the generators its epoch's iterator was made from in the uninterrupted run
        (the checkpoint's ``epoch_starts``); the caller then puts the checkpoint's back."""
        replaying = [i for i, loader in enumerate(loaders) if replays_sampler(loader)]
        missing = [i for i in replaying if i >= len(starts) or starts[i] is None]
        fetcher = getattr(trainer.fit_loop, "_data_fetcher", None)  # Lightning 2.6's
        if missing or fetcher is None or getattr(fetcher, "batches", None):
            return [problem for i in (missing or replaying)
                    if (problem := unreplayable_problem(_name("training", i, len(loaders))))]
        if not replaying:
            return []
        # Their places as Lightning loaded them (no batch was taken from the new iterators)
        places = [loader.state_dict() for loader in loaders]
        undo = Undo("DevRNGCallback")  # not rolled back: the checkpoint's states follow
        for i in replaying:
            start = starts[i]
            assert start is not None
            EpochStarts.watch(loaders[i]).arm(start, undo)
        for loader, place in zip(loaders, places, strict=True):
            loader.load_state_dict(place)
        iter(fetcher)
        return []

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                     exception: BaseException) -> None:
        """A resume that fails as the loaders take their saved places: say why in a sentence,
        before Lightning's teardown fails in its turn and hides torchdata's assertion."""
        resumed = self._resumed
        if resumed is None or not _FIX_WORKER_COUNT or not isinstance(exception, AssertionError):
            return
        position = resumed["position"]
        batch = position.get("batch")
        if not isinstance(batch, int) or not 0 < batch != position.get("batches"):
            return  # not inside an epoch: Lightning loads no loader's place
        records = resumed["loaders"].get("training")
        loaders = self._loaders().get("training", [])
        for i, loader in enumerate(loaders):
            record = records[i] if isinstance(records, list) and i < len(records) else None
            now = describe(loader)
            if isinstance(record, Mapping) and now["stateful"] \
                    and record.get("num_workers") != now["num_workers"]:
                raise DevRNGError(
                    "DevRNGCallback: the run could not resume: " + worker_count_problem(
                        _name("training", i, len(loaders)), int(record.get("num_workers") or 0),
                        now["num_workers"], batch) + ".") from exception

    def _start_at_the_epoch(self, trainer: pl.Trainer, loaders: list[Any],
                            resumed: Mapping[str, Any]) -> list[str]:
        """Make the resumed epoch's first iterator draw its indices from the epoch's order.

        Lightning 2.6 makes a resumed run's first iterator before it tells the samplers
        the epoch (``set_epoch``); a loader with workers draws its first indices at once,
        so a ``DistributedSampler`` yields epoch 0's order again. Undo the iterator's draws,
        tell the samplers their epoch, and have Lightning make the iterator again; where
        that cannot be undone, say so (the sentences returned).
        """
        epoch = trainer.fit_loop.epoch_progress.current.processed
        infos = [describe(loader) for loader in loaders]
        stale = [loader for loader, info in zip(loaders, infos, strict=True)
                 if info["num_workers"] and _samplers_behind(loader, epoch)]
        if not stale:
            self._watch_epoch_starts(trainer, loaders, resumed)
            return []
        fetcher = getattr(trainer.fit_loop, "_data_fetcher", None)  # Lightning 2.6's
        if fetcher is None or any(info["persistent_workers"] or info["stateful"]
                                  for info in infos):
            return [f"Lightning {pl.__version__} made the resumed epoch's first iterator of a "
                    f"loader with workers before it set its sampler's epoch to {epoch}, so it "
                    "yields the order of another epoch, and devrng cannot make it again for a "
                    "loader that keeps its workers or its position; build the training loader "
                    "with persistent_workers=False (a torch DataLoader), or num_workers=0"]
        self._put_back(resumed)
        for loader in stale:
            for sampler in _samplers_behind(loader, epoch):
                sampler.set_epoch(epoch)
        for loader in filter(replays_sampler, loaders):
            EpochStarts.watch(loader)  # the iterator made next is this epoch's
        iter(fetcher)  # as Lightning's fit loop does: the loaders' new iterators
        return []

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if self.rng.flight is not None:
            self.rng.flight.consume(batch)

    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           loss: torch.Tensor) -> None:
        # (Before the optimizer steps: the loss goes on the line of the step it is part of.)
        if self.rng.flight is not None and loss.numel() == 1:
            self.rng.flight.loss(loss)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for loader in self._loaders()["training"]:
            if replays_sampler(loader):
                # A loader Lightning reloaded (reload_dataloaders_every_n_epochs) is new: its
                # epoch's iterator is made after this hook, under the watch.
                EpochStarts.watch(loader)
            seeding = _epoch_reseeded(loader)
            if seeding is not None and id(loader) in self._iterated:
                # Workers kept from the last epoch: make the draw a new iterator would make
                # (its base seed, from the loader's generator, before the shuffle) and hand
                # it to the workers, so that this epoch is what a resumed run's new iterator
                # gives -- in both runs.
                base = torch.empty((), dtype=torch.int64).random_(generator=loader.generator)
                seeding.set_epoch_seed(int(base.item()))
            self._iterated.add(id(loader))


def _reseeded_by_lightning(exported: int, seed: int) -> bool:
    """Whether a Lightning strategy has just reseeded this process from the value the callback
    exported in ``PL_GLOBAL_SEED`` (still there: no ``seed_everything`` of the user's since),
    which is not ``seed``, this process's seed. DDP, FSDP, DeepSpeed and ModelParallel call
    ``reset_seed()`` as they set up, which is ``seed_everything(PL_GLOBAL_SEED)``: torch's
    default generator then has that value as its initial seed."""
    return (os.environ.get("PL_GLOBAL_SEED") == str(exported) and exported != seed
            and torch.initial_seed() == exported)


def _name(stage: str, i: int, count: int) -> str:
    """How the sentences name loader ``i`` of ``count`` of a stage."""
    return f"the {stage} loader" + (f" {i}" if count > 1 else "")


def _last_start(loader: Any) -> dict[str, Any] | None:
    """The ``EpochStart`` of the iterator ``loader`` made last, as plain data (None: none)."""
    watch = EpochStarts.of(loader)
    return None if watch is None or watch.last is None else watch.last.to_dict()


def _read_starts(saved: Any) -> list[EpochStart | None]:
    """This rank's saved ``EpochStart`` of each training loader, checked."""
    rank = process_rank()
    own = saved[rank] if isinstance(saved, list) and rank < len(saved) else None
    return [None if data is None else EpochStart.read(
                data, f"DevRNGCallback: the saved epoch start of training loader {i}")
            for i, data in enumerate(own if isinstance(own, list) else [])]


def _samplers_behind(loader: Any, epoch: int) -> list[Any]:
    """The samplers of ``loader`` with ``set_epoch`` (a DistributedSampler) whose epoch is
    not ``epoch`` (where Lightning's ``_set_sampler_epoch`` looks for them)."""
    found = [getattr(loader, "sampler", None),
             getattr(getattr(loader, "batch_sampler", None), "sampler", None)]
    unique = {id(s): s for s in found if callable(getattr(s, "set_epoch", None))}
    return [s for s in unique.values() if getattr(s, "epoch", epoch) != epoch]


def _position(trainer: pl.Trainer | None) -> dict[str, Any] | None:
    """Where in its epoch a checkpoint written while fitting is: the batch, whether that
    batch's step was under way (a signal handler's save), and how many batches' gradients
    were accumulated and not yet applied."""
    if trainer is None or trainer.state.fn != "fit":
        return None
    progress = trainer.fit_loop.epoch_loop.batch_progress
    ready, processed = progress.current.ready, progress.current.processed
    batches = _epoch_batches(trainer)
    accumulate = trainer.accumulate_grad_batches
    in_step = ready > processed
    # (Lightning steps on the last batch)
    ended = progress.is_last_batch or (batches is not None and ready >= batches)
    return {"batch": ready, "batches": batches, "in_step": in_step, "accumulate": accumulate,
            "accumulated": 0 if in_step or ended else ready % accumulate}


def _epoch_batches(trainer: pl.Trainer) -> int | None:
    """The batches of an epoch; None for a training loader without a length (an
    IterableDataset's: Lightning counts ``inf``)."""
    batches = trainer.num_training_batches
    return int(batches) if math.isfinite(batches) else None


def _position_problems(position: Mapping[str, Any]) -> list[str]:
    """The sentences for a checkpoint written inside a step or an accumulation window."""
    batch, batches = position.get("batch"), position.get("batches")
    where = f"batch {batch}" + (f" of {batches}" if batches else "")
    if position.get("in_step"):
        return [f"the checkpoint was written during the training step of {where} (a save from "
                "a signal handler, such as Lightning's SIGUSR1 auto-requeue for SLURM, lands "
                "wherever the signal arrives): its weights, optimizer state and generators are "
                "those of a step half done, which no resume continues exactly (with or without "
                "devrng); requeue from a checkpoint written at a batch's or an epoch's end "
                "(ModelCheckpoint(save_last=True, every_n_train_steps=N) and "
                "fit(ckpt_path='last'))"]
    accumulated = position.get("accumulated")
    if isinstance(accumulated, int) and accumulated > 0:
        return [f"the checkpoint was written after {where}, inside a window of "
                f"accumulate_grad_batches={position.get('accumulate')}: the gradient of "
                f"{accumulated} batch{'es' if accumulated > 1 else ''} accumulated since the "
                "last optimizer step is not in the checkpoint (Lightning saves weights and "
                "optimizer state, not .grad), so the first optimizer step after the resume "
                "differs (with or without devrng); save where a window ends "
                "(every_n_train_steps counts optimizer steps) or at the ends of epochs"]
    return []


def _epoch_reseeded(loader: Any) -> WorkerSeeding | None:
    """The loader's devrng worker seeding if the callback gives it a seed each epoch: a torch
    DataLoader that keeps its workers across epochs, with devrng's generator and seeding."""
    info = describe(loader)
    if info["persistent_workers"] and info["devrng_seeded"] and not info["stateful"]:
        seeding: WorkerSeeding = loader.worker_init_fn
        return seeding
    return None


def _flatten(loaders: Any) -> list[Any]:
    """The DataLoaders in what ``trainer.train_dataloader`` / ``val_dataloaders`` return."""
    if loaders is None:
        return []
    if isinstance(loaders, Mapping):
        return [x for value in loaders.values() for x in _flatten(value)]
    if isinstance(loaders, (list, tuple)):
        return [x for value in loaders for x in _flatten(value)]
    return [loaders]


def _problems(trainer: pl.Trainer, loaders: Mapping[str, list[Any]],
              saved: Mapping[str, Any], mid_epoch: bool) -> Iterable[str]:
    """Why the run resumed by ``trainer`` cannot continue exactly, one sentence per reason."""
    epoch_loop = trainer.fit_loop.epoch_loop
    last_batch = mid_epoch and epoch_loop.restarted_on_train_batch_end \
        and epoch_loop.batch_progress.is_last_batch
    for stage, current in loaders.items():
        records = saved.get(stage)
        records = records if isinstance(records, list) else []
        for i, loader in enumerate(current):
            name = _name(stage, i, len(current))
            now = describe(loader)
            record: Mapping[str, Any] = {}
            if i < len(records) and isinstance(records[i], Mapping):
                record = records[i]
                yield from differences(name, record, now)
            if stage == "training":
                yield from _training_problems(name, now, loader, mid_epoch, last_batch,
                                              record, trainer)
            else:
                yield from _validation_problems(name, now)


def _training_problems(name: str, now: Mapping[str, Any], loader: Any, mid_epoch: bool,
                       last_batch: bool, record: Mapping[str, Any], trainer: pl.Trainer
                       ) -> Iterable[str]:
    batches = _epoch_batches(trainer)  # (the last batch of an epoch: only with a length)
    avoid = ("save at the ends of epochs (ModelCheckpoint's default) or every_n_train_steps "
             f"that does not divide the {batches} batches of an epoch")
    if last_batch and now["stateful"]:
        yield (f"the checkpoint was written after the last batch of an epoch, and Lightning "
               f"{pl.__version__} resumes it in the next epoch with {name}'s position at the "
               "end of the finished one, so that epoch yields no batches and the run ends "
               f"{batches} steps early (Lightning's behaviour, with or without devrng); {avoid}")
    elif last_batch and _flatten(trainer.val_dataloaders):
        yield (f"the checkpoint was written after the last batch of an epoch, before its "
               f"validation, and Lightning {pl.__version__} resumes it in the next epoch "
               "without that validation, whose random draws the uninterrupted run made "
               f"(Lightning's behaviour, with or without devrng); {avoid}")
    elif mid_epoch and not last_batch and not now["stateful"]:
        done = trainer.fit_loop.epoch_loop.batch_progress.current.processed
        of = "" if batches is None else f" of {batches}"
        yield position_problem(name, now["kind"], f"after batch {done}{of}",
                               "Lightning starts the epoch's loader again")
    elif mid_epoch and not last_batch and now["num_workers"]:
        problem = inside_epoch_problem(name, record, "**callback.rng.dataloader_kwargs() (made "
                                                     "before fit)")
        if problem is not None:
            yield problem
    if not now["in_order"]:
        yield out_of_order_problem(name)
    if now["private_shuffle"] and not mid_epoch:
        yield private_shuffle_problem(name, "Lightning builds it again when the run resumes "
                                            "and restores its position only in the middle of an "
                                            "epoch")
    if now["persistent_workers"] and not (mid_epoch and now["stateful"]):
        reseeded = _epoch_reseeded(loader) is not None  # the callback draws the base seed
        if now["stateful"]:
            yield persistent_workers_problem(
                name, "set persistent_workers=False, or use a torch DataLoader built with "
                      "**callback.rng.dataloader_kwargs() (the callback gives its workers "
                      "each epoch's seed)", now["sampler"])
        elif not reseeded or not record.get("sample_rng"):
            yield persistent_workers_problem(
                name, "build it with **callback.rng.dataloader_kwargs() (made before fit) and "
                      "draw each sample's randomness inside devrng.sample_rng(index), and the "
                      "callback gives its workers each epoch's seed; or set "
                      "persistent_workers=False", None if reseeded else now["sampler"])


def _validation_problems(name: str, now: Mapping[str, Any]) -> Iterable[str]:
    if now["private_shuffle"]:
        yield private_shuffle_problem(name, "Lightning builds it again when the run resumes and "
                                            "never restores a validation loader's position")
    if now["persistent_workers"]:
        yield persistent_workers_problem(
            name, "set persistent_workers=False on validation loaders (without a generator, "
                  "the new iterator also draws its base seed from torch's global generator, "
                  "which shifts the training steps after the first validation)", now["sampler"])
