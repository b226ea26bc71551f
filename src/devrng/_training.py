"""``TrainingRNG``: every random generator of one training process, made to be checkpointed.

A training run draws from the global generators of the CPU and every device,
from Python's and NumPy's, from the DataLoader's generator (shuffling and
worker seeds), from ``seeded_jit`` streams and ``RNGStreams``. ``TrainingRNG``
seeds them at the start, collects their states into one plain dict per rank,
and puts them all back -- checked in full first, all or nothing -- so that a
run resumed in a fresh process continues bitwise as the uninterrupted run.
"""

from __future__ import annotations

import logging
import os
import secrets
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch

from devrng._determinism import DeterministicHandle, deterministic
from devrng._errors import DevRNGError, add_note, check_flags, short_repr
from devrng._lazy import load
from devrng._plain import check_plain
from devrng._rank import process_rank, world_size
from devrng._registry import available_backends, device_count, get_backend, is_initialized
from devrng._seeds import check_seed, nth_seed
from devrng._state import RNGState, get_rng_state, manual_seed, prepare_restore, set_rng_state
from devrng._workers import dataloader_kwargs

__all__ = ["TrainingRNG"]

_FORMAT = "devrng.TrainingRNG"
_VERSION = 1
_KEYS = frozenset({"format", "version", "seed", "rank", "world_size", "rng", "generators",
                   "tracked"})
_SEED_VARIABLES = ("DEVRNG_SEED", "PL_GLOBAL_SEED")  # read in this order; DEVRNG_SEED is written
_PORTABLE_STREAM = 1 << 34  # nth_seed index of the run's portable stream (loaders use 2**32 + i)
_logger = logging.getLogger("devrng")
_scratch = torch.Generator()  # generator states are tried here before any is set


class TrainingRNG:
    """The RNG of one training process: seeded at once, checkpointed as one plain dict.

    ``TrainingRNG(seed)`` seeds the CPU, every available device type (XLA and
    torchax included), Python and NumPy. Without ``seed`` it takes
    ``DEVRNG_SEED`` (or Lightning's ``PL_GLOBAL_SEED``) from the environment,
    else draws one from OS entropy; it logs the seed on the ``"devrng"``
    logger and exports it as ``DEVRNG_SEED`` for processes started later.
    ``deterministic=True`` also applies [`deterministic()`][devrng.deterministic].
    ``per_rank=True`` seeds each distributed rank with its own
    ``devrng.distributed.rank_seed`` (by default every rank gets ``seed``, as
    with Lightning's ``seed_everything``; DataLoader workers differ per rank
    either way).

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

    def __init__(self, seed: int | None = None, *, deterministic: bool = False,
                 per_rank: bool = False) -> None:
        check_flags(deterministic=deterministic, per_rank=per_rank)
        seed, source = _resolve_seed(seed)
        self._seed = seed
        self._per_rank = per_rank
        self._generators: dict[str, torch.Generator] = {}
        self._tracked: dict[str, Any] = {}
        self.determinism: DeterministicHandle | None = None
        _logger.info("devrng.TrainingRNG: seed %d (%s)", seed, source)
        os.environ["DEVRNG_SEED"] = str(seed)
        if deterministic:
            self.determinism = _apply_determinism()
        manual_seed(self._process_seed(process_rank()))

    @property
    def seed(self) -> int:
        """The run's seed (after ``load_state_dict``, the seed of the run it resumed)."""
        return self._seed

    def _process_seed(self, rank: int) -> int:
        return nth_seed(self._seed, rank) if self._per_rank else self._seed

    def __repr__(self) -> str:
        tracked = ", ".join([*self._generators, *self._tracked]) or "nothing"
        return f"TrainingRNG(seed={self._seed}, tracking {tracked})"

    # -- what it covers ---------------------------------------------------------
    def dataloader_kwargs(self, worker_init_fn: Callable[[int], Any] | None = None
                          ) -> dict[str, Any]:
        """``generator`` and ``worker_init_fn`` for one ``torch.utils.data.DataLoader``.

        The generator decides shuffling and each epoch's worker seeds; it is
        part of this object's state. Each call makes a new one (the k-th is
        seeded from the run's seed and k). Workers are seeded by
        [`seed_worker`][devrng.seed_worker], then ``worker_init_fn`` runs.

        Examples:
            >>> rng = devrng.TrainingRNG(seed=0)
            >>> sorted(rng.dataloader_kwargs())
            ['generator', 'worker_init_fn']
        """
        index = len(self._generators)
        kwargs = dataloader_kwargs(nth_seed(self._seed, (1 << 32) + index),
                                   worker_init_fn=worker_init_fn)
        self._generators[f"dataloader{index}"] = kwargs["generator"]
        return kwargs

    def track(self, name: str, obj: Any) -> Any:
        """Add ``obj`` (anything with ``state_dict()`` / ``load_state_dict()``, or a
        ``torch.Generator``) to the state under ``name``; returns ``obj``.

        Examples:
            >>> rng = devrng.TrainingRNG(seed=0)
            >>> g = rng.track("noise", torch.Generator().manual_seed(3))
        """
        if not isinstance(name, str) or not name:
            raise TypeError(f"track needs a non-empty string name, not {short_repr(name)}.")
        if name in self._tracked or name in self._generators:
            raise ValueError(f"TrainingRNG already tracks an object named {name!r}; choose "
                             "another name.")
        plain_generator = isinstance(obj, torch.Generator)
        if not plain_generator and not (callable(getattr(obj, "state_dict", None))
                                        and callable(getattr(obj, "load_state_dict", None))):
            raise TypeError(
                f"TrainingRNG.track({name!r}, ...) got a {type(obj).__name__}, which has no "
                "state_dict() and load_state_dict(); pass a torch.Generator, a SeededFunction, "
                "an RNGStreams, a StatefulDataLoader or another object with both methods."
            )
        if plain_generator:
            self._generators[name] = obj
        else:
            self._tracked[name] = obj
        return obj

    def portable(self, *, strict: bool = True) -> Any:
        """A [`portable`][devrng.portable] stream for the run, tracked as ``"portable"``.

        Its seed comes from the run's seed (the same on every rank, as a
        DTensor's shards need), and its counter is part of this object's
        state: a resumed run continues the stream exactly, also on another
        world size (``load_state_dict(..., strict=False)`` restores tracked
        objects from any rank's state; every rank's stream is the same).

        Examples:
            >>> rng = devrng.TrainingRNG(seed=0)
            >>> stream = rng.portable()
            >>> with stream:
            ...     mask = torch.nn.functional.dropout(torch.ones(4), 0.5)
            >>> rng.state_dict()["tracked"]["portable"]["counter"]
            1
        """
        make = load("devrng._portable:portable", what="TrainingRNG.portable")
        return self.track("portable", make(nth_seed(self._seed, _PORTABLE_STREAM),
                                           strict=strict))

    # -- state ------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """This process's RNG as plain data that ``torch.load(weights_only=True)`` reads.

        Holds the global generators (CPU, every started device, Python, NumPy),
        every DataLoader generator and every tracked object's state. One per
        rank: save each rank's next to its model shard.

        Examples:
            >>> sorted(devrng.TrainingRNG(seed=0).state_dict())
            ['format', 'generators', 'rank', 'rng', 'seed', 'tracked', 'version', 'world_size']
        """
        rank, world = _rank_and_world()
        tracked = {}
        for name, obj in self._tracked.items():
            state = obj.state_dict()
            check_plain(state, f"the state of the tracked object {name!r}")
            tracked[name] = state
        return {
            "format": _FORMAT,
            "version": _VERSION,
            "seed": self._seed,
            "rank": rank,
            "world_size": world,
            "rng": get_rng_state(device_type=_started_types()).to_dict(),
            "generators": {name: g.get_state() for name, g in self._generators.items()},
            "tracked": tracked,
        }

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> None:
        """Put back everything ``state_dict()`` saved: all of it, or, on any error, nothing.

        Everything that can be checked without changing state is checked first
        (format, keys, device types and counts, every generator state); tracked
        objects are loaded next and put back if anything later fails.

        ``strict=False`` resumes where the run cannot continue exactly: on
        another number of devices, another rank or world size, or with objects
        tracked or untracked since. States of devices that still exist are
        restored, and the rest are seeded from the run's seed and this rank; a
        state saved by another rank restores its DataLoader generators and
        tracked objects, but this rank's global generators are seeded anew from
        the seed and this rank (two ranks must never share a stream). A warning
        lists everything that was not restored.

        Examples:
            >>> rng = devrng.TrainingRNG(seed=5)
            >>> saved = rng.state_dict()
            >>> a = torch.rand(2)
            >>> rng.load_state_dict(saved)
            >>> torch.equal(a, torch.rand(2))
            True
        """
        check_flags(strict=strict)
        plan = _Loading(self, state_dict, strict)
        plan.check()
        plan.apply()


class _Loading:
    """One ``load_state_dict`` call: every check first, then every change, undone on failure."""

    def __init__(self, rng: TrainingRNG, data: Mapping[str, Any], strict: bool) -> None:
        self.rng = rng
        self.data = data
        self.strict = strict
        self.skipped: list[str] = []
        self.reseed_types: list[str] = []

    def fail(self, problem: str) -> DevRNGError:
        hint = "" if not self.strict else (
            " Pass strict=False to resume anyway with a warning listing what was not restored.")
        return DevRNGError(f"TrainingRNG.load_state_dict: {problem}.{hint}")

    # -- checks -------------------------------------------------------------------
    def check(self) -> None:
        data = self.data
        if not isinstance(data, Mapping) or data.get("format") != _FORMAT:
            tag = data.get("format") if isinstance(data, Mapping) else type(data).__name__
            raise DevRNGError(
                f"TrainingRNG.load_state_dict takes what TrainingRNG.state_dict() returns (format "
                f"{_FORMAT!r}), not {short_repr(tag)}."
            )
        if data.get("version") != _VERSION:
            raise DevRNGError(f"TrainingRNG.load_state_dict: the state is version "
                              f"{short_repr(data.get('version'))}; this devrng reads {_VERSION}.")
        keys = set(data)
        if keys != _KEYS:
            extra, missing = sorted(keys - _KEYS, key=str), sorted(_KEYS - keys)
            if missing:
                raise DevRNGError(f"TrainingRNG.load_state_dict: the state lacks {missing}.")
            if self.strict:
                raise self.fail(f"the state has unknown keys {extra}")
            self.skipped.append(f"unknown keys {extra}")
        try:
            self.seed = check_seed(data["seed"], "the saved seed")
        except (TypeError, ValueError) as err:
            raise DevRNGError(f"TrainingRNG.load_state_dict: {err}") from None
        self._check_rank()
        self.state = RNGState.from_dict(data["rng"], source="the saved global RNG state")
        self._check_names("generators", data["generators"], self.rng._generators)
        self._check_names("tracked", data["tracked"], self.rng._tracked)
        for name, saved in data["generators"].items():
            if name in self.rng._generators:
                try:
                    _scratch.set_state(saved)
                except (RuntimeError, TypeError) as err:
                    raise DevRNGError(
                        f"TrainingRNG.load_state_dict: the saved state of generator {name!r} is "
                        f"not a CPU generator state ({err})."
                    ) from None
        if self.same_rank:
            self.state = self._devices_that_fit(self.state)
            self.restore = prepare_restore(self.state)

    def _check_rank(self) -> None:
        rank, world = _rank_and_world()
        saved_rank, saved_world = self.data["rank"], self.data["world_size"]
        self.same_rank = saved_rank == rank
        if saved_rank == rank and saved_world == world:
            return
        problem = (f"the state was saved by rank {saved_rank} of {saved_world}, and this is rank "
                   f"{rank} of {world}")
        if self.strict:
            raise self.fail(problem)
        if not self.same_rank:
            self.skipped.append(f"the global generators of rank {saved_rank} ({problem}; this "
                                "rank's are seeded from the seed and its rank)")

    def _check_names(self, what: str, saved: Any, here: Mapping[str, Any]) -> None:
        if not isinstance(saved, Mapping):
            raise DevRNGError(f"TrainingRNG.load_state_dict: the saved {what} are not a dict.")
        problems = []
        missing, unknown = sorted(set(here) - set(saved)), sorted(set(saved) - set(here))
        if missing:
            problems.append(f"nothing was saved for the {what} {missing} tracked here")
        if unknown:
            problems.append(f"the saved {what} {unknown} are not tracked here")
        if problems and self.strict:
            raise self.fail("; ".join(problems))
        self.skipped += problems

    def _devices_that_fit(self, state: RNGState) -> RNGState:
        """``state`` without the devices this process lacks (strict=False only)."""
        kept: dict[str, dict[int, Any]] = {}
        available = set(available_backends())
        for name, per in state.devices.items():
            backend = None if name not in available else get_backend(name)
            count = 0 if backend is None else device_count(backend)
            fits = {i: s for i, s in per.items() if i < count}
            lost = sorted(set(per) - set(fits))
            if lost and self.strict:
                raise self.fail(f"the state holds {name} devices {lost}, and this process has "
                                f"{count} {name} device(s)")
            if lost:
                self.skipped.append(f"{name} devices {lost} (this process has {count})")
            if fits:
                kept[name] = fits
            if backend is not None and len(fits) < count:
                if self.strict:
                    raise self.fail(f"this process has {count} {name} device(s), and the state "
                                    f"holds {len(fits)}")
                self.reseed_types.append(name)
                self.skipped.append(f"{name} devices {sorted(set(range(count)) - set(fits))} "
                                    "(none saved: seeded from the seed and this rank)")
        for name in sorted(set(_started_types()) - set(state.devices)):
            if self.strict:
                raise self.fail(f"this process uses {name} devices, and the state holds none")
            self.reseed_types.append(name)
            self.skipped.append(f"{name} devices (none saved: seeded from the seed and this rank)")
        return RNGState(state.cpu, kept, state.python, state.numpy)

    # -- changes ----------------------------------------------------------------
    def apply(self) -> None:
        rng, data = self.rng, self.data
        old_tracked = {name: obj.state_dict() for name, obj in rng._tracked.items()}
        old_generators = {name: g.get_state() for name, g in rng._generators.items()}
        done: list[str] = []
        try:
            for name, obj in rng._tracked.items():
                if name in data["tracked"]:
                    obj.load_state_dict(data["tracked"][name])
                    done.append(name)
                    _materialise(obj)
            # Generators after the tracked loaders: a resumed StatefulDataLoader sets its
            # generator back to the start of the epoch when it makes its iterator.
            for name, g in rng._generators.items():
                if name in data["generators"]:
                    g.set_state(data["generators"][name])
            rank = process_rank()
            if not self.same_rank:
                # Another rank's streams must not be shared: derive this rank's own.
                manual_seed(nth_seed(self.seed, rank))
            else:
                if self.reseed_types:
                    before = get_rng_state(device_type=self.reseed_types, python=False,
                                           numpy=False)
                    manual_seed(nth_seed(self.seed, (1 << 33) + rank),
                                device_type=self.reseed_types, python=False, numpy=False)
                try:
                    self.restore.apply()
                except BaseException:
                    if self.reseed_types:
                        set_rng_state(before)
                    raise
        except BaseException as err:
            for name in done:
                try:
                    rng._tracked[name].load_state_dict(old_tracked[name])
                except Exception as undo_err:  # reported with the first error
                    add_note(err, f"putting back the tracked object {name!r} failed too: "
                                  f"{undo_err}")
            for name, state in old_generators.items():
                rng._generators[name].set_state(state)
            if isinstance(err, Exception) and not isinstance(err, DevRNGError):
                raise DevRNGError(
                    f"TrainingRNG.load_state_dict failed ({type(err).__name__}: {err}); the "
                    "tracked objects and generators were put back."
                ) from err
            raise
        rng._seed = self.seed
        os.environ["DEVRNG_SEED"] = str(self.seed)
        if self.skipped:
            warnings.warn("TrainingRNG.load_state_dict(strict=False) did not restore: "
                          + "; ".join(self.skipped) + ".", UserWarning, stacklevel=3)


def _materialise(obj: Any) -> None:
    """Make a loaded StatefulDataLoader build its resumed iterator now (its own
    ``state_dict()`` does that), so that it resets its generator before we set it."""
    if isinstance(obj, torch.utils.data.DataLoader) and hasattr(obj, "next_iter_state"):
        obj.state_dict()  # type: ignore[attr-defined]


def _resolve_seed(seed: int | None) -> tuple[int, str]:
    if seed is not None:
        return check_seed(seed), "given"
    for variable in _SEED_VARIABLES:
        raw = os.environ.get(variable, "").strip()
        if raw:
            try:
                return check_seed(int(raw), variable), f"from {variable}"
            except (TypeError, ValueError):
                raise ValueError(
                    f"The {variable} environment variable is {raw!r}, which is not a seed; set "
                    "it to an int in [0, 2**64) or unset it."
                ) from None
    return secrets.randbits(32), "drawn from OS entropy"


def _rank_and_world() -> tuple[int, int]:
    return process_rank(), world_size()


def _started_types() -> list[str]:
    """Device types whose state exists now (never start one to read it)."""
    return [name for name in available_backends()
            if name != "cpu" and is_initialized(get_backend(name))]


def _apply_determinism() -> DeterministicHandle:
    return deterministic()
