"""DataLoader workers: seeding torch, Python and NumPy in each, distinct per worker, epoch and rank.

A DataLoader draws a base seed from its ``generator`` each epoch and gives
worker ``i`` the seed ``base + i``; torch seeds its own generator in the worker
with it, but not Python's ``random`` or NumPy's. ``seed_worker`` derives
all three from that seed and the distributed rank, so augmentation drawn from
any of them is reproducible from the generator's seed.
"""

from __future__ import annotations

import contextlib
import numbers
import random
from collections.abc import Callable, Iterator
from typing import Any

import torch

from devrng._backends import host
from devrng._base.errors import short_repr
from devrng._base.rank import check_rank, env_rank, process_rank
from devrng._base.seeds import MASK64, kept_epoch_seed, sample_seed, worker_seeds
from devrng._generators.fork import fork_rng

__all__ = ["WorkerSeeding", "dataloader_kwargs", "sample_rng", "seed_worker"]


def seed_worker(worker_id: int, *, rank: int | None = None) -> int:
    """Seed torch, Python ``random`` and NumPy inside a DataLoader worker.

    The seeds come from the worker's own seed, which the DataLoader draws from
    its ``generator`` each epoch and offsets by ``worker_id``, mixed with the
    distributed rank (``rank``, else the default process group's, else
    ``RANK``, else 0). So they differ per worker, epoch and rank, and repeat
    exactly when the generator is seeded the same. ``torch.distributions``
    samples draw from torch's generator and follow.

    Args:
        worker_id: The id the DataLoader passes to ``worker_init_fn``.
        rank: The distributed rank to mix in; ``None`` reads it from the
            default process group, else ``RANK``, else uses 0.

    Returns:
        The seed given to torch's generator.

    Raises:
        TypeError: ``worker_id`` is not an int of 0 or more, or ``rank`` is
            not an int.
        ValueError: ``rank`` is out of range.

    Examples:
        >>> loader = torch.utils.data.DataLoader(
        ...     range(4), num_workers=2, worker_init_fn=devrng.seed_worker,
        ...     generator=torch.Generator().manual_seed(0))
    """
    if isinstance(worker_id, bool) or not isinstance(worker_id, int) or worker_id < 0:
        raise TypeError(
            f"seed_worker takes the worker id the DataLoader passes (an int of 0 or more), not "
            f"{short_repr(worker_id)} (a {type(worker_id).__name__})."
        )
    if rank is not None:
        rank = check_rank(rank)
    info = torch.utils.data.get_worker_info()
    if info is not None:
        _count_epochs()
    base = int(info.seed) if info is not None else int(torch.initial_seed())
    torch_seed, python_seed, np_words = worker_seeds(
        base, worker_id, process_rank(strict=False) if rank is None else rank)
    torch.manual_seed(torch_seed)
    random.seed(python_seed)
    np = host.numpy_or_none()
    if np is not None:
        np.random.seed(np_words)
    return torch_seed


def dataloader_kwargs(seed: int | None, worker_init_fn: Callable[[int], Any] | None = None
                      ) -> dict[str, Any]:
    """``generator`` and ``worker_init_fn`` for a DataLoader whose workers ``seed_worker`` seeds.

    The generator, a new CPU one, is seeded with ``seed``, or with a seed drawn
    from torch's CPU generator when ``seed`` is None (so an earlier
    ``manual_seed`` fixes it). A user's ``worker_init_fn`` runs after devrng's
    seeding, with the same worker id. The ``worker_init_fn`` is a
    ``WorkerSeeding``, which also lets the main process see what the workers did.
    """
    if seed is None:
        seed = int(torch.randint(0, 2**62, (), dtype=torch.int64).item())
    generator = torch.Generator()
    generator.manual_seed(seed)
    rank = process_rank(strict=False)
    # A worker finds the rank through torch.distributed (forked workers) or RANK;
    # bind it when a spawned worker could not see it that way.
    bound = rank if rank != env_rank(strict=False) else None
    return {"generator": generator,
            "worker_init_fn": WorkerSeeding(generator, rank=bound, then=worker_init_fn)}


# Slots of WorkerSeeding.shared, an int64 tensor in shared memory.
_SAMPLE_RNG_USED, _EPOCH_SEED_SET, _EPOCH_SEED, _DREW_OUTSIDE, _KEPT = range(5)
_shared: Any = None  # in a worker: its loader's WorkerSeeding.shared, as a NumPy view (fast)
_marked = False  # in a worker: _SAMPLE_RNG_USED is written
_untouched: Any = None  # in a worker: its generators' states while nothing drew outside sample_rng
_fetchers = 0  # in a worker: the fetchers its loop made, one per epoch it served


class WorkerSeeding:
    """The ``worker_init_fn`` of ``dataloader_kwargs``: devrng's seeding in each worker, then
    the user's function; and five int64 slots in shared memory that the workers and the
    main process both see (picklable, so spawned workers get them too).

    The workers record there that a sample drew inside ``sample_rng``, and that
    a worker's own generators (torch's, Python's, NumPy's) moved outside it --
    in the dataset or the ``collate_fn`` (the main process reads both with
    ``sample_rng_used()`` and ``drew_outside()`` when it saves the loader's
    description), and that a worker kept across epochs went on into a later one
    (``kept_past_an_epoch()``); the main process can give ``sample_rng`` the epoch's seed for
    workers that outlive an epoch (``persistent_workers=True``), which would
    otherwise keep the seed of the epoch that started them.

    Examples:
        >>> from devrng._training.workers import WorkerSeeding
        >>> init = devrng.TrainingRNG(seed=0).dataloader_kwargs()["worker_init_fn"]
        >>> isinstance(init, WorkerSeeding), init.sample_rng_used(), init.drew_outside()
        (True, False, False)
    """

    __slots__ = ("generator", "rank", "shared", "then")

    def __init__(self, generator: torch.Generator | None, *, rank: int | None = None,
                 then: Callable[[int], Any] | None = None) -> None:
        self.generator = generator  # the loader's, in the main process only
        self.rank = rank
        self.then = then
        self.shared = torch.zeros(5, dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]

    def __call__(self, worker_id: int) -> Any:
        global _shared, _marked, _untouched
        # A NumPy view of the same memory reads ten times faster than the tensor, per sample.
        _shared = self.shared.numpy() if host.numpy_or_none() is not None else self.shared
        _marked = False
        _untouched = None  # taken when the worker's loop makes its first fetcher
        seed_worker(worker_id, rank=self.rank)
        return None if self.then is None else self.then(worker_id)

    def __getstate__(self) -> tuple[Any, ...]:
        return self.rank, self.then, self.shared

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        self.rank, self.then, self.shared = state
        self.generator = None

    def sample_rng_used(self) -> bool:
        """Whether a worker of this loader ran ``sample_rng`` (since the loader was made)."""
        return bool(self.shared.tolist()[_SAMPLE_RNG_USED])  # (a list: no tensor per read)

    def drew_outside(self) -> bool:
        """Whether a worker of this loader drew from its own torch, Python or NumPy generator
        outside ``sample_rng`` while it loaded a batch (since the loader was made)."""
        return bool(self.shared.tolist()[_DREW_OUTSIDE])

    def kept_past_an_epoch(self) -> bool:
        """Whether a worker of this loader, kept across epochs, went on into a later epoch
        (since the loader was made): a resumed run's new workers cannot continue its streams."""
        return bool(self.shared.tolist()[_KEPT])

    def set_epoch_seed(self, seed: int | None) -> None:
        """The seed ``sample_rng`` uses in this loader's workers from now on, in place of the
        base seed they were started with; ``None`` goes back to that base seed."""
        if seed is None:
            self.shared[_EPOCH_SEED_SET] = 0
            return
        self.shared[_EPOCH_SEED] = (seed & MASK64) - (1 << 64 if seed & (1 << 63) else 0)
        self.shared[_EPOCH_SEED_SET] = 1


def _count_epochs() -> None:
    """Count, in this worker, the fetchers torch's worker loop makes (torch's and torchdata's
    loops alike): one after ``worker_init_fn``, and one more each time a worker kept across
    epochs (``persistent_workers=True``) starts the next epoch -- the only sign of a new
    epoch such a worker gets."""
    global _fetchers
    _fetchers = 0
    kinds: Any = getattr(torch.utils.data, "_DatasetKind", None)
    make = getattr(kinds, "create_fetcher", None)
    if make is None or getattr(make, "_devrng_counts", False):
        return  # (a torch without it: kept workers repeat their first epoch's seed)

    def counted(*args: Any, **kwargs: Any) -> Any:
        global _fetchers
        _fetchers += 1
        if _fetchers == 2 and _shared is not None:  # a kept worker starts a later epoch
            _shared[_KEPT] = 1
        return _watched(make(*args, **kwargs))

    counted._devrng_counts = True  # type: ignore[attr-defined]
    kinds.create_fetcher = staticmethod(counted)


def _watched(fetcher: Any) -> Any:
    """``fetcher``, whose batches are followed, in a worker of a loader devrng seeds, by a look
    at the worker's generators: one that moved since the worker was seeded drew outside
    ``sample_rng`` (which puts back what it changes), where the resumed workers of a run
    restarted inside an epoch draw other numbers. A look only reads; it stops once it saw."""
    global _untouched
    fetch = getattr(fetcher, "fetch", None)
    if _shared is None or fetch is None:
        return fetcher
    if _untouched is None:  # after worker_init_fn: what the user's own init drew is no sample's
        _untouched = _generator_states()

    def watched(index: Any) -> Any:
        data = fetch(index)
        if not _shared[_DREW_OUTSIDE] and not _same_states(_generator_states(), _untouched):
            _shared[_DREW_OUTSIDE] = 1
        return data

    fetcher.fetch = watched
    return fetcher


def _generator_states() -> tuple[Any, ...]:
    """This process's torch, Python and NumPy generator states, to compare (reads only)."""
    np = host.numpy_or_none()
    return (torch.get_rng_state(), random.getstate(),
            None if np is None else np.random.get_state())


def _same_states(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    (torch_a, python_a, numpy_a), (torch_b, python_b, numpy_b) = a, b
    if not torch.equal(torch_a, torch_b) or python_a != python_b:
        return False
    if numpy_a is None or numpy_b is None:
        return numpy_a is numpy_b
    # (name, key words, position, has_gauss, cached gaussian)
    return bool((numpy_a[1] == numpy_b[1]).all()) and numpy_a[2:] == numpy_b[2:]


def _worker_epoch_seed(info: Any) -> int:
    """The seed ``sample_rng`` derives a sample's streams from, in a worker."""
    global _marked
    shared = _shared
    if shared is not None:
        if not _marked:
            shared[_SAMPLE_RNG_USED] = 1
            _marked = True
        if shared[_EPOCH_SEED_SET]:
            return int(shared[_EPOCH_SEED]) & MASK64
    base = (int(info.seed) - int(info.id)) & MASK64  # the loader's base seed, per iterator
    # A kept worker's later epochs: the iterator, and so its base seed, is the first epoch's.
    return base if _fetchers < 2 else kept_epoch_seed(base, _fetchers - 1)


@contextlib.contextmanager
def sample_rng(index: int) -> Iterator[None]:
    """Draw one sample's randomness from generators seeded by the epoch and ``index`` alone.

    Inside a DataLoader worker, torch's, Python's and NumPy's generators are
    seeded for the block from the epoch's base seed (which the DataLoader
    draws from its ``generator``) and ``index``, and put back afterwards. So a
    sample's augmentation does not depend on which worker loads it or what
    that worker loaded before: a loader resumed mid-epoch (torchdata's
    ``StatefulDataLoader``), whose new workers start their streams afresh,
    still draws exactly what the uninterrupted run drew. In the main process
    (``num_workers=0``) it changes nothing: there the global generators, which
    ``TrainingRNG`` saves, already resume exactly.

    Workers kept across epochs (``persistent_workers=True``) keep the base seed
    of the epoch that started them. Where devrng seeds them (``dataloader_kwargs``
    or ``worker_init_fn=devrng.seed_worker``), each later epoch derives a seed of
    its own from that one and the epoch's number, so every epoch augments anew
    (Lightning's ``DevRNGCallback`` hands them each epoch's seed instead, which a
    resumed run draws again).

    Args:
        index: The sample's index, as ``Dataset.__getitem__`` receives it.

    Raises:
        TypeError: ``index`` is not an int of 0 or more.

    Examples:
        >>> class Noisy(torch.utils.data.Dataset):
        ...     def __len__(self): return 4
        ...     def __getitem__(self, i):
        ...         with devrng.sample_rng(i):
        ...             return torch.rand(1)
        >>> len(list(torch.utils.data.DataLoader(Noisy())))
        4
    """
    if isinstance(index, bool) or not isinstance(index, numbers.Integral):
        raise TypeError(
            f"sample_rng takes the sample's index (an int from 0 to 2**64 - 1), not "
            f"{short_repr(index)} "
            f"(a {type(index).__name__})."
        )
    index = int(index)  # NumPy ints too: Subset and samplers hand them out
    if not 0 <= index <= MASK64:
        raise ValueError(
            f"sample_rng got the index {short_repr(index)}; a sample's index must be from 0 to 2**64 - 1 "
            "(larger ones would share the streams of smaller ones)."
        )
    info = torch.utils.data.get_worker_info()
    if info is None:
        yield
        return
    epoch_seed = _worker_epoch_seed(info)
    torch_seed, python_seed, np_words = worker_seeds(sample_seed(epoch_seed, index), 0,
                                                     process_rank(strict=False))
    with fork_rng(devices=[], python=True, numpy=True):
        torch.manual_seed(torch_seed)
        random.seed(python_seed)
        np = host.numpy_or_none()
        if np is not None:
            np.random.seed(np_words)
        yield
