"""Never silent: what TrainingRNG records about its loaders, and the DevRNGWarning when a resume
cannot be exact (real DataLoaders and worker processes; the trainers' cells are in
tests/integrations/test_resume_matrix.py)."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from tests._helpers import plain_state
from torch.utils.data import DataLoader, Dataset

import devrng
from devrng import _loaders, _workers


class PerSample(Dataset[torch.Tensor]):
    """Item i: its index and one torch draw, inside sample_rng when ``inside``."""

    def __init__(self, inside: bool = True) -> None:
        self.inside = inside

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.inside:
            with devrng.sample_rng(i):
                return torch.tensor([float(i), torch.rand(()).item()], dtype=torch.float64)
        return torch.tensor([float(i), torch.rand(()).item()], dtype=torch.float64)


def by_index(batches: Any) -> dict[int, float]:
    rows = torch.cat(list(batches))
    return {int(i): float(v) for i, v in rows.tolist()}


@pytest.fixture
def no_warnings() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("error", devrng.DevRNGWarning)
        yield


def resumed(saved_loader: Any, loader: Any, caplog: pytest.LogCaptureFixture) -> list[str]:
    """Load a state saved with ``saved_loader`` tracked into a TrainingRNG tracking ``loader``;
    the DevRNGWarning messages, each checked to be logged on "devrng" too."""
    rng = devrng.TrainingRNG(seed=0)
    rng.track("loader", saved_loader)
    state = rng.state_dict()
    other = devrng.TrainingRNG(seed=0)
    other.track("loader", loader)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="devrng"), \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        other.load_state_dict(state)
    found = [str(w.message) for w in caught if issubclass(w.category, devrng.DevRNGWarning)]
    assert found == [r.getMessage() for r in caplog.records if r.name == "devrng"]
    return found


def test_a_tracked_loader_is_described_in_the_state() -> None:
    rng = devrng.TrainingRNG(seed=0)
    loader = rng.track("loader", DataLoader(range(8), batch_size=4, shuffle=True,
                                            **rng.dataloader_kwargs()))
    record = plain_state(rng.state_dict())["loaders"]["loader"]
    assert record == {"kind": "DataLoader", "stateful": False, "num_workers": 0,
                      "batch_size": 4, "persistent_workers": False, "sampler": "RandomSampler",
                      "private_shuffle": False, "devrng_seeded": True, "sample_rng": False}
    assert _loaders.describe(loader) == record
    rng.load_state_dict(rng.state_dict())  # the same loader: nothing to warn about


def test_the_same_loader_resumes_without_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    make = lambda: DataLoader(range(8), batch_size=4)  # noqa: E731
    assert resumed(make(), make(), caplog) == []


def test_another_batch_size_warns(caplog: pytest.LogCaptureFixture) -> None:
    [message] = resumed(DataLoader(range(8), batch_size=4), DataLoader(range(8), batch_size=2),
                        caplog)
    assert message.startswith("The resumed run will not be bitwise the same")
    assert "the loader 'loader' had batch size 4 and has 2" in message
    assert "resume with batch_size=4" in message


def test_another_number_of_workers_warns_unless_sample_rng_decides(
        caplog: pytest.LogCaptureFixture) -> None:
    rng = devrng.TrainingRNG(seed=0)
    two = DataLoader(PerSample(inside=True), batch_size=2, num_workers=2,
                     **rng.dataloader_kwargs())
    by_index(two)  # the workers run sample_rng, and say so through WorkerSeeding
    assert _loaders.describe(two)["sample_rng"]
    three = DataLoader(PerSample(inside=True), batch_size=2, num_workers=3,
                       **rng.dataloader_kwargs())
    assert resumed(two, three, caplog) == []
    plain_two = DataLoader(PerSample(inside=False), batch_size=2, num_workers=2,
                           **rng.dataloader_kwargs())
    by_index(plain_two)
    assert not _loaders.describe(plain_two)["sample_rng"]
    [message] = resumed(plain_two, three, caplog)
    assert "had num_workers=2 and has 3" in message and "devrng.sample_rng(index)" in message
    [message] = resumed(two, DataLoader(PerSample(), batch_size=2), caplog)
    assert "with num_workers=0 the samples draw from the main process's generators" in message


def test_a_persistent_loader_in_a_plain_loop_warns(caplog: pytest.LogCaptureFixture) -> None:
    loader = DataLoader(PerSample(), batch_size=2, num_workers=1, persistent_workers=True)
    [message] = resumed(loader, loader, caplog)
    assert "keeps its workers from epoch to epoch (persistent_workers=True)" in message


def test_another_world_size_warns_with_strict_false(caplog: pytest.LogCaptureFixture) -> None:
    rng = devrng.TrainingRNG(seed=0)
    state = plain_state(rng.state_dict())
    state["world_size"] = 2  # saved by rank 0 of 2: the same rank, so no generator is lost
    with pytest.raises(devrng.DevRNGError, match="rank 0 of 2"):
        rng.load_state_dict(state)
    with caplog.at_level(logging.WARNING, logger="devrng"), \
            pytest.warns(devrng.DevRNGWarning, match=r"written by a run of 2 process\(es\) and "
                                                     r"this run has 1"):
        rng.load_state_dict(state, strict=False)
    assert "resume on 2 process(es)" in caplog.records[-1].getMessage()


def test_a_version_1_state_loads_and_unknown_versions_are_refused(no_warnings: None) -> None:
    rng = devrng.TrainingRNG(seed=0)
    state = plain_state(rng.state_dict())
    del state["loaders"]
    state["version"] = 1  # devrng 0.1 wrote no loader records
    a = torch.rand(2)  # drawn after the state was taken
    rng.load_state_dict(state)
    assert torch.equal(torch.rand(2), a)
    for version in (3, [2], "2", True):
        state["version"] = version
        with pytest.raises(devrng.DevRNGError, match=r"this devrng reads \[1, 2\]"):
            rng.load_state_dict(state)


def test_corrupt_loader_records_are_ignored_not_fatal(no_warnings: None) -> None:
    rng = devrng.TrainingRNG(seed=0)
    rng.track("loader", DataLoader(range(4)))
    for bad in ([1, 2], {"loader": "not a record"}, {"loader": [4]}):
        state = plain_state(rng.state_dict())
        state["loaders"] = bad
        rng.load_state_dict(state)  # nothing to compare with: no warning, no error
    state = plain_state(rng.state_dict())
    state["loaders"] = {"loader": {"batch_size": [1]}}  # a record of odd values: compared
    with pytest.warns(devrng.DevRNGWarning, match=r"had batch size \[1\] and has 1"):
        rng.load_state_dict(state)


def test_track_takes_a_plain_dataloader_and_refuses_other_objects() -> None:
    rng = devrng.TrainingRNG(seed=0)
    loader = DataLoader(range(4))
    assert rng.track("loader", loader) is loader
    assert "loader" in repr(rng)
    with pytest.raises(ValueError, match="already tracks an object named 'loader'"):
        rng.track("loader", DataLoader(range(4)))
    with pytest.raises(TypeError, match=r"got \[1, 2\] \(of type list\), which has no "
                                        r"state_dict\(\)"):
        rng.track("other", [1, 2])


@pytest.mark.xla
def test_an_xla_device_loader_is_tracked_by_the_loader_it_feeds_from(
        caplog: pytest.LogCaptureFixture) -> None:
    """torch_xla's MpDeviceLoader (accelerate's prepare returns one on XLA) has no state of its
    own: track() returns it and records its DataLoader, so a changed batch size still warns."""
    pytest.importorskip("torch_xla")
    from torch_xla.distributed.parallel_loader import MpDeviceLoader

    rng = devrng.TrainingRNG(seed=0)
    inner = DataLoader(range(8), batch_size=4, shuffle=True, **rng.dataloader_kwargs())
    device_loader = MpDeviceLoader(inner, "xla:0")
    assert rng.track("loader", device_loader) is device_loader
    assert _loaders.describe(device_loader) == _loaders.describe(inner)  # as trainers pass it
    assert plain_state(rng.state_dict())["loaders"]["loader"]["batch_size"] == 4
    [message] = resumed(device_loader, MpDeviceLoader(DataLoader(range(8), batch_size=2),
                                                      "xla:0"), caplog)
    assert "the loader 'loader' had batch size 4 and has 2" in message


def test_a_stateful_loader_without_a_generator_has_a_private_shuffle() -> None:
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    own = stateful.StatefulDataLoader(range(8), shuffle=True)
    assert _loaders.describe(own)["private_shuffle"]
    rng = devrng.TrainingRNG(seed=0)
    ours = stateful.StatefulDataLoader(range(8), shuffle=True, **rng.dataloader_kwargs())
    info = _loaders.describe(ours)
    assert not info["private_shuffle"] and info["devrng_seeded"] and info["stateful"]
    assert not _loaders.describe(DataLoader(range(8), shuffle=True))["private_shuffle"]


def test_the_epoch_seed_reaches_persistent_workers() -> None:
    """sample_rng in workers kept across epochs: without an epoch seed every epoch repeats the
    same draws per sample; set_epoch_seed gives the workers a new one, and None goes back."""
    rng = devrng.TrainingRNG(seed=0)
    kwargs = rng.dataloader_kwargs()
    loader = DataLoader(PerSample(), batch_size=2, num_workers=2, persistent_workers=True,
                        **kwargs)
    seeding: _workers.WorkerSeeding = kwargs["worker_init_fn"]
    first, again = by_index(loader), by_index(loader)
    assert first == again  # the kept workers' base seed: the same augmentation each epoch
    seeding.set_epoch_seed(12345)
    epoch_seeded = by_index(loader)
    assert epoch_seeded != first and set(epoch_seeded) == set(first)
    seeding.set_epoch_seed(2**64 - 5)  # any 64-bit seed fits the int64 slot
    assert by_index(loader) not in (first, epoch_seeded)
    seeding.set_epoch_seed(12345)
    assert by_index(loader) == epoch_seeded  # the epoch seed alone decides
    seeding.set_epoch_seed(None)
    assert by_index(loader) == first
