"""``seed_worker`` and ``dataloader_kwargs()`` with real DataLoaders and real worker processes."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import torch
from tests._internals import WorkerSeeding, worker_seeds
from torch.utils.data import DataLoader

import devrng
from _datasets import INDEX, NORMAL, NUMPY, PYTHON, RANK, TORCH, UNIFORM, WORKER, RandomDraws

DRAWS = (TORCH, NUMPY, PYTHON, NORMAL, UNIFORM)


def run(seed: int | None, *, epochs: int = 2, context: str | None = None,
        persistent: bool = False, worker_init: bool = True) -> list[torch.Tensor]:
    """Items of each epoch, in loading order, from a shuffled loader with 2 workers."""
    with devrng.deterministic(seed=seed) as handle:
        kwargs = handle.dataloader_kwargs()
        if not worker_init:
            del kwargs["worker_init_fn"]
        loader = DataLoader(RandomDraws(8), batch_size=2, shuffle=True, num_workers=2,
                            multiprocessing_context=context, persistent_workers=persistent,
                            **kwargs)
        return [torch.cat(list(loader)) for _ in range(epochs)]


def by_index(epoch: torch.Tensor) -> torch.Tensor:
    return epoch[epoch[:, INDEX].argsort()]


def assert_all_distinct(epoch: torch.Tensor) -> None:
    assert set(epoch[:, WORKER].tolist()) == {0.0, 1.0}, "both workers must have loaded items"
    for col in DRAWS:
        values = epoch[:, col].tolist()
        assert len(set(values)) == len(values), f"column {col} repeats across items/workers"


def assert_all_differ(a: torch.Tensor, b: torch.Tensor) -> None:
    a, b = by_index(a), by_index(b)
    for col in DRAWS:
        assert (a[:, col] != b[:, col]).all(), f"column {col} has equal draws: {a[:, col]} {b[:, col]}"


def test_same_seed_same_batches_over_two_epochs() -> None:
    first, second = run(7), run(7)
    for e1, e2 in zip(first, second, strict=True):
        assert torch.equal(e1, e2)


def test_epochs_differ_and_workers_are_distinct() -> None:
    epochs = run(7)
    for epoch in epochs:
        assert_all_distinct(epoch)
    assert_all_differ(epochs[0], epochs[1])
    # shuffling follows the generator too
    assert not torch.equal(epochs[0][:, INDEX], epochs[1][:, INDEX])


def test_different_seeds_differ() -> None:
    assert_all_differ(run(7)[0], run(8)[0])


def test_persistent_workers_still_differ_per_epoch() -> None:
    a, b = run(3, persistent=True), run(3, persistent=True)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert_all_differ(a[0], a[1])


def test_ranks_get_different_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "0")
    rank0 = run(11)
    monkeypatch.setenv("RANK", "1")
    rank1, rank1_again = run(11), run(11)
    assert (rank1[0][:, RANK] == 1).all()
    for e0, e1 in zip(rank0, rank1, strict=True):
        assert torch.equal(e0[:, INDEX], e1[:, INDEX])  # same generator: same shuffle
        assert_all_differ(e0, e1)
    assert all(torch.equal(x, y) for x, y in zip(rank1, rank1_again, strict=True))


def test_without_seed_worker_ranks_share_augmentations(monkeypatch: pytest.MonkeyPatch) -> None:
    # What seed_worker fixes: torch seeds workers from the generator alone, so
    # two ranks with the same seed draw the very same "random" augmentations.
    monkeypatch.setenv("RANK", "0")
    rank0 = run(11, worker_init=False, epochs=1)[0]
    monkeypatch.setenv("RANK", "1")
    rank1 = run(11, worker_init=False, epochs=1)[0]
    assert torch.equal(rank0[:, list(DRAWS)], rank1[:, list(DRAWS)])


def test_spawn_reproducible_per_epoch_worker_and_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    # Spawned workers start from a fresh interpreter: nothing is inherited but
    # the pickled dataset, the worker_init_fn and the environment (RANK). One
    # spawn run (worker start-up costs seconds here) is checked against fork
    # runs: the seeds depend on the generator, worker and rank only.
    monkeypatch.setenv("RANK", "1")
    spawn = run(5, context="spawn", persistent=True)
    fork = run(5, context="fork", persistent=True)
    monkeypatch.setenv("RANK", "0")
    rank0 = run(5, context="fork", persistent=True)
    for s_epoch, f_epoch in zip(spawn, fork, strict=True):
        assert torch.equal(s_epoch, f_epoch)
        assert_all_distinct(s_epoch)
    assert (spawn[0][:, RANK] == 1).all()
    assert_all_differ(spawn[0], spawn[1])
    assert_all_differ(spawn[0], rank0[0])


# ---------------------------------------------------------------- seed_worker itself
def test_worker_seeds_are_distinct_over_workers_epochs_and_ranks() -> None:
    seen: set[object] = set()
    for base in (0, 1, 2**40 + 3, 2**63 - 1):
        for worker in range(8):
            for rank in range(8):
                torch_seed, python_seed, numpy_words = worker_seeds(
                    base + worker, worker, rank)
                seen.update((torch_seed, python_seed, tuple(numpy_words)))
    # torch, Python and NumPy seeds of every (base, worker, rank) are all different
    assert len(seen) == 3 * 4 * 8 * 8


def test_seed_worker_outside_a_worker_uses_torch_initial_seed() -> None:
    torch.manual_seed(123)
    returned = devrng.seed_worker(0, rank=0)
    draws = (torch.rand(2), np.random.rand(2), random.random())
    torch.manual_seed(123)
    assert devrng.seed_worker(0, rank=0) == returned
    assert torch.equal(torch.rand(2), draws[0])
    assert np.array_equal(np.random.rand(2), draws[1])
    assert random.random() == draws[2]
    torch.manual_seed(123)
    assert devrng.seed_worker(0, rank=1) != returned
    torch.manual_seed(123)
    assert devrng.seed_worker(1, rank=0) != returned


def test_seed_worker_reads_rank_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    torch.manual_seed(1)
    from_env = devrng.seed_worker(0)
    torch.manual_seed(1)
    assert devrng.seed_worker(0, rank=3) == from_env
    monkeypatch.delenv("RANK")
    torch.manual_seed(1)
    no_rank = devrng.seed_worker(0)
    torch.manual_seed(1)
    assert no_rank == devrng.seed_worker(0, rank=0) != from_env


@pytest.mark.parametrize("raw", ["two", "-1", " "])
def test_seed_worker_reads_a_bad_rank_env_as_rank_0(monkeypatch: pytest.MonkeyPatch,
                                                    raw: str) -> None:
    # A DataLoader worker must never fail on RANK; devrng.distributed, asked for a
    # rank explicitly, does (tests/test_distributed.py).
    monkeypatch.setenv("RANK", raw)
    torch.manual_seed(1)
    from_env = devrng.seed_worker(0)
    torch.manual_seed(1)
    assert devrng.seed_worker(0, rank=0) == from_env


def test_dataloader_kwargs_shape_and_generator() -> None:
    with devrng.deterministic(seed=42) as handle:
        kwargs = handle.dataloader_kwargs()
    assert set(kwargs) == {"generator", "worker_init_fn"}
    init = kwargs["worker_init_fn"]
    assert isinstance(init, WorkerSeeding) and init.rank is None and init.then is None
    assert init.generator is kwargs["generator"]  # which loader generator it belongs to
    torch.manual_seed(3)
    assert init(0) is None  # outside a worker: seed_worker's own seeding, nothing more
    ours = torch.rand(1)
    torch.manual_seed(3)
    devrng.seed_worker(0)
    assert torch.equal(ours, torch.rand(1))
    assert isinstance(kwargs["generator"], torch.Generator)
    assert kwargs["generator"].initial_seed() == 42


def test_dataloader_kwargs_without_seed_draws_from_torch() -> None:
    handle = devrng.deterministic()
    try:
        torch.manual_seed(5)
        g1 = handle.dataloader_kwargs()["generator"].initial_seed()
        torch.manual_seed(5)
        g2 = handle.dataloader_kwargs()["generator"].initial_seed()
        torch.manual_seed(6)
        g3 = handle.dataloader_kwargs()["generator"].initial_seed()
    finally:
        handle.restore()
    assert g1 == g2 != g3


def test_simulated_process_group_rank_is_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    # A process group whose rank is not in RANK (mp.spawn + init_process_group(rank=...)):
    # spawned workers could not see it, so dataloader_kwargs binds it. SIMULATED group.
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(torch.distributed, "is_available", lambda: True)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: 2)
    with devrng.deterministic(seed=1) as handle:
        init: Any = handle.dataloader_kwargs()["worker_init_fn"]
    assert isinstance(init, WorkerSeeding)
    assert init.rank == 2
    def draw_after(seeding: Any) -> torch.Tensor:
        torch.manual_seed(9)
        seeding()
        return torch.rand(2)

    bound = draw_after(lambda: init(0))
    assert torch.equal(bound, draw_after(lambda: devrng.seed_worker(0, rank=2)))
    assert not torch.equal(bound, draw_after(lambda: devrng.seed_worker(0, rank=0)))
