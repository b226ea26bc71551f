"""Seeing the batches of a DataLoader: which samples each batch holds and what it contains.

The flight record (``devrng._checks.record``) watches the loaders a run tracks. For each
batch a watched loader delivers it notes the sample indices its sampler or batch sampler
yielded for that batch (tapped while the loader builds an iterator, numbered so that
prefetching workers and a fast-forward are accounted for) and, in a plain loop, a digest
of the batch's content. A trainer integration says which batch a step consumes instead.
"""

from __future__ import annotations

import collections
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from devrng._base.lazy import imported
from devrng._checks.digest import batch_digest

if TYPE_CHECKING:
    from devrng._checks.record import FlightRecord

__all__ = ["Watched", "feeding_loader"]


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


class Watched:
    """One DataLoader whose batches the record sees: each batch as it is delivered (its
    content digest, and the sample indices its batch sampler yielded for it)."""

    def __init__(self, record: FlightRecord, name: str, loader: Any) -> None:
        self.record = weakref.ref(record)
        self.name = name
        self.loader = weakref.ref(loader)
        self.delivered: collections.deque[tuple[Any, Any, int | None, str]] = \
            collections.deque(maxlen=256)
        self.indices: dict[int, Any] = {}  # yield number -> what the index source yielded
        self.yielded = 0
        self.offset = 0  # send id - yield number, for loaders with workers
        self.unordered = False  # its last iterator hands over batches out of order
        # Batches of the epoch it does not yield (accelerate's SkipBatchSampler, with which a
        # resumed HF Trainer continues an epoch): counted in a batch's place in its epoch.
        skipped = getattr(loader.__dict__.get("batch_sampler"), "skip_batches", 0)
        self.skipped = skipped if isinstance(skipped, int) else 0
        # Weak references both ways: the loader must not be kept in a cycle (see _iterator).
        watched, loader_ref = weakref.ref(self), weakref.ref(loader)
        # Another wrapper devrng put there (TrainingRNG's record of each epoch's generators)
        # runs inside this one.
        self._inner: Callable[[], Any] | None = loader.__dict__.get("_get_iterator")

        def get_iterator() -> Any:
            this, target = watched(), loader_ref()
            if target is None:  # (the loader calls this: it exists)
                raise ReferenceError("the DataLoader is gone")
            if this is None:  # the record is gone: the loader's own way
                return type(target)._get_iterator(target)
            return this._iterator(target)

        loader._get_iterator = get_iterator
        loader._devrng_flight = True

    def unwatch(self) -> None:
        loader = self.loader()
        if loader is not None:
            loader.__dict__.pop("_devrng_flight", None)
            if self._inner is None:
                loader.__dict__.pop("_get_iterator", None)
            else:
                loader._get_iterator = self._inner

    def _iterator(self, loader: Any) -> Any:
        key = "batch_sampler" if loader.__dict__.get("batch_sampler") is not None else "sampler"
        real = loader.__dict__.get(key)
        tap = real is not None and not isinstance(
            real, torch.utils.data.dataloader._InfiniteConstantSampler)
        if tap:
            loader.__dict__[key] = _IndexSource(real, self)
        try:
            it = self._inner() if self._inner is not None else type(loader)._get_iterator(loader)
        finally:
            if tap:
                loader.__dict__[key] = real
        if tap:
            # What construction drew past (a fast-forward) is not a batch; what it sent to
            # workers ahead (prefetch) is, numbered from the next batch to arrive.
            outstanding = getattr(it, "_send_idx", 0) - getattr(it, "_rcvd_idx", 0)
            first = self.yielded - outstanding
            self.indices = {k: v for k, v in self.indices.items() if k >= first}
            self.offset = getattr(it, "_rcvd_idx", 0) - first
        # The wrapper holds the iterator weakly: a cycle through it would leave the iterator
        # to the garbage collector, which may run in a forked worker (whose clean-up then
        # fails: "can only test a child process").
        ref = weakref.ref(it)
        next_data = type(it)._next_data
        self.unordered = getattr(it, "_in_order", True) is False
        in_order = not self.unordered and tap
        watched = self

        def _next_data() -> Any:
            iterator = ref()
            record = watched.record()
            main = threading.current_thread() is threading.main_thread()
            plain = record is not None and not record.hooked and main
            if plain:
                had = record._start  # type: ignore[union-attr]
                record.begin_step()  # type: ignore[union-attr]
            try:
                data = next_data(iterator)
            except StopIteration:
                if plain and had is None:  # the epoch ended: the step starts with the next one
                    record._start = None  # type: ignore[union-attr]
                raise
            if record is not None:
                watched._deliver(record, iterator, data, in_order, plain)
            return data

        it._next_data = _next_data
        return it

    def _deliver(self, record: FlightRecord, it: Any, data: Any, in_order: bool,
                 plain: bool) -> None:
        indices = None
        if in_order:
            if hasattr(it, "_send_idx"):
                number = getattr(it, "_rcvd_idx", 0) - 1 - self.offset
            else:
                number = self.yielded - 1
            indices = self.indices.pop(number, None)
            for k in [k for k in self.indices if k < number]:
                del self.indices[k]
        position = getattr(it, "_num_yielded", None)
        if isinstance(position, int):
            position += self.skipped
        # A step a trainer's hook feeds is digested as the step sees it (consume).
        with record._aside():  # (the record's own digest: not one of the step's ops)
            entry = (indices, batch_digest(data) if plain else None, position, self.name)
        with record._lock:
            if plain:
                record._batches.append(entry)
            else:
                self.delivered.append(entry)

    def new_pass(self) -> None:
        self.indices.clear()
        self.delivered.clear()  # a new iterator: what the last one delivered ahead is dropped
        self.yielded = 0
        self.offset = 0

    def saw(self, item: Any) -> None:
        self.indices[self.yielded] = item
        self.yielded += 1


class _IndexSource:
    """Stands for a loader's sampler or batch sampler while the loader builds an iterator:
    yields what it yields and tells the record each item; everything else is the real one's."""

    def __init__(self, real: Any, watched: Watched) -> None:
        self._real = real
        self._watched = watched

    def __iter__(self) -> Iterator[Any]:
        self._watched.new_pass()
        return _IndexIterator(iter(self._real), self._watched)

    def __len__(self) -> int:
        return len(self._real)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class _IndexIterator:
    def __init__(self, it: Iterator[Any], watched: Watched) -> None:
        self._it = it
        self._watched = watched

    def __iter__(self) -> _IndexIterator:
        return self

    def __next__(self) -> Any:
        item = next(self._it)
        self._watched.saw(item)
        return item

    def __getattr__(self, name: str) -> Any:  # a stateful sampler iterator's state_dict
        return getattr(self._it, name)
