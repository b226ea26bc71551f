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

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from devrng._backends import host
from devrng._base.errors import DevRNGError, short_repr, warn_and_log
from devrng._base.lazy import imported
from devrng._base.rank import world_size
from devrng._training.workers import WorkerSeeding

__all__ = ["describe", "differences", "feeding_loader", "is_stateful", "persistent_workers_problem", "position_problem",
           "private_shuffle_problem", "resume_problems", "warn_on_resume", "world_size_problem"]

_PREFIX = "The resumed run will not be bitwise the same as the uninterrupted one: "


def feeding_loader(obj: Any) -> Any:
    """The DataLoader a device loader feeds from (``obj`` itself for anything else).

    torch_xla's ``MpDeviceLoader`` -- and accelerate's wrapper of it, which
    ``Accelerator.prepare`` returns on XLA -- moves the batches of a DataLoader it
    keeps to the device; the samples, workers and position are that DataLoader's.
    """
    module = imported("torch_xla.distributed.parallel_loader")
    device_loader = getattr(module, "MpDeviceLoader", None)
    if device_loader is not None and isinstance(obj, device_loader):
        return obj._loader
    return obj


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
        "sampler": type(indices).__name__,
        # A sampler with a generator of its own that is not the loader's: torchdata's
        # RandomSampler makes one, seeded from torch's global generator, when the loader
        # is built without a generator.
        "private_shuffle": own is not None and own is not generator,
        "devrng_seeded": seeding is not None and generator is not None
        and seeding.generator is generator,
        "sample_rng": seeding is not None and seeding.sample_rng_used(),
        # What else decides which samples each step sees (not in records of devrng 0.1's
        # version-2 states, which are compared only on what they hold).
        "sampler_args": _sampler_arguments(indices),
        "batch_sampler": None if batches is None else type(batches).__name__,
        "drop_last": bool(getattr(batches, "drop_last", getattr(loader, "drop_last", False))),
        "dataset_length": _length(getattr(loader, "dataset", None)),
        "epoch_length": _length(indices),  # indices an epoch yields: does drop_last drop any?
    }


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
    if before != after and not (before and after and saved.get("sample_rng")
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
        problems.append(f"{name} had num_workers={before} and has {after}: {why}; {fix}")
    return problems


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


def resume_problems(saved_world: int, records: Any, loaders: Mapping[str, Any]) -> list[str]:
    """Why a run saved by ``saved_world`` processes with loader ``records`` (name -> what
    ``describe`` said) cannot continue exactly with ``loaders`` (name -> loader) in this
    process (empty: it can)."""
    problems = []
    world = world_size()
    if saved_world != world:
        problems.append(world_size_problem(saved_world, world))
    records = records if isinstance(records, Mapping) else {}
    for name, loader in loaders.items():
        now = describe(loader)
        record = records.get(name)
        if isinstance(record, Mapping):
            problems += differences(f"the loader {name!r}", record, now)
        if now["persistent_workers"]:
            problems.append(persistent_workers_problem(
                f"the loader {name!r}", "build it with persistent_workers=False (or use "
                "devrng's Lightning callback, which reseeds them each epoch)"))
    return problems


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


def persistent_workers_problem(name: str, fix: str) -> str:
    """Workers that outlive an epoch in the uninterrupted run and start afresh in the resumed one."""
    return (f"{name} keeps its workers from epoch to epoch (persistent_workers=True): in the "
            "uninterrupted run they go on from the seeds of the epoch that started them, "
            "while the resumed run starts new workers with a new base seed, so the samples' "
            f"augmentation differs; {fix}")


def world_size_problem(saved: int, now: int) -> str:
    """Another number of processes: other data per rank, other streams."""
    return (f"the checkpoint was written by a run of {saved} process(es) and this run has "
            f"{now}: the data is split among the processes differently (a DistributedSampler "
            "shards it by their number), so each process sees other samples; resume on "
            f"{saved} process(es)")


def warn_on_resume(problems: Iterable[str], *, stacklevel: int = 1) -> None:
    """One ``DevRNGWarning`` (also logged on ``"devrng"``) naming every problem; none if empty."""
    found = list(dict.fromkeys(problems))  # the same sentence once, in order
    if found:
        warn_and_log(_PREFIX + "; ".join(found) + ".", stacklevel=stacklevel + 1)
