"""``TrainingRNG``: every random generator of one training process, made to be checkpointed.

A training run draws from the global generators of the CPU and every device,
from Python's and NumPy's, from the DataLoader's generator (shuffling and
worker seeds), from ``seeded_jit`` streams and ``RNGStreams``. ``TrainingRNG``
seeds them at the start, collects their states into one plain dict per rank,
and puts them all back -- checked in full first, all or nothing -- so that a
run resumed in a fresh process continues bitwise as the uninterrupted run.
"""

from __future__ import annotations

import copy
import functools
import logging
import os
import re
import secrets
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch

from devrng._backends.registry import started_types
from devrng._base.errors import DevRNGError, check_flags, short_repr, warn_and_log
from devrng._base.lazy import load
from devrng._base.rank import process_rank, world_size
from devrng._base.seeds import (
    SEED_VARIABLES,
    check_seed,
    loader_seed,
    portable_seed,
    rank_seed,
    reseed_seed,
    seed_from_environment,
)
from devrng._base.sigint import deliver, guard
from devrng._checks.compare import LOADER_PREFIX
from devrng._checks.digest import generator_fingerprint, state_fingerprint
from devrng._checks.record import FLIGHT_VARIABLE, FlightRecord, global_sources, new_key
from devrng._generators.ranks.protocol import (
    SAVE,
    Apply,
    Loader,
    Summary,
    is_ranked,
    load_ranked,
    nested_state,
    ranked,
    ranks_text,
    stamp,
)
from devrng._generators.saved import (
    SEAL_KEYS,
    SavedForm,
    check_plain,
    check_saved,
    encode,
    fit_devices,
    read_saved,
    refusing,
    seal,
)
from devrng._generators.seeding import reseed
from devrng._generators.snapshot import Restore, get_rng_state, prepare_restore, read_snapshot
from devrng._generators.undo import Undo
from devrng._training.determinism import DeterministicHandle
from devrng._training.determinism import deterministic as turn_on_determinism
from devrng._training.loaders import (
    EpochStart,
    EpochStarts,
    describe,
    feeding_loader,
    is_stateful,
    place_for_workers,
    replays_sampler,
    resume_problems,
    saved_place,
    unreplayable_problem,
    warn_on_resume,
)
from devrng._training.workers import dataloader_kwargs

__all__ = ["TrainingRNG", "generator_states", "load_training_state", "set_generator_states",
           "start_flight_record", "tracked_loaders"]

# Version 3 carries a digest of its content; 1 and 2 load unchecked.
_FORM = SavedForm("devrng.TrainingRNG", (1, 2, 3), 3, "TrainingRNG.load_state_dict",
                  "TrainingRNG.state_dict()", own=("tracked",), generators=("generators",))
_KEYS = frozenset({"format", "version", "seed", "rank", "world_size", "rng", "generators",
                   "tracked", "loaders"})
# Version 1 (devrng 0.1) has no loader records; 3 (devrng 0.4) is sealed (``seal``).
_KEYS_OF = {1: _KEYS - {"loaders"}, 2: _KEYS, 3: _KEYS | SEAL_KEYS}
_OPTIONAL = frozenset({SAVE})  # an entry's save identity (devrng 0.4 and before wrote none)
# Keys a state holds only when it has something to say: "epoch_starts", the generators
# each loader that replays its sampler made its epoch's iterator from.
# "flight": the key this save drew for the flight record (devrng 0.5; only with a record on).
_OPTIONAL_OF = {1: frozenset(), 2: frozenset({"epoch_starts"}),
                3: frozenset({"epoch_starts", "flight"})}
_LOADER_NAME = re.compile(r"dataloader\d+")  # the generators dataloader_kwargs() makes
_logger = logging.getLogger("devrng")
_ENTROPY = "drawn from OS entropy"
# How a program that loads through torch.distributed.checkpoint resumes anyway.
_LENIENT = "strict=False (TrainingRNG(..., strict=False) when torch.distributed.checkpoint loads it)"


class TrainingRNG:
    """The RNG of one training process: seeded at once, checkpointed as one plain dict.

    ``TrainingRNG(seed)`` seeds the CPU, every available device type (XLA and
    torchax included), Python and NumPy at once. It logs the seed on the
    ``"devrng"`` logger and exports it as ``DEVRNG_SEED`` for processes
    started later. Save ``state_dict()`` with each checkpoint and call
    ``load_state_dict`` on resume: the resumed run draws bitwise what the
    uninterrupted run drew.

    Args:
        seed: An int in ``[0, 2**64)``. ``None`` takes ``DEVRNG_SEED`` (or
            Lightning's ``PL_GLOBAL_SEED``) from the environment, else draws
            one from OS entropy.
        deterministic: Also apply ``deterministic()`` (every determinism
            switch; the handle is the ``determinism`` attribute).
        per_rank: Seed each distributed rank with its own
            ``devrng.distributed.rank_seed``. By default every rank gets
            ``seed``, as with Lightning's ``seed_everything``; DataLoader
            workers differ per rank either way.
        strict: What ``load_state_dict`` does when called without ``strict``
            (as ``torch.distributed.checkpoint.load`` calls it): ``False``
            resumes on another world size or device count with a warning.
        flight_record: A directory (``True``: the current one) where the run keeps
            its flight record: what each optimizer step drew and consumed, so that a
            resumed run verifies that it continues the interrupted one and names the
            first step where it does not (``rng.flight``). Off by default;
            ``DEVRNG_FLIGHT_RECORD`` in the environment turns it on, there.

    Raises:
        TypeError: ``seed`` is not an int, or a flag is not ``True`` / ``False``.
        ValueError: ``seed`` (or the environment variable) is not a seed in
            ``[0, 2**64)``.

    Examples:
        >>> rng = devrng.TrainingRNG(seed=1234)
        >>> loader = torch.utils.data.DataLoader(range(8), shuffle=True,
        ...                                      **rng.dataloader_kwargs())
        >>> state = rng.state_dict()          # save it with the model checkpoint
        >>> first = [int(b) for b in loader]
        >>> rng.load_state_dict(state)        # ... in a resumed process
        >>> first == [int(b) for b in loader]
        True
    """

    @guard
    def __init__(self, seed: int | None = None, *, deterministic: bool = False,
                 per_rank: bool = False, strict: bool = True,
                 flight_record: str | os.PathLike[str] | bool | None = None) -> None:
        """Seed everything now; the arguments are described in ``help(devrng.TrainingRNG)``."""
        check_flags(deterministic=deterministic, per_rank=per_rank, strict=strict)
        directory = _flight_directory(flight_record)
        seed, source = _resolve_seed(seed)
        self._seed = seed
        self._seed_chosen = source != _ENTROPY  # a checkpoint of another seed: refused or warned
        self._per_rank = per_rank
        self.strict = strict
        self._generators: dict[str, torch.Generator] = {}
        self._tracked: dict[str, Any] = {}
        self._loaders: dict[str, Any] = {}  # tracked DataLoaders, described in the state
        self._epoch_starts: dict[str, EpochStarts] = {}  # tracked loaders that replay a sampler
        self.determinism: DeterministicHandle | None = None
        self._flight: FlightRecord | None = None
        # All or nothing: the exported seed, the determinism switches and the seeding. (No
        # `with`: an interrupt after it, before the caller has this object, must undo too.)
        if directory is not None:  # first: a directory that cannot be written changes nothing
            start_flight_record(self, directory)
        undo = Undo("TrainingRNG")
        try:
            if self._flight is not None:
                undo.push("the flight record", self._stop_flight)
            undo.set_env("DEVRNG_SEED", str(seed))
            if deterministic:
                undo.push("deterministic()", self._drop_determinism)
                self.determinism = turn_on_determinism()
            reseed(undo, self._process_seed(process_rank()))
            _logger.info("devrng.TrainingRNG: seed %d (%s)", seed, source)
            deliver()  # a Ctrl-C noted meanwhile: the caller never gets this object: undo below
        except BaseException as err:
            undo.roll_back(err)
            deliver()
            raise

    def _drop_determinism(self) -> None:
        if self.determinism is not None:
            self.determinism.restore()
            self.determinism = None

    @property
    def seed(self) -> int:
        """The run's seed (after ``load_state_dict``, the seed of the run it resumed)."""
        return self._seed

    @property
    def flight(self) -> FlightRecord | None:
        """The run's flight record (``flight_record=``), or None when it is off.

        ``rng.flight.loss(loss)`` adds a step's loss to its line; after a resume,
        ``rng.flight.verified`` is True once every step the interrupted run recorded
        past the checkpoint matched.
        """
        return self._flight

    def _stop_flight(self) -> None:
        if self._flight is not None:
            self._flight.close()
            self._flight = None

    def _flight_sources(self) -> list[tuple[str, Callable[[], Any]]]:
        """What the flight record fingerprints at each step's start: the global generators,
        the DataLoaders' and tracked generators, the samplers' own, devrng's seed streams."""
        found = global_sources()
        for name, g in self._generators.items():
            marked = LOADER_PREFIX + name if _LOADER_NAME.fullmatch(name) else name
            found.append((marked, functools.partial(generator_fingerprint, g)))
        for name, loader in self._loaders.items():
            sampler = getattr(loader, "sampler", None)
            own = getattr(sampler, "generator", None)
            if isinstance(own, torch.Generator) and own is not getattr(loader, "generator", None):
                found.append((f"{LOADER_PREFIX}{name}.sampler",
                              functools.partial(generator_fingerprint, own)))
        for name, obj in self._tracked.items():
            if type(obj).__name__ in _CHEAP_STATES:
                found.append((name, functools.partial(_tracked_fingerprint, obj)))
        return found

    def _process_seed(self, rank: int) -> int:
        return rank_seed(self._seed, rank) if self._per_rank else self._seed

    def __repr__(self) -> str:
        names = dict.fromkeys([*self._generators, *self._tracked, *self._loaders])
        tracked = ", ".join(names) or "nothing"
        return f"TrainingRNG(seed={self._seed}, tracking {tracked})"

    # -- what it covers ---------------------------------------------------------
    def dataloader_kwargs(self, worker_init_fn: Callable[[int], Any] | None = None
                          ) -> dict[str, Any]:
        """``generator`` and ``worker_init_fn`` for one ``torch.utils.data.DataLoader``.

        The generator decides shuffling and each epoch's worker seeds; it is
        part of this object's state. Each call makes a new one (the k-th is
        seeded from the run's seed and k). Workers are seeded by
        ``seed_worker``, then ``worker_init_fn`` runs.

        Args:
            worker_init_fn: Your own worker initialiser, run after devrng's.

        Returns:
            ``{"generator": ..., "worker_init_fn": ...}``: pass it as
            ``DataLoader(..., **kwargs)``.

        Examples:
            >>> rng = devrng.TrainingRNG(seed=0)
            >>> sorted(rng.dataloader_kwargs())
            ['generator', 'worker_init_fn']
        """
        index = len(self._generators)
        kwargs = dataloader_kwargs(loader_seed(self._seed, index),
                                   worker_init_fn=worker_init_fn)
        self._generators[f"dataloader{index}"] = kwargs["generator"]
        return kwargs

    def track(self, name: str, obj: Any) -> Any:
        """Add ``obj`` to the state under ``name``; returns ``obj``.

        A tracked ``DataLoader`` (torch's, or torchdata's ``StatefulDataLoader``,
        whose position is saved and restored too) is also described in the state
        -- kind, batch size, workers -- so that a resume that cannot continue
        exactly (another batch size or number of workers, workers kept across
        epochs, workers that drew outside ``sample_rng`` before a checkpoint inside
        an epoch) warns with a ``DevRNGWarning`` that says why. For a
        ``StatefulDataLoader`` whose sampler keeps no place of its own (torchdata
        draws it again to find its place), the generators of each epoch's start are
        saved too, so that it resumes inside an epoch exactly.

        Args:
            name: A non-empty string, unique in this ``TrainingRNG``; the
                resumed run must track the same names.
            obj: A ``torch.Generator``, a ``DataLoader``, or anything with
                ``state_dict()`` and ``load_state_dict()``: a ``SeededFunction``,
                ``RNGStreams``, torchdata's ``StatefulDataLoader``, ... A
                torch_xla ``MpDeviceLoader`` (what accelerate's ``prepare``
                returns on XLA) is tracked by the DataLoader it feeds from.

        Returns:
            ``obj``, so that ``step = rng.track("step", seeded_jit(...))`` reads
            as one line.

        Raises:
            TypeError: ``name`` is not a non-empty string, ``obj`` has no
                state to save, or it is a model, optimizer or LR scheduler
                (their state belongs in the checkpoint beside devrng's).
            ValueError: ``name`` is tracked already.

        Examples:
            >>> rng = devrng.TrainingRNG(seed=0)
            >>> g = rng.track("noise", torch.Generator().manual_seed(3))
            >>> loader = rng.track("loader", torch.utils.data.DataLoader(
            ...     range(8), batch_size=4, shuffle=True, **rng.dataloader_kwargs()))
        """
        if not isinstance(name, str) or not name:
            raise TypeError(f"track needs a non-empty string name, not {short_repr(name)}.")
        if _LOADER_NAME.fullmatch(name):
            raise ValueError(
                f"TrainingRNG.track: the name {name!r} is kept for the generators "
                "dataloader_kwargs() makes ('dataloader0', 'dataloader1', ...); choose another."
            )
        if name in self._tracked or name in self._generators or name in self._loaders:
            raise ValueError(f"TrainingRNG already tracks an object named {name!r}; choose "
                             "another name.")
        _refuse_training_state(name, obj)
        given, obj = obj, feeding_loader(obj)
        plain_generator = isinstance(obj, torch.Generator)
        loader = isinstance(obj, torch.utils.data.DataLoader)
        stateful = is_stateful(obj)
        if not plain_generator and not loader and not stateful:
            raise TypeError(
                f"TrainingRNG.track({name!r}, ...) got {short_repr(given)} (of type "
                f"{type(given).__name__}), which has no state_dict() and load_state_dict(); pass a "
                "torch.Generator, a DataLoader, a SeededFunction, an RNGStreams or another "
                "object with both methods."
            )
        if plain_generator:
            self._generators[name] = obj
        elif stateful:
            self._tracked[name] = obj
        if loader:
            self._loaders[name] = obj
            if stateful:  # (watched by each epoch's iterator: resumes make theirs late)
                watch = EpochStarts.watch(obj)
                if replays_sampler(obj):
                    self._epoch_starts[name] = watch
            if self._flight is not None:
                self._flight.watch(name, obj)
        return given

    def portable(self, *, strict: bool = True) -> Any:
        """A ``portable`` stream for the run, tracked as ``"portable"``.

        Its seed comes from the run's seed (the same on every rank, as a
        DTensor's shards need), and its counter is part of this object's
        state: a resumed run continues the stream exactly, also on another
        world size (``load_state_dict(..., strict=False)`` restores tracked
        objects from any rank's state; every rank's stream is the same).

        Args:
            strict: As for ``portable``: refuse random ops the stream does not
                cover, or let them draw natively with a warning.

        Returns:
            The ``PortableRNG``, to use as ``with stream:``.

        Raises:
            ValueError: This object already tracks something named ``"portable"``.

        Examples:
            >>> rng = devrng.TrainingRNG(seed=0)
            >>> stream = rng.portable()
            >>> with stream:
            ...     mask = torch.nn.functional.dropout(torch.ones(4), 0.5)
            >>> stream.counter                  # saved with rng.state_dict()
            1
        """
        make = load("devrng._portable.rng:portable", what="TrainingRNG.portable")
        return self.track("portable", make(portable_seed(self._seed),
                                           strict=strict))

    # -- state ------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """This process's RNG, under a key that names its rank: ``{"devrng_rank_<r>": bytes}``.

        The bytes are what ``torch.save`` makes of a versioned dict of plain
        data (``torch.load(io.BytesIO(b), weights_only=True)`` reads it): the
        global generators (CPU, every started device, Python, NumPy), every
        DataLoader generator, every tracked object's state and the identity of
        this save, with the devrng version and a SHA-256 digest of it all, which
        ``load_state_dict`` verifies before anything changes. The rank in the key
        keeps every rank's state apart in a ``torch.distributed.checkpoint`` save
        (``dcp.save({"rng": rng, ...})``), and the state is taken when this is
        called (also by ``dcp.async_save``). Save one per rank with
        ``torch.save``, or all of them with DCP. In a job of several processes
        every process calls this, as ``dcp.save`` does: the ranks agree on the
        save's identity (one small ``all_reduce``), by which a load refuses
        entries of different saves.

        Returns:
            ``{"devrng_rank_<this rank>": bytes}``.

        Examples:
            >>> list(devrng.TrainingRNG(seed=0).state_dict())
            ['devrng_rank_0']
        """
        tracked = {}
        for name, obj in self._tracked.items():
            state = nested_state(obj)  # devrng's own objects: their plain state
            check_plain(state, f"the state of the tracked object {name!r}")
            tracked[name] = state
        plain = {
            "format": _FORM.tag,
            "version": _FORM.version,
            "seed": self._seed,
            "rank": process_rank(),
            "world_size": world_size(),
            "rng": get_rng_state(device_type=started_types()).to_dict(),
            "generators": {name: g.get_state() for name, g in self._generators.items()},
            "tracked": tracked,
            "loaders": {name: describe(loader) for name, loader in self._loaders.items()},
        }
        starts = {name: watch.last.to_dict() for name, watch in self._epoch_starts.items()
                  if watch.last is not None}
        if starts:
            plain["epoch_starts"] = starts
        key = None
        if self._flight is not None:  # a key of this save's own: no other run's record has it
            key = plain["flight"] = new_key()
        state = ranked(encode(seal(stamp(plain, self))))
        if key is not None:
            self._flight.checkpoint(key)  # type: ignore[union-attr]
        return state

    @guard
    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool | None = None) -> None:
        """Put back everything ``state_dict()`` saved: all of it, or, on any error, nothing.

        Everything that can be checked without changing state is checked first
        (format, keys, device types and counts, every generator state); tracked
        objects are loaded next and put back if anything later fails.

        In a job of several processes, every process calls this (as
        ``torch.distributed.checkpoint.load`` does): the ranks check their
        states together, and all of them load or all of them raise the error
        of the lowest rank that cannot (naming it); on another world size each
        rank warns of what was seeded afresh on any rank.

        ``strict=False`` resumes where the run cannot continue exactly: on
        another number of devices, another rank or world size, or with objects
        tracked or untracked since. States of devices that still exist are
        restored, and the rest are seeded from the run's seed and this rank; a
        state saved by another rank restores its DataLoader generators and
        tracked objects, but this rank's global generators are seeded anew from
        the seed and this rank (two ranks must never share a stream). A warning
        lists everything that was not restored.

        Args:
            state_dict: What ``TrainingRNG.state_dict`` returned (read back with
                ``torch.load(path, weights_only=True)`` or filled in by
                ``dcp.load``), or the dict devrng 0.1 saved.
            strict: ``False`` resumes with a warning where the run cannot
                continue exactly (see above); ``None`` takes the ``strict``
                the object was made with.

        Raises:
            DevRNGError: The state does not fit (another format or version,
                missing or unknown keys, other devices, rank, world size or
                tracked names with ``strict=True``, another run's seed, a corrupt
                generator state, a state changed after it was saved: its digest)
                -- here or, in a job of several processes, on any rank. Nothing
                changed on any rank.

        Examples:
            >>> rng = devrng.TrainingRNG(seed=5)
            >>> saved = rng.state_dict()
            >>> a = torch.rand(2)
            >>> rng.load_state_dict(saved)
            >>> torch.equal(a, torch.rand(2))
            True
        """
        try:
            strict = self.strict if strict is None else strict
            check_flags(strict=strict)
            if is_ranked(state_dict):
                load_ranked(state_dict, self, Loader(
                    _FORM.what, functools.partial(read_saved, form=_FORM), ("seed",),
                    functools.partial(self._prepare, strict=strict)))
                return
            load_training_state(self, state_dict, strict=strict)
        finally:
            deliver()

    def _prepare(self, plain: Any, summary: Summary, strict: bool) -> tuple[Apply, str | None]:
        """Check one rank's plain state (its own, or the lowest rank's if the checkpoint has
        none for it) in a load of all ranks; the change, and what every rank warns of."""
        what = "TrainingRNG.load_state_dict"
        if not summary.uniform:
            raise DevRNGError(f"{what}: the checkpoint's entries hold the states of runs with "
                              "different seeds; they do not come from one run.")
        saved_world = summary.saved_world or summary.world
        missing = summary.missing
        if missing is not None and strict:
            raise DevRNGError(
                f"{what}: the checkpoint holds the states of {missing[0]} rank(s) and this job "
                f"has {summary.world}, so {ranks_text(*missing)} "
                f"{'has' if missing[0] == missing[1] else 'have'} none. Make the "
                "TrainingRNG with strict=False to resume with those ranks' generators seeded "
                "afresh (with a warning).")
        # Checks everything against this process, changes nothing (the entry was checked
        # whole when it was read).
        loading = _Loading(self, plain, strict, _LENIENT)
        if self._seed_chosen and loading.seed != self._seed and summary.world > 1:
            problem = (f"this TrainingRNG was made with seed {self._seed} and the checkpoint's "
                       f"run used seed {loading.seed}")
            if strict:
                raise DevRNGError(f"{what}: {problem}; make it with seed={loading.seed}, or "
                                  "with seed=None to take the checkpoint's seed.")
            loading.skipped.append(f"this process's seed ({problem}: the run continues with "
                                   f"seed {loading.seed})")
        if saved_world == summary.world and missing is None:
            return loading.apply, None
        warning = (f"{what}(strict=False): the checkpoint was saved by {saved_world} ranks and "
                   f"this job has {summary.world}, so every rank's global generators (CPU, "
                   "devices, Python, NumPy) were seeded afresh from the run's seed and the rank")
        if missing is not None:
            warning += (f"; {ranks_text(*missing)} had no saved state and took the DataLoader "
                        f"generators and tracked objects of the saved rank at their place (rank "
                        f"modulo {missing[0]})")
        return loading.apply, warning + "."


@guard
def load_training_state(rng: TrainingRNG, state_dict: Mapping[str, Any], *, strict: bool = True,
                        lenient: str = "strict=False") -> None:
    """``rng.load_state_dict(state_dict, strict)``, whose errors name ``lenient`` as the way
    to resume anyway: what passes strict=False where the user calls devrng (the trainer
    integrations': ``DevRNGCallback(strict=False)``, ...)."""
    try:
        check_flags(strict=strict)
        with refusing(_FORM.what):  # check, then prepare: nothing changes yet
            check_saved(state_dict, _FORM)
            loading = _Loading(rng, state_dict, strict, lenient)
        with Undo(_FORM.what) as undo:  # apply; any failure undoes it all
            loading.apply(undo)
    finally:
        deliver()


class _Loading:
    """One ``load_state_dict`` call, once its state was checked whole (``check_saved``):
    ``__init__`` prepares it, checking every part against this process without changing
    anything (first the dict's own layout, then each part by the module that owns it);
    ``apply`` makes every change, each pushed on an undo stack first, then warns of what
    was not restored and of what will not be exact."""

    def __init__(self, rng: TrainingRNG, data: Mapping[str, Any], strict: bool,
                 lenient: str) -> None:
        self.rng = rng
        self.strict = strict
        self.lenient = lenient
        self.skipped: list[str] = []
        self.hint = "" if not strict else (
            f" Pass {lenient} to resume anyway with a warning listing what was not restored.")
        self._check_keys(data)
        self.same_rank = self._check_rank(data)
        self._check_names("generators", data["generators"], rng._generators)
        self._check_names("tracked objects", data["tracked"], rng._tracked)
        self._check_tracked(data["tracked"])
        self.generators: Mapping[str, Any] = data["generators"]
        self.tracked: Mapping[str, Any] = data["tracked"]
        try:
            self.seed = check_seed(data["seed"], "the saved seed")
        except (TypeError, ValueError) as err:
            raise DevRNGError(f"TrainingRNG.load_state_dict: {err}") from None
        # What is not restored is seeded from the seed and this rank: all of it for another
        # rank's state (ranks must never share a stream), else the devices the state lacks.
        rank = process_rank()
        self.reseed_seed = (reseed_seed(self.seed, rank) if self.same_rank
                            else rank_seed(self.seed, rank))
        # A sealed state's digest, verified above, covers its snapshot: not verified again.
        state = read_snapshot(data["rng"], source="the saved global RNG state",
                              covered=data["version"] >= _FORM.sealed_since)
        self.restore: Restore | None = None  # None: another rank's state, seeded anew
        if self.same_rank:
            try:
                fit = fit_devices(state.devices, strict=strict, seed=self.reseed_seed)
            except ValueError as err:
                raise DevRNGError(f"TrainingRNG.load_state_dict: {err}.{self.hint}") from None
            self.skipped += fit.skipped
            self.restore = prepare_restore(state, fit)
        self.saved_world: int = data["world_size"]
        self.records = data.get("loaders")
        self.inside: set[str] = set()  # loaders that resume their place inside an epoch
        self.states = self._fit_places()  # the state each tracked loader loads
        self.starts = self._read_epoch_starts(data.get("epoch_starts"))
        # What the flight record knows the checkpoint by (None: saved with the record off).
        self.key = _read_key(data.get("flight"))

    def fail(self, problem: str) -> DevRNGError:
        return DevRNGError(f"TrainingRNG.load_state_dict: {problem}.{self.hint}")

    # -- check ----------------------------------------------------------------------
    def _check_keys(self, data: Mapping[str, Any]) -> None:
        version = data["version"]
        expected = _KEYS_OF[version] | (set(data) & _OPTIONAL_OF[version])
        keys = set(data) - _OPTIONAL
        if keys != expected:
            extra = sorted(map(short_repr, keys - expected))
            missing = sorted(expected - keys)
            if missing:
                raise DevRNGError(f"TrainingRNG.load_state_dict: the state lacks {missing}.")
            if self.strict:
                raise self.fail(f"the state has unknown keys {', '.join(extra)}")
            self.skipped.append(f"unknown keys {', '.join(extra)}")

    def _check_rank(self, data: Mapping[str, Any]) -> bool:
        """Whether ``data`` was saved by this rank (with ``strict``: and world size)."""
        saved_rank, saved_world = data["rank"], data["world_size"]  # (checked: check_saved)
        if saved_rank >= saved_world:
            raise DevRNGError(f"TrainingRNG.load_state_dict: the saved rank {saved_rank} is not "
                              f"a rank of the saved world size {saved_world}.")
        rank, world = process_rank(), world_size()
        if saved_rank == rank and saved_world == world:
            return True
        problem = (f"the state was saved by rank {saved_rank} of {saved_world}, and this is rank "
                   f"{rank} of {world}")
        if self.strict:
            if saved_world == world and saved_rank != rank:  # one rank's state, loaded by all
                raise DevRNGError(
                    f"TrainingRNG.load_state_dict: {problem}: every rank loads rank "
                    f"{saved_rank}'s state, as when only one rank saves (if rank == 0: "
                    "torch.save({..., 'rng': rng.state_dict()})). Each rank draws its own "
                    "streams, so each needs its own state: save every rank's state_dict() (a "
                    f"file per rank, or dcp.save), or pass {self.lenient}: rank {rank} then "
                    "seeds its generators from the seed and its rank, which resumes the run "
                    "but not the interrupted run's streams.")
            raise self.fail(problem)
        if saved_rank != rank:
            self.skipped.append(f"the global generators of rank {saved_rank} ({problem}; this "
                                "rank's are seeded from the seed and its rank)")
        return False

    def _check_names(self, what: str, saved: Any, here: Mapping[str, Any]) -> None:
        if not isinstance(saved, Mapping):
            raise DevRNGError(f"TrainingRNG.load_state_dict: the saved {what} are not a dict.")
        problems = []
        missing = sorted(set(here) - set(saved))
        extra = set(saved) - set(here)
        unknown = sorted(map(short_repr, extra))
        if missing:
            problems.append(f"nothing was saved for the {what} {', '.join(map(repr, missing))}, "
                            "which are tracked here")
        if unknown:
            problems.append(f"the checkpoint holds {what} {', '.join(unknown)}, which nothing "
                            "here tracks")
        if any(isinstance(n, str) and _LOADER_NAME.fullmatch(n) for n in [*missing, *extra]):
            problems[-1] += (" (dataloader_kwargs() makes the generators 'dataloader0', "
                             "'dataloader1', ...: call it as often, in the same order, before "
                             "load_state_dict; with Lightning, before fit, not inside "
                             "train_dataloader)")
        if problems and self.strict:
            raise self.fail("; ".join(problems))
        self.skipped += problems

    def _check_tracked(self, saved_states: Mapping[str, Any]) -> None:
        for name, obj in self.rng._tracked.items():
            saved = saved_states.get(name, ())
            if saved is None or (saved == {} and isinstance(obj, torch.utils.data.DataLoader)):
                # A StatefulDataLoader takes {} or None and silently starts the epoch over.
                raise DevRNGError(
                    f"TrainingRNG.load_state_dict: the saved state of the tracked object "
                    f"{name!r} is {short_repr(saved)}, which would start it afresh; it was saved "
                    "before "
                    "the object had a state, or by another program."
                )

    def _fit_places(self) -> dict[str, Any]:
        """The state each tracked StatefulDataLoader loads: its saved place, fitted to its
        number of workers now (``place_for_workers``); one that cannot continue its epoch
        raises (strict), or starts the epoch afresh."""
        states = {}
        for name, obj in self.rng._loaders.items():
            saved = self.tracked.get(name)
            if name not in self.rng._tracked or saved is None:
                continue
            state, problem = place_for_workers(f"the loader {name!r}", saved,
                                               int(getattr(obj, "num_workers", 0) or 0))
            if problem is not None:
                if self.strict:
                    raise self.fail(problem)
                self.skipped.append(f"the place of the loader {name!r} in its epoch ({problem}; "
                                    "it starts the epoch afresh)")
                state = {}
            states[name] = state
            place = saved_place(state)
            if place is not None and not place[2] and 0 < place[1] < _length(obj):
                self.inside.add(name)
        return states

    def _read_epoch_starts(self, saved: Any) -> dict[str, EpochStart]:
        """The saved ``EpochStart`` of each loader that resumes inside an epoch and replays its
        sampler, checked."""
        saved = saved if isinstance(saved, Mapping) else {}
        return {name: EpochStart.read(saved[name], "TrainingRNG.load_state_dict: the saved "
                                                   f"epoch start of the loader {name!r}")
                for name in self.inside if name in self.rng._epoch_starts and name in saved}

    # -- apply ----------------------------------------------------------------------
    def apply(self, undo: Undo) -> None:
        """Every change, each one's current value pushed on ``undo`` before it is made; then
        the warnings."""
        rng = self.rng
        for name, obj in rng._tracked.items():
            if name in self.tracked:
                # A copy: a state_dict() may hold the object's live tensors.
                undo.push(f"the tracked object {name!r}", obj.load_state_dict,
                          copy.deepcopy(nested_state(obj)))
                state = self.states.get(name, self.tracked[name])
                obj.load_state_dict(state)
                watch = EpochStarts.of(obj)
                if state != {} and watch is not None:  # ({}: no place; the next iterator is new)
                    # The resumed iterator is made when the loop asks for it (after its
                    # set_epoch), replaying the sampler from the generators the epoch's
                    # iterator was made from, and leaves the generators as they are then
                    # (the checkpoint's: set below); made once now too, to fail here.
                    watch.resume(obj, state, self.starts.get(name), rng._generators.values(),
                                 undo)
        # Generators after the tracked loaders: a resumed StatefulDataLoader sets its
        # generator back to the start of the epoch when it makes its iterator.
        for name, g in rng._generators.items():
            if name in self.generators:
                undo.push(f"the generator {name!r}", g.set_state, g.get_state())
                g.set_state(self.generators[name])
        if self.restore is not None:
            self.restore.apply(undo)
        else:  # another rank's state: this rank's generators seeded anew
            reseed(undo, self.reseed_seed)
        chosen = rng._seed
        undo.push("the seed", setattr, rng, "_seed", rng._seed)
        rng._seed = self.seed
        undo.set_env("DEVRNG_SEED", str(self.seed))
        # The warnings last, inside the undo: a warning turned into an error puts
        # everything back too. (Several processes refuse another seed: _prepare.)
        if rng._seed_chosen and chosen != self.seed and world_size() == 1:
            warn_and_log(f"TrainingRNG.load_state_dict: this TrainingRNG was made with seed "
                         f"{chosen} and the checkpoint's run used seed {self.seed}; it continues "
                         f"that run, with seed {self.seed}. Make it with seed={self.seed} (or "
                         "seed=None, which takes the checkpoint's) to resume without this "
                         f"warning, or do not load the checkpoint to start a run of seed {chosen}.",
                         stacklevel=4)
        if self.skipped:
            warn_and_log("TrainingRNG.load_state_dict(strict=False) did not restore: "
                         + "; ".join(self.skipped) + ".", stacklevel=4)
        unreplayable = [unreplayable_problem(f"the loader {name!r}") for name in self.inside
                        if name in rng._epoch_starts and name not in self.starts]
        warn_on_resume(resume_problems(self.saved_world, self.records, rng._loaders,
                                       self.inside) + [p for p in unreplayable if p],
                       flight=rng._flight, stacklevel=4)
        if rng._flight is not None:  # the steps from here are compared with the saved run's
            rng._flight.resume(self.key)


def start_flight_record(rng: TrainingRNG, directory: str, *, hooked: bool = False,
                        log: Callable[[str], None] | None = None) -> FlightRecord:
    """``rng``'s flight record, started in ``directory`` if it has none (``DEVRNG_FLIGHT_RECORD``
    wins); ``hooked``: a trainer integration says which batch each step consumes."""
    if rng._flight is None:
        rank = process_rank()
        rng._flight = FlightRecord(os.environ.get(FLIGHT_VARIABLE) or directory, rank=rank,
                                   sources=functools.partial(_sources_of, weakref.ref(rng)),
                                   log=log, identity={
                                       "seed": rng._seed, "rank": rank,
                                       "world_size": world_size()})
        for name, loader in rng._loaders.items():
            rng._flight.watch(name, loader)
    rng._flight.hooked = rng._flight.hooked or hooked
    if log is not None:
        rng._flight.log = log
    return rng._flight


def _sources_of(ref: weakref.ref[TrainingRNG]) -> list[tuple[str, Callable[[], Any]]]:
    # Held weakly: a record must not keep its TrainingRNG alive (an unreachable run's
    # record then goes with it, and stops counting this process's optimizer steps).
    rng = ref()
    return rng._flight_sources() if rng is not None else []


def generator_states(rng: TrainingRNG) -> dict[str, torch.Tensor]:
    """The states of ``rng``'s DataLoader and tracked generators, by name (for the trainer
    integrations, which put them back once the trainer has built its resumed loaders)."""
    return {name: g.get_state() for name, g in rng._generators.items()}


def tracked_loaders(rng: TrainingRNG) -> dict[str, Any]:
    """The DataLoaders ``rng`` tracks, by name (for the trainer integrations)."""
    return dict(rng._loaders)


def set_generator_states(rng: TrainingRNG, states: Mapping[str, torch.Tensor]) -> None:
    """Put back states that ``generator_states(rng)`` returned (names ``rng`` still tracks)."""
    for name, state in states.items():
        if name in rng._generators:
            rng._generators[name].set_state(state)


def _length(loader: Any) -> float:
    """The batches of an epoch of ``loader``, or infinity where it does not say."""
    try:
        return len(loader)
    except Exception:  # no __len__ (an iterable dataset's), or one that raises
        return float("inf")


# Tracked objects whose state_dict() is a few ints: their fingerprints are cheap each step.
_CHEAP_STATES = frozenset({"SeededFunction", "PortableRNG"})


def _tracked_fingerprint(obj: Any) -> Any:
    return state_fingerprint(nested_state(obj))  # (no save identity: no save counted)


def _read_key(key: Any) -> str | None:
    """The flight record's key of a saved state (``new_key``), checked: None or 16 hex digits."""
    if key is None or (isinstance(key, str) and len(key) == 16
                       and all(c in "0123456789abcdef" for c in key)):
        return key
    raise DevRNGError(f"TrainingRNG.load_state_dict: the state's flight record key is "
                      f"{short_repr(key)}; devrng writes 16 hexadecimal digits there, so the "
                      "state was altered.")


def _flight_directory(value: Any) -> str | None:
    """Where ``TrainingRNG(flight_record=value)`` keeps its record (None: no record)."""
    forced = os.environ.get(FLIGHT_VARIABLE, "").strip()
    if forced:
        return forced
    if value is None or value is False:
        return None
    if value is True:
        return os.getcwd()
    if isinstance(value, (str, os.PathLike)) and os.fspath(value):
        return os.fspath(value)
    raise TypeError(f"TrainingRNG(flight_record=...) takes a directory (a str or path), True "
                    f"(the current directory) or None, not {short_repr(value)}.")


def _resolve_seed(seed: int | None) -> tuple[int, str]:
    if seed is not None:
        return check_seed(seed), "given"
    for variable in SEED_VARIABLES:  # DEVRNG_SEED first: it is what TrainingRNG exports
        raw = os.environ.get(variable, "")
        if raw.strip():
            return seed_from_environment(variable, raw), f"from {variable}"
    return secrets.randbits(32), _ENTROPY


# What a training checkpoint saves next to devrng's state, never inside it: tracking one
# would copy its weights (or moments) into every RNG state and put them back on load.
_TRAINING_STATE = (("a model", torch.nn.Module), ("an optimizer", torch.optim.Optimizer),
                   ("an LR scheduler", torch.optim.lr_scheduler.LRScheduler))


def _refuse_training_state(name: str, obj: Any) -> None:
    for what, kind in _TRAINING_STATE:
        if isinstance(obj, kind):
            raise TypeError(
                f"TrainingRNG.track({name!r}, ...) got {what} ({type(obj).__name__}), whose "
                "state belongs in your checkpoint next to devrng's, not inside it: save its "
                "state_dict() beside rng.state_dict() (torch.save({'model': ..., 'rng': "
                "rng.state_dict()}, path)) and load it back yourself. Track only what draws "
                "random numbers: a torch.Generator, a DataLoader, a SeededFunction, an "
                "RNGStreams, ..."
            )
