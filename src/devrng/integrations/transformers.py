"""HF transformers: activation checkpointing on XLA, devrng's seeding for ``Trainer``, and exact
resumes in the middle of an epoch.

``model.gradient_checkpointing_enable()`` runs ``torch.utils.checkpoint``, which
looks up ``torch.xla`` to save and restore the device's RNG state; torch has no
such module, so on XLA it fails with ``AttributeError: module 'torch' has no
attribute 'xla'`` (both ``use_reentrant`` values, measured with transformers 5.23
and torch_xla 2.9). ``devrng.patch_torch`` gives torch that module,
and the checkpointed gradients equal the plain ones bitwise. ``DevRNGTrainerCallback``
does that for ``Trainer`` users, and seeds what the Trainer's ``set_seed`` does not
reach (torchax's key).

A Trainer resumed in the middle of an epoch builds the epoch's loader iterator -- its
shuffle and worker seeds, drawn from torch's generator -- before it restores its
``rng_state.pth``, which holds the generators of the checkpoint, not of the epoch's
start (transformers 5.23, ``Trainer._run_epoch``). The callback keeps torch's state at
the start of each epoch in the Trainer's own checkpoint state and puts it back when
the resumed epoch begins, so the iterator draws what the uninterrupted run drew; what
it cannot make exact it names in a ``DevRNGWarning``.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
import transformers
from transformers.trainer_callback import ExportableState

from devrng._backends.registry import available_backends
from devrng._base.errors import DevRNGError, check_flags, short_repr
from devrng._base.lazy import imported
from devrng._base.rank import process_rank, world_size
from devrng._checks.compare import LOADER_PREFIX
from devrng._checks.digest import generator_fingerprint
from devrng._checks.record import FLIGHT_VARIABLE, FlightRecord, global_sources
from devrng._generators.fork import fork_rng
from devrng._generators.patch import patch_torch
from devrng._generators.saved import SavedForm
from devrng._generators.seeding import manual_seed
from devrng._training.loaders import (
    describe,
    differences,
    persistent_workers_problem,
    warn_on_resume,
    world_size_problem,
)
from devrng.integrations._per_rank import check_entry, seal_entry

__all__ = ["DevRNGTrainerCallback"]

# The callback's state in trainer_state.json: one attribute, sealed (its digest is checked
# before any of it is used). devrng 0.4.0 wrote the _FIELDS as the attributes, unsealed.
_FORM = SavedForm("devrng.DevRNGTrainerCallback", (1,), 1, "DevRNGTrainerCallback",
                  "DevRNGTrainerCallback.state()")
_STATE = "devrng_state"
_FIELDS = frozenset({"epoch_start", "loader", "world_size", "flight", "saved"})
_SOURCE = "the checkpoint's trainer_state.json"

#: Warn when ignore_data_skip=True resumes a checkpoint written inside an epoch (the Trainer
#: then trains that epoch again from its first batch).
_FIX_IGNORE_DATA_SKIP = True


class DevRNGTrainerCallback(transformers.TrainerCallback, ExportableState):
    """Make a ``transformers.Trainer`` device-correct, and its resumes exact or explained.

    When the Trainer is built it calls ``devrng.patch_torch``, so
    ``gradient_checkpointing=True`` works on XLA and torchax and recomputes the
    same dropout masks. When training begins it seeds every device type
    available (XLA and torchax included) with ``args.seed``, as the Trainer's
    ``set_seed`` seeds the CPU, CUDA, Python and NumPy. Each checkpoint's
    ``trainer_state.json`` holds torch's generator state at the start of the
    epoch; a run resumed in the middle of an epoch gets it back when that epoch
    begins, so the epoch is shuffled and its workers seeded as in the
    uninterrupted run. ``sample_rng=True`` says that every training sample draws
    its randomness inside ``devrng.sample_rng``, which makes
    such a resume exact with ``dataloader_num_workers > 0``; otherwise, and for
    what no state can fix, the resumed run warns (``DevRNGWarning``).

    The run keeps a flight record (``devrng-flight.rank<r>.jsonl`` in ``output_dir``;
    ``flight_record=False``: none): a resumed run compares each step with what the
    interrupted run recorded past the checkpoint and warns at the first that differs.

    The callback's state in ``trainer_state.json`` is sealed like every state devrng
    saves (a SHA-256 digest of it, checked when the run resumes): a state changed since
    it was written raises ``DevRNGError`` before any of it is used.

    Examples:
        >>> from devrng.integrations.transformers import DevRNGTrainerCallback
        >>> callback = DevRNGTrainerCallback()   # Trainer(..., callbacks=[callback])
        >>> attributes = callback.state()["attributes"]   # sealed in one attribute
        >>> sorted(attributes["devrng_state"])[:4]
        ['devrng_version', 'digest', 'epoch_start', 'flight']
    """

    def __init__(self, sample_rng: bool = False, *,
                 flight_record: str | os.PathLike[str] | bool = True) -> None:
        check_flags(sample_rng=sample_rng)
        if not isinstance(flight_record, (bool, str, os.PathLike)):
            raise TypeError(f"DevRNGTrainerCallback(flight_record=...) takes a directory, True "
                            f"(the Trainer's output_dir) or False, not {short_repr(flight_record)}.")
        self.sample_rng = sample_rng
        self.flight_record = flight_record
        self.flight: FlightRecord | None = None
        self.epoch_start: str | None = None  # torch's CPU state when the epoch began (base64)
        self.loader: dict[str, Any] | None = None  # the training loader, described
        self.world_size: int | None = None
        self._resumed_epoch_start: str | None = None  # to put back when the resumed epoch begins

    # -- what the Trainer writes in trainer_state.json with each checkpoint ---------------------
    def state(self) -> dict[str, Any]:
        checkpoint = None
        if self.flight is not None:  # where this checkpoint is in the flight record
            checkpoint = f"{self.flight.attempt}:{self.flight.step}"
            self.flight.checkpoint(checkpoint)
        fields = {"epoch_start": self.epoch_start, "loader": self.loader,
                  "world_size": self.world_size, "flight": checkpoint,
                  # torch's state when the Trainer saves (after its rng_state.pth): the
                  # start of the next epoch, for a checkpoint at an epoch's end
                  "saved": _encode(torch.get_rng_state())}
        # Sealed as JSON gives it back (tuples become lists), so that the digest holds.
        flight_record = self.flight_record if isinstance(self.flight_record, bool) \
            else os.fspath(self.flight_record)
        # (args: what the Trainer makes a new callback with under
        # restore_callback_states_from_checkpoint=True, before it sets the attributes)
        return {"args": {"sample_rng": self.sample_rng, "flight_record": flight_record},
                "attributes": {_STATE: seal_entry(_FORM, json.loads(json.dumps(fields)))}}

    # -- hooks --------------------------------------------------------------------------------
    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        patch_torch()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # What the checkpoint holds for this callback, checked whole before anything changes.
        saved = _saved(state) if state.global_step > 0 else None
        if not isinstance(self.flight, FlightRecord):
            # (what devrng 0.4.0 saved as the attribute "flight", its text, which the Trainer
            # sets on the callback under restore_callback_states_from_checkpoint=True)
            self.flight = None
        patch_torch()  # idempotent: picks up a device package imported since
        devices = [name for name in available_backends() if name != "cpu"]
        if devices and state.global_step == 0:  # a resumed run keeps the Trainer's restored state
            with fork_rng(devices=[]):  # the Trainer seeded the CPU itself: leave it as it is
                manual_seed(int(args.seed), device_type=devices, python=False, numpy=False)
        loader: Any = kwargs.get("train_dataloader")
        now = None if loader is None else describe(loader)
        self._start_flight(args, state, loader, kwargs.get("model"), saved)
        if self.flight is not None and isinstance(kwargs.get("optimizer"), torch.optim.Optimizer):
            self.flight.watch_optimizer(kwargs["optimizer"])
        self.loader, self.world_size = now, int(args.world_size)
        self._resumed_epoch_start = None
        if state.global_step == 0 or now is None:
            return
        sized = _updates_per_epoch(loader, args.gradient_accumulation_steps)
        # A loader without a length (an IterableDataset's) is one epoch of max_steps to the
        # Trainer, which skips its first batches by loading them.
        per_epoch = sized or max(int(args.max_steps), 1)
        within = state.global_step % per_epoch  # optimizer steps of its epoch the run trained
        inside = within != 0 and not args.ignore_data_skip
        if saved is not None:
            self._resumed_epoch_start = _valid(saved.get("epoch_start" if inside else "saved"))
        problems = list(self._problems(args, saved, now, inside, sized is not None))
        if within and args.ignore_data_skip and _FIX_IGNORE_DATA_SKIP:
            problems.append(
                f"the checkpoint was written inside an epoch (after {within} of its {per_epoch} "
                "optimizer steps), and with ignore_data_skip=True the Trainer does not skip "
                "the batches that epoch trained on: it trains the epoch again from its first "
                "batch, in a new order, so the resumed run sees other batches than the "
                "uninterrupted one (what the flag is for: a faster resume, not an exact one); "
                "set ignore_data_skip=False, or save at the ends of epochs")
        warn_on_resume(problems, flight=self.flight, stacklevel=2)

    def _start_flight(self, args: Any, state: Any, loader: Any, model: Any,
                      saved: Mapping[str, Any] | None) -> None:
        if self.flight_record is False and not os.environ.get(FLIGHT_VARIABLE):
            return
        if self.flight is None:
            where = args.output_dir if self.flight_record in (True, False) \
                else os.fspath(self.flight_record)  # type: ignore[arg-type]
            rank = process_rank()
            self.flight = FlightRecord(
                where, rank=rank, hooked=True, log=transformers.logging.get_logger(__name__).info,
                identity={"seed": int(args.seed), "rank": rank, "world_size": world_size()},
                sources=functools.partial(_sources, loader))
            if isinstance(model, torch.nn.Module):
                self.flight.watch_model(model)
        if loader is not None:
            self.flight.watch("train", loader)
        if state.global_step > 0:
            key = saved.get("flight") if saved is not None else None
            self.flight.resume(key if isinstance(key, str) else "", step=state.global_step)
            _watch_skipping(self.flight)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.flight is not None:
            self.flight.finish()

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        resumed, self._resumed_epoch_start = self._resumed_epoch_start, None
        if resumed is not None:
            # The state the uninterrupted run's iterator drew this epoch from. (At an epoch's
            # end the Trainer loads the same state itself, after this hook.)
            torch.set_rng_state(_decode(resumed))
        self.epoch_start = _encode(torch.get_rng_state())

    def _problems(self, args: Any, saved: Mapping[str, Any] | None, now: Mapping[str, Any],
                  inside: bool, sized: bool) -> Iterable[str]:
        if saved is None or (inside and self._resumed_epoch_start is None):
            yield ("the checkpoint holds no readable state of DevRNGTrainerCallback (written "
                   "without it, or its trainer_state.json was changed), so devrng cannot put "
                   "back the generator the resumed epoch started from; resume from a "
                   "checkpoint written with the callback")
            if saved is None:
                return
        record = saved.get("loader")
        if isinstance(record, Mapping):
            yield from differences("the training loader", record, now)
        if isinstance(saved.get("world_size"), int) and saved["world_size"] != args.world_size:
            yield world_size_problem(saved["world_size"], args.world_size,
                                     {"the training loader": now})
        if now["persistent_workers"]:
            yield persistent_workers_problem(
                "the training loader", "set dataloader_persistent_workers=False", now["sampler"])
        if inside and not now["num_workers"]:
            batches = args.gradient_accumulation_steps
            yield (f"the checkpoint was written inside an epoch, and transformers "
                   f"{transformers.__version__} loads the first {batches} resumed batch(es) "
                   "before it restores its generators, so with dataloader_num_workers=0 their "
                   "augmentation (drawn in the main process) differs; use "
                   "dataloader_num_workers > 0 with devrng.sample_rng, or save at epoch ends")
        elif inside and not self.sample_rng and sized:
            yield ("the checkpoint was written inside an epoch, and the Trainer skips the "
                   "epoch's first batches without loading them, so the workers draw each "
                   "later sample's augmentation from another point of their streams; draw "
                   "each sample's randomness inside devrng.sample_rng(index) and pass "
                   "DevRNGTrainerCallback(sample_rng=True), or save at epoch ends")


#: Records that watch the loader the Trainer makes next to skip a resumed epoch's first batches.
_skipping: weakref.WeakSet[FlightRecord] = weakref.WeakSet()


def _watch_skipping(flight: FlightRecord) -> None:
    """Have ``flight`` watch, as the training loader, the loader a resumed Trainer iterates in
    the epoch it resumes inside: a new one that accelerate's ``skip_first_batches`` makes
    after ``on_epoch_begin`` (the Trainer's name for it is wrapped once per process)."""
    _skipping.add(flight)
    module = imported("transformers.trainer")
    skip = getattr(module, "skip_first_batches", None)
    if not callable(skip) or getattr(skip, "_devrng_watches", False):
        return

    def skipping(dataloader: Any, num_batches: int = 0) -> Any:
        made = skip(dataloader, num_batches)
        for record in list(_skipping):  # the records of the Trainers resuming now: once each
            _skipping.discard(record)
            record.watch("train", made)
        return made

    skipping._devrng_watches = True  # type: ignore[attr-defined]
    module.skip_first_batches = skipping  # type: ignore[union-attr]


def _sources(loader: Any) -> list[tuple[str, Callable[[], Any]]]:
    """What the flight record fingerprints at each step's start: the global generators, and
    the training loader's and its sampler's."""
    found = global_sources()
    for name, owner in (("loader", loader), ("sampler", getattr(loader, "sampler", None))):
        generator = getattr(owner, "generator", None)
        if isinstance(generator, torch.Generator):
            found.append((LOADER_PREFIX + name, functools.partial(generator_fingerprint,
                                                                  generator)))
    return found


def _saved(state: Any) -> Mapping[str, Any] | None:
    """The state this callback saved in the checkpoint the Trainer resumed from, checked whole
    (``DevRNGError`` if it was changed after it was written); None if it holds none."""
    data = (getattr(state, "stateful_callbacks", None) or {}).get(DevRNGTrainerCallback.__name__)
    if isinstance(data, list):  # one entry per callback of this type: the first is ours
        data = data[0] if data else None
    attributes = data.get("attributes") if isinstance(data, Mapping) else None
    if not isinstance(attributes, Mapping):
        return None
    if set(attributes) <= _FIELDS:
        return attributes  # devrng 0.4.0's, unsealed
    if set(attributes) != {_STATE}:
        raise DevRNGError(
            f"{_FORM.what}: {_SOURCE} holds the attributes "
            f"{short_repr(sorted(map(str, attributes)))} for it, not the one {_STATE!r} "
            "devrng writes: it was altered or damaged after it was written, so none of it is "
            "loaded. Resume from an intact checkpoint.")
    sealed: Mapping[str, Any] = attributes[_STATE]
    check_entry(sealed, _FORM, _FIELDS, unsealed=False, source=_SOURCE)
    return sealed


def _updates_per_epoch(loader: Any, accumulation: int) -> int | None:
    """Optimizer steps per epoch, as ``Trainer.set_initial_training_values`` counts them;
    None for a loader without a length (an ``IterableDataset``'s: ``len`` raises)."""
    try:
        batches = len(loader)
    except (TypeError, ValueError, AttributeError, NotImplementedError):
        return None
    return max(batches // accumulation + int(batches % accumulation > 0), 1)


def _valid(text: Any) -> str | None:
    """``text`` if it decodes to a state of torch's CPU generator, else None."""
    try:
        torch.Generator().set_state(_decode(text))
    except (TypeError, ValueError, RuntimeError):
        return None
    return str(text)


def _encode(state: torch.Tensor) -> str:
    return base64.b64encode(state.numpy().tobytes()).decode("ascii")


def _decode(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)
