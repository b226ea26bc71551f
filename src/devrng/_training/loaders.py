"""What a resume needs to know about a run's data loaders, and what devrng says when it cannot be exact.

A loader decides which samples each step sees and, through its workers, their
augmentation. A run resumed with another batch size, number of workers, loader or
sampler kind, sampler arguments, dataset length or ``drop_last``, on another number
of processes, or from a position its loader cannot restore, sees other samples or
other augmentation than the uninterrupted run, whatever the generators hold. devrng
records each loader it knows of when a checkpoint is saved (``describe``), compares
the record with the loader of the resumed run (``differences``: the one place a
record is read), and names every difference -- with the way to make the run exact
-- in one ``DevRNGWarning`` when the run resumes. The sentences live here, so the
trainer integrations and ``TrainingRNG`` say the same thing.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import weakref
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import Any, NamedTuple

import torch

from devrng._backends import host
from devrng._base.errors import DevRNGError, say, short_repr, warn_and_log
from devrng._base.rank import world_size
from devrng._checks.watch import feeding_loader
from devrng._generators.saved import check_cpu_state
from devrng._generators.snapshot import Restore, RNGState, snapshot
from devrng._generators.undo import Undo
from devrng._training.workers import WorkerSeeding

__all__ = ["Unsure", "describe", "differences", "feeding_loader", "is_stateful",
           "out_of_order_problem", "persistent_workers_problem", "position_problem",
           "private_shuffle_problem", "resume_problems", "warn_on_resume", "world_size_problem"]

_PREFIX = "The resumed run will not be bitwise the same as the uninterrupted one: "


class Unsure(str):
    """A way a resume may differ that devrng cannot confirm when it loads (it depends on what
    the workers or the dataset draw): not a warning, but left to the flight record, or said
    in one line when the record is off (``warn_on_resume``)."""

    __slots__ = ()

# Switches that turn off devrng's handling of the resume cases of issue 37, each for a test
# showing what a run does without it (what the flight record then has to catch).
#: Warn of workers that draw outside sample_rng (dataset, collate_fn) when a run resumes inside
#: an epoch, and count only their draws against another number of workers.
_FIX_WORKER_DRAWS = True
#: Record the generators a sampler torchdata replays draws from as each epoch begins, and put
#: them back while the resumed loader replays it.
_FIX_REPLAYED_SAMPLERS = True
#: Fit a position saved inside an epoch to another number of workers, or say in a sentence
#: why it cannot be (torchdata asserts with an empty message).
_FIX_WORKER_COUNT = True
#: Say that workers kept across epochs change the order of the samples, not only their
#: augmentation.
_FIX_PERSISTENT_ORDER = True
# Issue 44's samplers, each switch for a test too.
#: Make a resumed StatefulDataLoader's iterator when the loop asks for it -- after its
#: set_epoch (a DistributedSampler's) -- not inside load_state_dict.
_FIX_LATE_RESUME = True
#: Have every iter() torchdata calls on a replayed sampler, and the first index it takes,
#: while it makes a resumed iterator, draw from the generators the uninterrupted run's did.
_FIX_SAMPLER_DRAWS = True


def is_stateful(obj: Any) -> bool:
    """Whether ``obj`` saves and restores its state (a StatefulDataLoader's: its position).

    accelerate's prepared loaders have both methods whatever they wrap; they work only
    when it wraps a StatefulDataLoader (``use_stateful_dataloader``).
    """
    return (callable(getattr(obj, "state_dict", None))
            and callable(getattr(obj, "load_state_dict", None))
            and getattr(obj, "use_stateful_dataloader", True) is not False)


def describe(loader: Any) -> dict[str, Any]:
    """A DataLoader (torch's, torchdata's or a trainer's subclass) as plain data; a device
    loader (``feeding_loader``) by the DataLoader it feeds from.

    Examples:
        >>> from devrng._training.loaders import describe
        >>> info = describe(torch.utils.data.DataLoader(range(8), batch_size=4))
        >>> info["kind"], info["batch_size"], info["num_workers"], info["dataset_length"]
        ('DataLoader', 4, 0, 8)
    """
    loader = feeding_loader(loader)
    init = getattr(loader, "worker_init_fn", None)
    seeding = init if isinstance(init, WorkerSeeding) else None
    generator = getattr(loader, "generator", None)
    sampler = getattr(loader, "sampler", None)
    batches = _batch_sampler(loader)
    batch_size = getattr(loader, "batch_size", None)
    if batch_size is None:  # a batch_sampler of its own (accelerate wraps the loader's so)
        batch_size = getattr(batches, "batch_size", None)
    # The sampler that yields the indices: a trainer that wraps the batch sampler (accelerate)
    # leaves the loader's own `sampler` a placeholder.
    indices = getattr(batches, "sampler", sampler)
    own = getattr(sampler, "generator", None)
    return {
        "kind": type(loader).__name__,
        "stateful": is_stateful(loader),
        "num_workers": int(getattr(loader, "num_workers", 0) or 0),
        "batch_size": batch_size if isinstance(batch_size, int) else None,
        "persistent_workers": bool(getattr(loader, "persistent_workers", False))
        and int(getattr(loader, "num_workers", 0) or 0) > 0,
        # Whether such kept workers went on into a later epoch (None: devrng does not seed
        # them, so it cannot tell): a resumed run's new workers do not continue their streams.
        "kept_past_epoch": None if seeding is None else seeding.kept_past_an_epoch(),
        # in_order=False: workers hand over batches as they finish them (torch 2.6 and later)
        "in_order": getattr(loader, "in_order", True) is not False
        or not int(getattr(loader, "num_workers", 0) or 0),
        "sampler": type(indices).__name__,
        # A sampler with a generator of its own that is not the loader's: torchdata's
        # RandomSampler makes one, seeded from torch's global generator, when the loader
        # is built without a generator.
        "private_shuffle": own is not None and own is not generator,
        "devrng_seeded": seeding is not None and generator is not None
        and seeding.generator is generator,
        "sample_rng": seeding is not None and seeding.sample_rng_used(),
        # Whether a worker's own generators moved outside sample_rng (in the dataset or the
        # collate_fn); None: devrng does not seed the workers, so it cannot tell.
        "worker_draws": _worker_draws(loader, seeding),
        # What else decides which samples each step sees (not in records of devrng 0.1's
        # version-2 states, which are compared only on what they hold).
        "sampler_args": _sampler_arguments(indices),
        "batch_sampler": None if batches is None else type(batches).__name__,
        "drop_last": bool(getattr(batches, "drop_last", getattr(loader, "drop_last", False))),
        "dataset_length": _length(getattr(loader, "dataset", None)),
        # An iterable dataset's workers are fast-forwarded (or restored from its own state)
        # inside an epoch, not skipped to their place: their draws may well repeat.
        "iterable": isinstance(getattr(loader, "dataset", None),
                               torch.utils.data.IterableDataset),
        "epoch_length": _length(indices),  # indices an epoch yields: does drop_last drop any?
    }


def _worker_draws(loader: Any, seeding: WorkerSeeding | None) -> bool | None:
    if not int(getattr(loader, "num_workers", 0) or 0):
        return False  # the main process draws, from the generators TrainingRNG saves
    return None if seeding is None else seeding.drew_outside()


def _batch_sampler(loader: Any) -> Any:
    """The batch sampler that groups the loader's indices (inside the ones a trainer wraps
    around it: accelerate's ``BatchSamplerShard``), or None without automatic batching."""
    batches: Any = getattr(loader, "batch_sampler", None)
    while getattr(batches, "batch_sampler", None) is not None:
        batches = batches.batch_sampler
    return batches


# The arguments of a sampler that decide the indices it yields, by the attribute it keeps
# each in: torch's samplers, and torchdata's and accelerate's, which use the same names.
_SAMPLER_ARGUMENTS = (
    ("replacement", "replacement"),  # RandomSampler, WeightedRandomSampler
    ("num_samples", "_num_samples"),  # RandomSampler's argument (None: the dataset's length)
    ("weights", "weights"),  # WeightedRandomSampler, as a fingerprint
    ("indices", "indices"),  # SubsetRandomSampler, as a fingerprint
    ("shuffle", "shuffle"),  # DistributedSampler, with the four below
    ("seed", "seed"),
    ("rank", "rank"),
    ("num_replicas", "num_replicas"),
    ("drop_last", "drop_last"),
    ("seed", "initial_seed"),  # accelerate's SeedableRandomSampler
)


def _sampler_arguments(sampler: Any) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, attribute in _SAMPLER_ARGUMENTS:
        value = getattr(sampler, attribute, None)
        if key in ("weights", "indices") and value is not None:
            found[key] = _fingerprint(value)
            if key == "weights":  # WeightedRandomSampler's count is an argument, not derived
                found["num_samples"] = _plain(getattr(sampler, "num_samples", None))
        elif hasattr(sampler, attribute):
            found[key] = _plain(value)
    return found


def _plain(value: Any) -> Any:
    """``value`` as plain data for the record: bools, ints and None as they are, else text."""
    if value is None or isinstance(value, bool):
        return value
    return int(value) if isinstance(value, int) else str(value)


def _fingerprint(values: Any) -> str:
    """Many numbers (a sampler's weights or indices) as a short text that changes with any
    of them."""
    try:
        tensor = torch.as_tensor(values).detach().cpu()
        raw = tensor.contiguous().reshape(-1).view(torch.uint8)
    except (TypeError, ValueError, RuntimeError):
        return f"unreadable {type(values).__name__}"
    # The same bytes either way; NumPy's is the fast one (bytes(storage) goes byte by byte).
    data = raw.numpy().tobytes() if host.numpy_or_none() is not None else bytes(raw.tolist())
    digest = hashlib.sha256(data)
    digest.update(str((tensor.dtype, tuple(tensor.shape))).encode())
    return f"{tensor.numel()} values, sha256 {digest.hexdigest()[:16]}"


def _length(dataset: Any) -> int | None:
    """``len(dataset)``, or None for a dataset without one (an iterable dataset's)."""
    try:
        return len(dataset)
    except Exception:  # no __len__, or one that raises (IterableDataset's TypeError)
        return None


def differences(name: str, saved: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """What changed in loader ``name`` since it was saved that changes the run, as sentences.

    Every fact of ``describe`` that decides which samples a step sees is compared; one that
    ``saved`` lacks (a record of an older devrng) is not.
    """
    _check_record(name, saved)
    problems = []
    if saved.get("kind") != now["kind"]:
        problems.append(f"{name} was a {saved.get('kind')} and is now a {now['kind']}, which "
                        "resumes its position and shuffle differently; resume with a "
                        f"{saved.get('kind')}")
    if saved.get("batch_size") != now["batch_size"]:
        problems.append(f"{name} had batch size {saved.get('batch_size')} and has "
                        f"{now['batch_size']}, so every resumed step sees other samples; resume "
                        f"with batch_size={saved.get('batch_size')}")
    problems += _sampling_differences(name, saved, now)
    before, after = saved.get("num_workers"), now["num_workers"]
    if before != after and not (before and after and _by_index(saved)
                                and saved.get("devrng_seeded") and now["devrng_seeded"]):
        if not before or not after:
            why = ("with num_workers=0 the samples draw from the main process's generators, "
                   "with workers from each worker's own")
            fix = f"resume with num_workers={before}"
        else:
            why = "each worker draws its samples' augmentation from a stream of its own"
            fix = (f"resume with num_workers={before}, or build the loader with "
                   "rng.dataloader_kwargs() and draw each sample's randomness inside "
                   "devrng.sample_rng(index), which makes it independent of the workers")
        text = f"{name} had num_workers={before} and has {after}: {why}; {fix}"
        # Workers devrng does not seed may have drawn nothing outside sample_rng: only their
        # draws would differ, and devrng cannot see them.
        problems.append(Unsure(text) if before and after and saved.get("worker_draws") is None
                        and "worker_draws" in saved else text)
    return problems


def _by_index(record: Mapping[str, Any]) -> bool:
    """Whether the workers' draws depend on each sample's index alone, not on the worker: they
    drew inside ``sample_rng`` only, or drew nothing (records of devrng 0.4 and older say only
    whether ``sample_rng`` ran)."""
    if not _FIX_WORKER_DRAWS or "worker_draws" not in record:
        return bool(record.get("sample_rng"))
    return record["worker_draws"] is False


#: Records hold class names, counts and fingerprints: no text of theirs is longer.
_MAX_TEXT = 200


def _check_record(name: str, saved: Mapping[str, Any]) -> None:
    """Refuse a record that ``describe`` cannot have written, before any of it is compared or
    quoted: a tensor (one that claims gigabytes over a byte of storage would be allocated by
    the comparison), a nesting, or text longer than a class name."""
    for key, value in saved.items():
        values = value.values() if key == "sampler_args" and isinstance(value, Mapping) \
            else (value,)
        for item in values:
            if item is None or isinstance(item, (bool, int, float)) or (
                    isinstance(item, str) and len(item) <= _MAX_TEXT):
                continue
            raise DevRNGError(
                f"The saved record of {name} holds {short_repr(item)} under {short_repr(key)}; "
                "devrng's loader records hold short names and numbers only, so this "
                "checkpoint was not written by devrng, or was altered."
            )
        if not isinstance(key, str) or len(key) > _MAX_TEXT:
            raise DevRNGError(f"The saved record of {name} has the key {short_repr(key)}; "
                              "devrng's loader records use short names only.")


# What DataLoader's shuffle= makes, to name the argument a user changed.
_SHUFFLE = {"RandomSampler": "shuffle=True", "SequentialSampler": "shuffle=False"}


def _sampling_differences(name: str, saved: Mapping[str, Any], now: Mapping[str, Any]
                          ) -> list[str]:
    """The sentences for the dataset, the sampler, its arguments, the batch sampler and
    drop_last (the facts records hold since devrng 0.2)."""
    problems = []
    other = "so the resumed steps see other samples than the uninterrupted run's"
    if "dataset_length" in saved and saved["dataset_length"] != now["dataset_length"]:
        before, after = saved["dataset_length"], now["dataset_length"]
        problems.append(f"the dataset of {name} had {before} samples and has {after}, so the "
                        "sampler draws other indices and an epoch has another number of "
                        f"batches; resume with the dataset of {before} samples")
    # Older records named the loader's `sampler`, which is not the one that draws when a
    # trainer wraps the batch sampler: compare kinds only with records that say which draws.
    kind, now_kind = saved.get("sampler"), now["sampler"]
    if "sampler_args" in saved and kind != now_kind:
        fix = (_SHUFFLE[kind] if kind in _SHUFFLE and now_kind in _SHUFFLE
               else f"a {kind} as before")
        problems.append(f"{name} drew its indices from a {_kind(kind)} and now from a "
                        f"{_kind(now_kind)}, {other}; resume with {fix}")
    elif isinstance(saved.get("sampler_args"), Mapping):
        args, now_args = saved["sampler_args"], now["sampler_args"]
        for key in dict.fromkeys([*args, *now_args]):
            if args.get(key) != now_args.get(key):
                fix = (f"the {key} it had" if key in ("weights", "indices")
                       else f"{key}={args.get(key)!r}")
                problems.append(f"the {now_kind} of {name} had {key}={args.get(key)!r} and has "
                                f"{key}={now_args.get(key)!r}, {other}; resume with {fix}")
    if "batch_sampler" in saved and saved["batch_sampler"] != now["batch_sampler"]:
        problems.append(f"{name} made its batches with a {saved['batch_sampler']} and now with "
                        f"a {now['batch_sampler']}, {other}; resume with a "
                        f"{saved['batch_sampler']}")
    if "drop_last" in saved and saved["drop_last"] != now["drop_last"] \
            and (_drops(saved) or _drops(now)):
        problems.append(f"{name} had drop_last={saved['drop_last']!r} and has "
                        f"drop_last={now['drop_last']!r}, so an epoch's last, incomplete batch "
                        f"is {'now' if now['drop_last'] else 'no longer'} dropped and the steps "
                        f"after it differ; resume with drop_last={saved['drop_last']!r}")
    return problems


def _drops(record: Mapping[str, Any]) -> bool:
    """Whether drop_last=True would drop indices: an epoch's last batch is incomplete (or
    the record does not say)."""
    length, size = record.get("epoch_length"), record.get("batch_size")
    return not (isinstance(length, int) and isinstance(size, int) and size > 0
                and length % size == 0)


def _kind(sampler: Any) -> str:
    """A sampler's class name, with the shuffle= that makes it."""
    return f"{sampler} ({_SHUFFLE[sampler]})" if sampler in _SHUFFLE else str(sampler)


def resume_problems(saved_world: int, records: Any, loaders: Mapping[str, Any],
                    inside: Collection[str] = ()) -> list[str]:
    """Why a run saved by ``saved_world`` processes with loader ``records`` (name -> what
    ``describe`` said) cannot continue exactly with ``loaders`` (name -> loader) in this
    process (empty: it can); ``inside``: the loaders that resume their place inside an epoch."""
    problems = []
    now_of = {name: describe(loader) for name, loader in loaders.items()}
    world = world_size()
    if saved_world != world:
        problems.append(world_size_problem(
            saved_world, world, {f"the loader {name!r}": now for name, now in now_of.items()}))
    records = records if isinstance(records, Mapping) else {}
    for name, now in now_of.items():
        record = records.get(name)
        if isinstance(record, Mapping):
            problems += differences(f"the loader {name!r}", record, now)
            if name in inside and now["num_workers"]:
                problem = inside_epoch_problem(f"the loader {name!r}", record,
                                               "**rng.dataloader_kwargs()")
                problems += [problem] if problem else []
        if not now["in_order"]:
            problems.append(out_of_order_problem(f"the loader {name!r}"))
        if now["persistent_workers"]:
            # (A StatefulDataLoader restores its shuffle: only the augmentation can differ.)
            problem = persistent_workers_problem(
                f"the loader {name!r}", "build it with persistent_workers=False (or use devrng's "
                "Lightning callback, which reseeds them each epoch)",
                None if now["stateful"] else now["sampler"])
            problems.append(problem if _kept_workers_differ(now, record) else Unsure(problem))
    return problems


def _kept_workers_differ(now: Mapping[str, Any], record: Any) -> bool:
    """Whether a loader whose workers outlive an epoch surely resumes otherwise than the
    uninterrupted run: a torch DataLoader whose new iterator draws its base seed before the
    shuffle; or workers that drew (the record says so) and, for a StatefulDataLoader, which
    restores its shuffle and the base seed of the epoch that started its workers, went on
    into a later epoch when it was saved. Where devrng cannot tell, the flight record does."""
    record = record if isinstance(record, Mapping) else {}
    drew = bool(record.get("sample_rng") or record.get("worker_draws"))
    if now["stateful"]:
        return drew and record.get("kept_past_epoch") is True
    return now["sampler"] in _DRAWN_ORDER or drew


def out_of_order_problem(name: str) -> str:
    """A loader built with ``in_order=False``, whose batches come in no fixed order."""
    return (f"{name} is built with in_order=False: its workers hand over the batches in the "
            "order they finish them, which changes from run to run, so even two uninterrupted "
            "runs see their batches in other orders, and a resumed run cannot repeat one; build "
            "it with in_order=True (the default)")


def position_problem(name: str, kind: str, where: str,
                     restart: str = "the resumed epoch starts a new pass") -> str:
    """A checkpoint written inside an epoch, resumed with a loader that cannot restore its place.

    ``where``: where in the epoch, e.g. "after batch 5 of 12"; ``restart``: what the
    trainer does instead.
    """
    return (f"the checkpoint was written inside an epoch ({where}), and {name} is a {kind}, "
            f"which cannot restore its place in an epoch: {restart}, with a new shuffle and "
            "new worker seeds; use torchdata's StatefulDataLoader where the trainer supports "
            "it, or checkpoint at the ends of epochs")


def private_shuffle_problem(name: str, how: str) -> str:
    """torchdata's sampler shuffling from a generator of its own, seeded when the loader is built."""
    return (f"{name} is a StatefulDataLoader without a generator, whose sampler shuffles with a "
            "generator of its own seeded from torch's global generator when the loader is "
            f"built; {how}, so it shuffles differently; build it with "
            "**rng.dataloader_kwargs(), whose generator devrng saves and restores")


def persistent_workers_problem(name: str, fix: str, sampler: str | None) -> str:
    """Workers that outlive an epoch in the uninterrupted run and start afresh in the resumed one.

    ``sampler``: the class name of the loader's sampler (``describe``'s ``"sampler"``), whose
    order the kept workers change too; None where devrng makes the draw of a new iterator
    for them (Lightning's callback), so that only the augmentation differs.
    """
    what = "the samples' augmentation differs"
    if _FIX_PERSISTENT_ORDER and sampler is not None and sampler not in _FIXED_ORDER:
        # A new iterator draws its workers' base seed from the loader's generator before the
        # shuffle; a kept one draws the shuffle alone, from another point of the generator.
        order = "differs" if sampler in _DRAWN_ORDER else "can differ"
        what = (f"the order of the samples {order} (a new iterator draws the base seed from the "
                "loader's generator before the epoch's shuffle, kept workers do not), and so "
                "does their augmentation")
    return (f"{name} keeps its workers from epoch to epoch (persistent_workers=True): in the "
            "uninterrupted run they go on from the seeds of the epoch that started them, "
            f"while the resumed run starts new workers with a new base seed, so {what}; {fix}")


# Samplers whose order the generators decide, and samplers whose order they do not (a
# DistributedSampler, and accelerate's SeedableRandomSampler, shuffle with a generator of
# their own seeded by their seed and epoch).
_DRAWN_ORDER = ("RandomSampler", "SubsetRandomSampler", "WeightedRandomSampler")
_FIXED_ORDER = ("SequentialSampler", "_InfiniteConstantSampler", "DistributedSampler",
                "StatefulDistributedSampler", "SeedableRandomSampler")


def world_size_problem(saved: int, now: int, loaders: Mapping[str, Mapping[str, Any]]) -> str:
    """Another number of processes, said of what shards the data among them: ``loaders``
    maps a loader's name in the sentence to what ``describe`` says of it now.

    Examples:
        >>> loader = describe(torch.utils.data.DataLoader(range(8), shuffle=True))
        >>> print(world_size_problem(2, 1, {"the loader 'train'": loader}))
        ... # doctest: +NORMALIZE_WHITESPACE
        the checkpoint was written by a run of 2 process(es) and this run has 1: no loader
        here shards the data by process (the loader 'train', a RandomSampler: each process
        sees every sample, as before), but the processes, and the streams and results they
        share, are not the uninterrupted run's; resume on 2 process(es)
    """
    head = f"the checkpoint was written by a run of {saved} process(es) and this run has {now}"
    sharded = [f"{name} ({how})" for name, info in loaders.items()
               if (how := _sharding(info)) is not None]
    if sharded:
        return (f"{head}: the data is split among the processes by their number "
                f"({'; '.join(sharded)}), so each process sees other samples; resume on "
                f"{saved} process(es)")
    if loaders:
        kinds = "; ".join(f"{name}, a {info.get('sampler')}" for name, info in loaders.items())
        return (f"{head}: no loader here shards the data by process ({kinds}: each process "
                "sees every sample, as before), but the processes, and the streams and "
                "results they share, are not the uninterrupted run's; resume on "
                f"{saved} process(es)")
    return (f"{head}: devrng knows no loader of this run, so it cannot tell whether the data "
            "is split among the processes (a DistributedSampler shards it by their number, "
            f"and each process then sees other samples); resume on {saved} process(es), or "
            "track the loaders (rng.track) to be told")


def _sharding(info: Mapping[str, Any]) -> str | None:
    """What splits a loader's data among the processes (from ``describe``), or None."""
    if info.get("sampler") == "DistributedSampler" or "num_replicas" in (
            info.get("sampler_args") or {}):
        return f"its {info.get('sampler')} shards it"
    if info.get("batch_sampler") == "BatchSamplerShard":
        return "accelerate's BatchSamplerShard shards it"
    if info.get("kind") == "DataLoaderDispatcher":
        return "accelerate's DataLoaderDispatcher hands each process its slice"
    return None


# -- a StatefulDataLoader's place in an epoch (torchdata 0.11's state) -----------------------
def saved_place(state: Any) -> tuple[int, int, bool] | None:
    """(number of workers, batches yielded, whether the epoch had ended) of the state a
    StatefulDataLoader saved; None for a state of another layout."""
    if not isinstance(state, Mapping):
        return None
    finished = bool(state.get("_iterator_finished"))
    if isinstance(state.get("_num_yielded"), int):  # without workers
        return 0, state["_num_yielded"], finished
    snap: Any = state.get("_snapshot")
    main = snap.get("_main_snapshot") if isinstance(snap, Mapping) else None
    if not isinstance(main, Mapping) or not isinstance(main.get("_num_workers"), int):
        return None
    step, since = snap.get("_snapshot_step"), state.get("_steps_since_snapshot")
    yielded = (step if isinstance(step, int) else 0) + (since if isinstance(since, int) else 0)
    return main["_num_workers"], yielded, finished


def place_for_workers(name: str, state: Any, workers: int) -> tuple[Any, str | None]:
    """The saved state of StatefulDataLoader ``name`` to load into it now that it has
    ``workers`` workers, and why it cannot continue the saved epoch (None: it can).

    torchdata 0.11 loads a state only into a loader with the number of workers that saved it
    (it asserts with an empty message). At the end of an epoch there is nothing to continue:
    nothing is loaded (``{}``), and the next epoch starts from the generators. Inside an epoch,
    a place saved with workers is rewritten for another number of them when the workers hold
    no part of it (a map-style dataset without a state of its own): the order of the batches
    does not change, nor, when the samples draw inside ``sample_rng``, their augmentation.
    """
    place = saved_place(state)
    if not _FIX_WORKER_COUNT or place is None or place[0] == workers:
        return state, None
    before, yielded, finished = place
    if finished:
        return {}, None
    refit = _with_workers(state, workers) if before and workers else None
    if refit is not None:
        return refit, None
    return state, worker_count_problem(name, before, workers, yielded,
                                       "keeps a part of it in each worker here (its dataset has "
                                       "a state of its own)" if before and workers else "")


def worker_count_problem(name: str, before: int, after: int, yielded: Any, why: str = "") -> str:
    """A StatefulDataLoader saved inside an epoch (after batch ``yielded``) with ``before``
    workers, which cannot continue that epoch with ``after``."""
    why = why or ("keeps it in one form without workers and in another with them"
                  if not before or not after else "")
    return (f"{name} was saved inside an epoch (after batch {yielded}) with num_workers={before} "
            f"and has num_workers={after}; torchdata's StatefulDataLoader restores a place in an "
            "epoch only with the number of workers that saved it"
            + (f", and {why}" if why else "") + f", so the loader cannot continue that epoch; "
            f"resume with num_workers={before}, or from a checkpoint written at the end of an "
            "epoch")


def _with_workers(state: Mapping[str, Any], workers: int) -> dict[str, Any] | None:
    """``state`` (saved with workers) for ``workers`` workers, or None where a worker holds a
    part of the place (a dataset's or an iterable dataset's own state)."""
    snap: Any = state.get("_snapshot")
    kept = snap.get("_worker_snapshots") if isinstance(snap, Mapping) else None
    if not isinstance(kept, Mapping) or not kept or not all(
            isinstance(w, Mapping) and w.get("dataset_state") is None
            and w.get("fetcher_state") is None for w in kept.values()):
        return None
    template = next(iter(kept.values()))
    return {**state, "_snapshot": {
        **snap, "_main_snapshot": {**snap["_main_snapshot"], "_num_workers": workers},
        "_last_yielded_worker_id": workers - 1,  # the next batch goes to worker 0
        "_worker_snapshots": {f"worker_{i}": {**template, "worker_id": i}
                              for i in range(workers)}}}


# Samplers torchdata restores without drawing again: its own RandomSampler (whose iterator
# saves its generator), samplers that draw nothing, and batch samplers that only group.
_RESTORED_AS_SAVED = frozenset({
    "torchdata.stateful_dataloader.sampler.RandomSampler",
    "torch.utils.data.sampler.SequentialSampler",
    "torch.utils.data.distributed.DistributedSampler",
    "torch.utils.data.dataloader._InfiniteConstantSampler",
    "torch.utils.data.sampler.BatchSampler",
})


def replays_sampler(loader: Any) -> bool:
    """Whether ``loader`` is a StatefulDataLoader that restores its place in an epoch by
    drawing the epoch's indices again (torchdata's fallback for a sampler without a state of
    its own: a SubsetRandomSampler, a WeightedRandomSampler, torch's RandomSampler passed as
    ``sampler=``), from the generators as they are when it makes the resumed iterator."""
    loader = feeding_loader(loader)
    if not hasattr(loader, "next_iter_state"):  # torchdata's StatefulDataLoader only
        return False
    batches = _batch_sampler(loader)
    return any(_replays(s) for s in (batches, getattr(batches, "sampler", None)) if s is not None)


def _replays(sampler: Any) -> bool:
    names = {f"{k.__module__}.{k.__qualname__}" for k in type(sampler).__mro__}
    return not names & _RESTORED_AS_SAVED and not is_stateful(sampler)


def _own_generator(loader: Any) -> torch.Generator | None:
    """The generator of the sampler that yields ``loader``'s indices -- or, where it has none,
    of the batch sampler that groups them (a ``batch_sampler`` of the user's) -- unless it is
    torch's global one (saved with the rest): its ``generator``, else the first
    ``torch.Generator`` among its attributes."""
    batches = _batch_sampler(loader)
    sampler: Any
    for sampler in (getattr(batches, "sampler", getattr(loader, "sampler", None)), batches):
        while type(sampler).__module__.startswith("devrng.") and hasattr(sampler, "_real"):
            sampler = sampler._real  # (devrng's stand-ins while the loader makes an iterator)
        held = vars(sampler).values() if hasattr(sampler, "__dict__") else ()
        for generator in (getattr(sampler, "generator", None), *held):
            if isinstance(generator, torch.Generator) \
                    and generator is not torch.default_generator:
                return generator
    return None


class EpochStart(NamedTuple):
    """The generators a replayed sampler draws from -- torch's, Python's and NumPy's global
    ones and the sampler's own -- as they stood when an epoch's sampler iteration began.

    Taken as the loader began to make the epoch's iterator (``by_sampler`` False: devrng 0.4
    and older), or as the sampler's ``iter()`` was called for the iteration that yielded the
    epoch's indices (``by_sampler``), with ``first``: the generators as that iteration's first
    index was taken, when something drew in between (None: nothing did).
    """

    host: RNGState
    sampler: torch.Tensor | None
    by_sampler: bool = False
    first: EpochStart | None = None

    @classmethod
    def now(cls, loader: Any) -> EpochStart:
        """The generators ``loader``'s sampler draws from, as they are now."""
        own = _own_generator(loader)
        return cls(snapshot([], python=True, numpy=True), None if own is None else own.get_state())

    def same(self, other: EpochStart) -> bool:
        """Whether ``other`` holds the same generator states."""
        if self.sampler is None or other.sampler is None:
            return self.host == other.host and self.sampler is other.sampler
        return self.host == other.host and torch.equal(self.sampler, other.sampler)

    def put(self, loader: Any, undo: Undo) -> None:
        """Set the generators back to this start, each one's state pushed on ``undo`` first."""
        if not _FIX_REPLAYED_SAMPLERS:
            return
        Restore(self.host, []).apply(undo)
        own = _own_generator(loader)
        if own is not None and self.sampler is not None:
            undo.push("the generator of the loader's sampler", own.set_state, own.get_state())
            own.set_state(self.sampler)

    def to_dict(self) -> dict[str, Any]:
        data = {"host": self.host.to_dict(), "sampler": self.sampler}
        if self.by_sampler:
            data["first"] = None if self.first is None else self.first.to_dict()
        return data

    @classmethod
    def read(cls, data: Any, what: str) -> EpochStart:
        """``to_dict``'s data, checked; ``DevRNGError`` naming ``what`` if it is not that."""
        sampler = data.get("sampler") if isinstance(data, Mapping) else None
        first: EpochStart | None = None
        try:
            if not isinstance(data, Mapping) or set(data) - {"first"} != {"host", "sampler"}:
                raise ValueError("it is not {'host': ..., 'sampler': ...}")
            if sampler is not None:
                check_cpu_state(sampler)
            host_state = RNGState.from_dict(data["host"], source=what)
            if isinstance(data.get("first"), Mapping) and "first" not in data["first"]:
                first = cls.read(data["first"], what)
            elif data.get("first") is not None:
                raise ValueError("its 'first' is not {'host': ..., 'sampler': ...}")
        except (TypeError, ValueError, DevRNGError) as err:
            raise DevRNGError(f"{what} is not a record devrng wrote: "
                              f"{str(err).rstrip('.')}.") from None
        return cls(host_state, sampler, "first" in data, first)


def _drawing(loader: Any) -> tuple[Any, str] | None:
    """Where the sampler that a resumed StatefulDataLoader replays sits -- (the object that
    holds it, the attribute): a sampler inside torchdata's or torch's ``BatchSampler``, a
    ``batch_sampler`` of the user's, or the loader's sampler without batches -- or None."""
    batches = getattr(loader, "batch_sampler", None)
    places = ((loader, "sampler"),) if batches is None else ((batches, "sampler"),
                                                               (loader, "batch_sampler"))
    for owner, attribute in places:
        sampler = vars(owner).get(attribute) if hasattr(owner, "__dict__") else None
        if sampler is not None and _replays(sampler):
            return owner, attribute
    return None


class EpochStarts:
    """Records, on a StatefulDataLoader that replays its sampler, the ``EpochStart`` of each
    iterator it makes (``last``), so that a checkpoint written inside the epoch can have the
    resumed loader replay the sampler from the same generators (``arm``). ``watch`` installs
    it once per loader, around the loader's own ``_get_iterator``, where torchdata 0.11's
    loader makes every new iterator: the first epoch's, later ones' and resumed ones.

    While the loader makes an iterator, its replayed sampler is seen through a ``_Drawn``: so
    the record is taken as the sampler's ``iter()`` is called, and a resumed iterator's
    every ``iter()`` on it starts from that record (torchdata 0.11 calls it three times as
    it makes a resumed iterator, four with workers, and uses the last; a sampler that
    shuffles as ``iter()`` is called draws each time). ``resume`` has a loader just given a place make its resumed
    iterator when the loop asks for it, leaving the generators as they were."""

    def __init__(self, loader: Any) -> None:
        self.last: EpochStart | None = None
        self._armed: tuple[EpochStart, Undo] | None = None
        self._keep: list[torch.Generator] | None = None  # resume(): put back once it is made
        self._making: _Making | None = None  # the iterator made last
        self._replays = replays_sampler(loader)
        self._drawing = _drawing(loader) if self._replays else None
        # Weakly held: a loader kept in a reference cycle (through its own __dict__) and its
        # iterator are left to the garbage collector, which may run in a forked worker,
        # whose clean-up of the iterator then fails ("can only test a child process").
        watch, loader_ref = weakref.ref(self), weakref.ref(loader)
        inner = loader.__dict__.get("_get_iterator")  # another of devrng's wrappers: inside

        def recording() -> Any:
            this, target = watch(), loader_ref()
            if target is None:  # (the loader calls this: it exists)
                raise ReferenceError("the DataLoader is gone")
            make = inner if inner is not None else functools.partial(
                type(target)._get_iterator, target)
            return make() if this is None else this._make(target, make)

        loader._get_iterator = recording

    def _make(self, loader: Any, make: Callable[[], Any]) -> Any:
        armed, self._armed = self._armed, None
        keep, self._keep = self._keep, None
        kept = None
        if keep is not None:  # the generators as they are now, put back once it is made
            kept = Undo.of_plan("the resumed loader", [], python=True, numpy=True)
            for g in keep:
                kept.push("a generator", g.set_state, g.get_state())
        if armed is not None:
            armed[0].put(loader, armed[1])
            self.last = armed[0]
        elif self._replays and _FIX_REPLAYED_SAMPLERS:
            self.last = EpochStart.now(loader)  # (by the sampler, once it draws: _Making.first)
        making = self._making = _Making(self, loader, armed)
        place = self._drawing if _FIX_SAMPLER_DRAWS and _FIX_REPLAYED_SAMPLERS else None
        real = None if place is None else vars(place[0])[place[1]]
        if place is not None:  # (vars: a DataLoader refuses to set its samplers after __init__)
            vars(place[0])[place[1]] = _Drawn(real, making)
        try:
            it = make()
            if armed is not None and place is not None:
                _skip_now(it)
        finally:
            making.open = False
            if place is not None:
                vars(place[0])[place[1]] = real
            if kept is not None:
                kept.run()
        return it

    def arm(self, start: EpochStart, undo: Undo) -> None:
        """Put ``start`` back just before the loader makes its next iterator (the resumed one,
        which replays the sampler), each generator's state pushed on ``undo`` first; the
        caller sets them to the checkpoint's afterwards."""
        self._armed = (start, undo)

    def resume(self, loader: Any, place: Any, start: EpochStart | None,
               keep: Iterable[torch.Generator], undo: Undo) -> None:
        """Have ``loader``, just given its ``place`` in an epoch, make the resumed iterator it
        yields from when the loop asks for it -- after the loop's ``set_epoch`` on its
        sampler -- replaying the sampler from ``start`` (if any) and leaving Python's,
        NumPy's and torch's CPU generator and ``keep`` as they were. It makes one now too,
        so that a place the loader cannot take fails here (inside ``undo``), and drops it."""
        if not hasattr(loader, "next_iter_state"):  # torchdata's StatefulDataLoader only
            return
        if not _FIX_LATE_RESUME:  # made now, from the generators as they are now (0.4)
            if start is not None:
                self.arm(start, undo)
            _materialise(loader)
            return
        undo.push("the resumed loader's plan", self._forget)
        for now in (True, False):
            if start is not None:
                self.arm(start, Undo("the resumed loader"))
            self._keep = list(keep)
            if now:
                _materialise(loader)
                loader.load_state_dict(place)

    def _forget(self) -> None:
        self._armed = self._keep = None

    @classmethod
    def of(cls, loader: Any) -> EpochStarts | None:
        """The watch installed on ``loader``, if any."""
        found = getattr(loader, "_devrng_epoch_starts", None)
        return found if isinstance(found, cls) else None

    @classmethod
    def watch(cls, loader: Any) -> EpochStarts:
        """The watch of ``loader``, installed now if it has none."""
        found = cls.of(loader)
        if found is None:
            found = loader._devrng_epoch_starts = cls(loader)
        return found


class _Making:
    """One iterator a watched loader makes: its replayed sampler's ``iter()`` calls
    (``called``) and the first index each iteration yields (``first``). Made afresh, the
    iteration whose first index is taken records the ``EpochStart``; made from an armed
    start, every ``iter()`` and every first index while it is made start from the record."""

    def __init__(self, watch: EpochStarts, loader: Any,
                 armed: tuple[EpochStart, Undo] | None) -> None:
        # Weakly held: the iterator holds this (through _Drawn), and the loader the iterator.
        self._watch, self._loader = weakref.ref(watch), weakref.ref(loader)
        self.armed = armed
        self.open = True  # while the loader makes the iterator

    def called(self, sampler: Any) -> Any:
        loader = self._loader()
        if not self.open or loader is None:
            return iter(sampler)
        if self.armed is not None:
            start, undo = self.armed
            if start.by_sampler:
                start.put(loader, undo)
            return _FirstIndex(iter(sampler), self, None)
        before = EpochStart.now(loader)
        it = iter(sampler)
        return _FirstIndex(it, self, (before, EpochStart.now(loader)))

    def first(self, taken: tuple[EpochStart, EpochStart] | None) -> None:
        loader, watch = self._loader(), self._watch()
        if loader is None or watch is None:
            return
        if self.armed is not None:
            start, undo = self.armed
            if self.open and start.first is not None:
                start.first.put(loader, undo)
        elif taken is not None and watch._making is self:  # (not an older epoch's iteration)
            now = EpochStart.now(loader)
            before, after = taken
            watch.last = before._replace(by_sampler=True,
                                         first=None if now.same(after) else now)


class _Drawn:
    """Stands for a loader's replayed sampler while the loader makes an iterator: its
    ``iter()`` goes through ``_Making.called``; everything else is the real one's."""

    def __init__(self, real: Any, making: _Making) -> None:
        self._real = real
        self._making = making

    def __iter__(self) -> Any:
        return self._making.called(self._real)

    def __len__(self) -> int:
        return len(self._real)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class _FirstIndex:
    """An iteration of a replayed sampler, which tells its ``_Making`` of its first index."""

    def __init__(self, it: Iterator[Any], making: _Making, taken: Any) -> None:
        self._it = it
        self._making: _Making | None = making
        self._taken = taken

    def __iter__(self) -> _FirstIndex:
        return self

    def __next__(self) -> Any:
        if self._making is not None:
            making, self._making = self._making, None
            making.first(self._taken)
        return next(self._it)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._it, name)


def _skip_now(it: Any) -> None:
    """Fast-forward a resumed iterator's index sampler now, while its generators are put
    back. torchdata 0.11 fast-forwards an index sampler without a state of its own (a
    ``batch_sampler`` of the user's) by an ``islice``, which without workers skips only when
    the loop takes the first batch: from the generators as they are then."""
    source = getattr(it, "_sampler_iter", None)
    skip = getattr(it, "_sampler_iter_yielded", None)
    if isinstance(source, itertools.islice) and isinstance(skip, int) \
            and not getattr(it, "_num_workers", 0):  # (with workers it prefetched already)
        fresh = iter(it._index_sampler)
        for _ in range(skip):
            next(fresh)
        it._sampler_iter = fresh


def _materialise(obj: Any) -> None:
    """Make a loaded StatefulDataLoader build its resumed iterator now (its own
    ``state_dict()`` does that)."""
    if isinstance(obj, torch.utils.data.DataLoader) and hasattr(obj, "next_iter_state"):
        obj.state_dict()  # type: ignore[attr-defined]


def unreplayable_problem(name: str) -> str | None:
    """A loader that replays its sampler, resumed inside an epoch from a checkpoint that holds
    no ``EpochStart`` for it (None with the fix turned off: as devrng 0.4, silent)."""
    if not _FIX_REPLAYED_SAMPLERS:
        return None
    return (f"the checkpoint was written inside an epoch, and the sampler of {name} keeps no "
            "place of its own, so torchdata replays the epoch's draws from it to find its "
            "place; the checkpoint holds no record of the generators those draws came from "
            "(written by devrng 0.4 or older, or the loader made its iterator before devrng "
            "tracked it), so the resumed epoch yields other indices; give the sampler a "
            "state (torchdata's RandomSampler: shuffle=True), or checkpoint after the epoch's "
            "loop")


def inside_epoch_problem(name: str, record: Mapping[str, Any], fix: str) -> str | None:
    """Why a loader resumed inside an epoch, with new workers, draws other augmentation than
    the uninterrupted run (None: it does not; ``Unsure``: it may). ``record``: ``describe`` of
    the saved loader;
    ``fix``: how to build the loader with devrng's seeding (``rng.dataloader_kwargs()``)."""
    if not _FIX_WORKER_DRAWS or not record.get("num_workers"):
        return None
    drew = record.get("worker_draws", False if record.get("sample_rng") else None)
    start = ("the checkpoint was written inside an epoch, and the resumed loader starts new "
             "workers, whose torch, Python and NumPy generators start afresh")
    if drew is False:
        return None
    if drew and record.get("iterable"):
        return Unsure(f"{start}: the workers of {name} drew random numbers outside "
                      "devrng.sample_rng from an iterable dataset, which torchdata replays "
                      "from the epoch's start (or restores from a state of its own), so "
                      "whether the resumed draws repeat the uninterrupted run's depends on "
                      "the dataset")
    if drew:
        return (f"{start}: the workers of {name} drew random numbers outside "
                "devrng.sample_rng (in the dataset or in its collate_fn) before the "
                "checkpoint, so such draws after it differ from the uninterrupted run's; draw "
                "a sample's randomness inside devrng.sample_rng(index) and a batch's in the "
                "main process or as docs/resume.md shows for a collate_fn, or checkpoint after "
                "the epoch's loop")
    why = ("devrng does not seed its workers" if not record.get("devrng_seeded")
           else "the checkpoint was written by devrng 0.4 or older")
    return Unsure(f"{start}, and devrng cannot tell whether the workers of {name} drew random "
                  f"numbers outside devrng.sample_rng ({why}): if its dataset or collate_fn "
                  "draws any (augmentation), the resumed run's draws differ from the "
                  f"uninterrupted run's; build it with {fix}, and devrng warns only when they "
                  "do")


def warn_on_resume(problems: Iterable[str], *, flight: Any = None, stacklevel: int = 1) -> None:
    """One ``DevRNGWarning`` (also logged on ``"devrng"``) naming every problem devrng is sure
    of; none if there is none. What it is not sure of (``Unsure``) is left to ``flight``, the
    run's flight record, told that the load warned (it then adds no warning of its own); with
    the record off, one line says that the resume could not be checked."""
    found = list(dict.fromkeys(problems))  # the same sentence once, in order
    sure = [p for p in found if not isinstance(p, Unsure)]
    if sure:
        if flight is not None:
            flight.warned_at_load = True
        warn_and_log(_PREFIX + "; ".join(sure) + ".", stacklevel=stacklevel + 1)
    elif flight is None and len(sure) < len(found):
        say("devrng: this resume could not be checked when it loaded, and the flight record is "
            "off, so nothing will check it: " + "; ".join(found) + " (turn the flight record "
            "on to have the run verified).")
