"""Never silent: what TrainingRNG records about its loaders, and the DevRNGWarning when a resume
cannot be exact (real DataLoaders and worker processes; the trainers' cells are in
tests/integrations/test_resume_matrix.py)."""

from __future__ import annotations

import logging
import random
import re
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from tests._helpers import plain_state, resealed, unsealed
from tests._internals import WorkerSeeding, describe_loader, host
from torch.utils.data import DataLoader, Dataset

import devrng


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
                      "batch_size": 4, "persistent_workers": False, "kept_past_epoch": False,
                      "in_order": True,
                      "sampler": "RandomSampler",
                      "private_shuffle": False, "devrng_seeded": True, "sample_rng": False,
                      "worker_draws": False,
                      "sampler_args": {"replacement": False, "num_samples": None},
                      "batch_sampler": "BatchSampler", "drop_last": False,
                      "dataset_length": 8, "iterable": False, "epoch_length": 8}
    assert describe_loader(loader) == record
    rng.load_state_dict(rng.state_dict())  # the same loader: nothing to warn about


class Buckets(torch.utils.data.BatchSampler):
    """A batch sampler of the user's own (here batching as torch's does)."""


def _distributed(**kwargs: Any) -> Any:
    options = {"num_replicas": 2, "rank": 0, "shuffle": True, "seed": 0, "drop_last": False}
    return torch.utils.data.DistributedSampler(range(64), **{**options, **kwargs})


# What decides which samples each step sees, changed between the saved run and the resumed
# one: (the saved loader's arguments, the resumed one's, what the warning says).
_CHANGES = {
    "shuffle": ({"shuffle": True}, {"shuffle": False},
                r"drew its indices from a RandomSampler \(shuffle=True\) and now from a "
                r"SequentialSampler \(shuffle=False\).*resume with shuffle=True"),
    "dataset length": ({}, {"dataset": range(72)},
                       r"the dataset of the loader 'loader' had 64 samples and has 72, so the "
                       r"sampler draws other indices.*resume with the dataset of 64 samples"),
    "drop_last": ({"dataset": range(66)}, {"dataset": range(66), "drop_last": True},
                  r"had drop_last=False and has drop_last=True, so an epoch's last, incomplete "
                  r"batch is now dropped.*resume with drop_last=False"),
    "replacement": ({"sampler": torch.utils.data.RandomSampler(range(64))},
                    {"sampler": torch.utils.data.RandomSampler(range(64), replacement=True)},
                    r"the RandomSampler of the loader 'loader' had replacement=False and has "
                    r"replacement=True.*resume with replacement=False"),
    "num_samples": ({"sampler": torch.utils.data.RandomSampler(range(64), num_samples=32)},
                    {"sampler": torch.utils.data.RandomSampler(range(64))},
                    r"had num_samples=32 and has num_samples=None.*resume with num_samples=32"),
    "weights": ({"sampler": torch.utils.data.WeightedRandomSampler([1.0] * 64, 64)},
                {"sampler": torch.utils.data.WeightedRandomSampler([1.0] * 63 + [2.0], 64)},
                r"the WeightedRandomSampler of the loader 'loader' had weights='64 values, "
                r"sha256 [0-9a-f]{16}' and has weights='64 values, sha256 [0-9a-f]{16}'.*resume "
                r"with the weights it had"),
    "weighted num_samples": (
        {"sampler": torch.utils.data.WeightedRandomSampler([1.0] * 64, 64)},
        {"sampler": torch.utils.data.WeightedRandomSampler([1.0] * 64, 48)},
        r"had num_samples=64 and has num_samples=48"),
    "subset": ({"sampler": torch.utils.data.SubsetRandomSampler(range(32))},
               {"sampler": torch.utils.data.SubsetRandomSampler(range(1, 33))},
               r"the SubsetRandomSampler of the loader 'loader' had indices='32 values, sha256 "
               r"[0-9a-f]{16}' and has .*resume with the indices it had"),
    "sampler kind": ({"sampler": torch.utils.data.RandomSampler(range(64))},
                     {"sampler": torch.utils.data.WeightedRandomSampler([1.0] * 64, 64)},
                     r"drew its indices from a RandomSampler \(shuffle=True\) and now from a "
                     r"WeightedRandomSampler.*resume with a RandomSampler as before"),
    "rank": ({"sampler": _distributed()}, {"sampler": _distributed(rank=1)},
             r"the DistributedSampler of the loader 'loader' had rank=0 and has rank=1"),
    "num_replicas": ({"sampler": _distributed()}, {"sampler": _distributed(num_replicas=4)},
                     r"had num_replicas=2 and has num_replicas=4.*resume with num_replicas=2"),
    "distributed seed": ({"sampler": _distributed()}, {"sampler": _distributed(seed=7)},
                         r"had seed=0 and has seed=7.*resume with seed=0"),
    "distributed shuffle": ({"sampler": _distributed()}, {"sampler": _distributed(shuffle=False)},
                            r"had shuffle=True and has shuffle=False.*resume with shuffle=True"),
    "batch sampler": ({}, {"batch_sampler": Buckets(torch.utils.data.SequentialSampler(range(64)),
                                                    4, False)},
                      r"made its batches with a BatchSampler and now with a Buckets.*resume "
                      r"with a BatchSampler"),
}


def _loader(options: dict[str, Any]) -> DataLoader[Any]:
    options = {"dataset": range(64), "batch_size": 4, **options}
    if "batch_sampler" in options:
        del options["batch_size"]
    return DataLoader(**options)


@pytest.mark.parametrize("change", list(_CHANGES))
def test_what_decides_the_samples_is_compared_and_named(
        caplog: pytest.LogCaptureFixture, change: str) -> None:
    saved, now, match = _CHANGES[change]
    [message] = resumed(_loader(saved), _loader(now), caplog)
    assert re.search(match, message), message
    assert resumed(_loader(now), _loader(now), caplog) == []  # unchanged: nothing to say


def test_a_fingerprint_is_the_same_without_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Weights and indices are fingerprinted from their bytes: through NumPy where it is
    installed, else through Python; a state saved in one environment compares in the other."""
    weights = torch.rand(50, dtype=torch.float64)

    def fingerprints() -> list[str]:
        data = torch.utils.data
        samplers = [data.WeightedRandomSampler(weights, 8),
                    data.WeightedRandomSampler(weights[::2], 8),  # a view: its own values
                    data.SubsetRandomSampler([3, 1, 2])]
        args = [describe_loader(DataLoader(range(50), sampler=s))["sampler_args"]
                for s in samplers]
        return [a.get("weights", a.get("indices")) for a in args]

    with_numpy = fingerprints()
    monkeypatch.setattr(host, "numpy_or_none", lambda: None)
    assert fingerprints() == with_numpy
    assert with_numpy[0].startswith("50 values, sha256 ") and len(set(with_numpy)) == 3


def test_drop_last_that_drops_nothing_is_not_a_difference(caplog: pytest.LogCaptureFixture
                                                          ) -> None:
    """64 samples in batches of 4: drop_last=True leaves every batch as it was."""
    assert resumed(_loader({}), _loader({"drop_last": True}), caplog) == []
    assert resumed(_loader({"dataset": range(66)}), _loader({"dataset": range(66),
                                                             "drop_last": True}), caplog) != []


def test_a_record_of_an_older_devrng_is_compared_on_what_it_holds(
        caplog: pytest.LogCaptureFixture) -> None:
    """Version-2 states of devrng 0.1 recorded kind, batch size and workers only (and named
    the loader's `sampler`, a placeholder where accelerate wraps the batch sampler): they
    load, and only what they hold is compared."""
    rng = devrng.TrainingRNG(seed=0)
    rng.track("loader", _loader({"shuffle": True}))
    state = plain_state(rng.state_dict())
    for key in ("sampler_args", "batch_sampler", "drop_last", "dataset_length", "epoch_length"):
        del state["loaders"]["loader"][key]
    state = unsealed(state, 2)
    other = devrng.TrainingRNG(seed=0)
    other.track("loader", _loader({"dataset": range(72), "drop_last": True}))
    caplog.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error", devrng.DevRNGWarning)
        other.load_state_dict(state)  # nothing it can compare has changed
    batch = devrng.TrainingRNG(seed=0)
    batch.track("loader", _loader({"batch_size": 8}))
    with pytest.warns(devrng.DevRNGWarning, match="had batch size 4 and has 8"):
        batch.load_state_dict(state)


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
    assert describe_loader(two)["sample_rng"]
    three = DataLoader(PerSample(inside=True), batch_size=2, num_workers=3,
                       **rng.dataloader_kwargs())
    assert resumed(two, three, caplog) == []
    plain_two = DataLoader(PerSample(inside=False), batch_size=2, num_workers=2,
                           **rng.dataloader_kwargs())
    by_index(plain_two)
    assert not describe_loader(plain_two)["sample_rng"]
    [message] = resumed(plain_two, three, caplog)
    assert "had num_workers=2 and has 3" in message and "devrng.sample_rng(index)" in message
    [message] = resumed(two, DataLoader(PerSample(), batch_size=2), caplog)
    assert "with num_workers=0 the samples draw from the main process's generators" in message


def test_a_persistent_loader_in_a_plain_loop_warns(caplog: pytest.LogCaptureFixture) -> None:
    # A new iterator draws its base seed before the shuffle, kept workers do not: the order.
    loader = DataLoader(PerSample(), batch_size=2, num_workers=1, persistent_workers=True,
                        shuffle=True)
    [message] = resumed(loader, loader, caplog)
    assert "keeps its workers from epoch to epoch (persistent_workers=True)" in message
    assert "the order of the samples differs" in message
    # In order, with workers that drew inside sample_rng: their augmentation.
    rng = devrng.TrainingRNG(seed=0)
    drew = DataLoader(PerSample(), batch_size=2, num_workers=1, persistent_workers=True,
                      **rng.dataloader_kwargs())
    by_index(drew)
    [message] = resumed(drew, drew, caplog)
    assert "so the samples' augmentation differs" in message


def test_a_loader_out_of_order_is_named_at_load(caplog: pytest.LogCaptureFixture) -> None:
    loader = DataLoader(PerSample(), batch_size=2, num_workers=2, in_order=False)
    [message] = resumed(loader, loader, caplog)
    assert ("the loader 'loader' is built with in_order=False: its workers hand over the "
            "batches in the order they finish them, which changes from run to run, so even two "
            "uninterrupted runs see their batches in other orders") in message
    assert describe_loader(DataLoader(PerSample(), in_order=False))["in_order"]  # no workers


def test_what_devrng_cannot_tell_at_load_is_left_to_the_record(
        caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str],
        tmp_path: Any) -> None:
    """Kept workers devrng does not seed, in order, that may have drawn nothing; another
    number of workers devrng does not seed (issue 44): no warning. With the record off, one
    line says the resume could not be checked; with it on, nothing (the record decides)."""
    kept = DataLoader(PerSample(), batch_size=2, num_workers=1, persistent_workers=True)
    two = DataLoader(PerSample(), batch_size=2, num_workers=2)
    by_index(two)
    for saved, now, cause in [(kept, kept, "keeps its workers from epoch to epoch"),
                              (two, DataLoader(PerSample(), batch_size=2, num_workers=3),
                               "had num_workers=2 and has 3")]:
        capsys.readouterr()
        assert resumed(saved, now, caplog) == []
        said = capsys.readouterr().err
        assert said.startswith("devrng: this resume could not be checked when it loaded, and "
                               "the flight record is off") and cause in said, said
        first = devrng.TrainingRNG(seed=0)
        first.track("loader", saved)
        state = first.state_dict()
        rng = devrng.TrainingRNG(seed=0, flight_record=tmp_path)
        rng.track("loader", now)
        with warnings.catch_warnings():
            warnings.simplefilter("error", devrng.DevRNGWarning)
            rng.load_state_dict(state)
        assert "could not be checked" not in capsys.readouterr().err
        assert rng.flight is not None
        rng.flight.close()


def test_another_world_size_warns_with_strict_false(caplog: pytest.LogCaptureFixture) -> None:
    rng = devrng.TrainingRNG(seed=0)
    state = plain_state(rng.state_dict())
    state["world_size"] = 2  # saved by rank 0 of 2: the same rank, so no generator is lost
    state = resealed(state)
    with pytest.raises(devrng.DevRNGError, match="rank 0 of 2"):
        rng.load_state_dict(state)
    with caplog.at_level(logging.WARNING, logger="devrng"), \
            pytest.warns(devrng.DevRNGWarning, match=r"written by a run of 2 process\(es\) and "
                                                     r"this run has 1"):
        rng.load_state_dict(state, strict=False)
    assert "resume on 2 process(es)" in caplog.records[-1].getMessage()


def _world_size_sentence(loader: Any, caplog: pytest.LogCaptureFixture) -> str:
    """The warning that names the world size when a state saved by rank 0 of 2 (with ``loader``
    tracked, if any) loads with strict=False in this process of 1."""
    rng = devrng.TrainingRNG(seed=0)
    if loader is not None:
        rng.track("loader", loader)
    state = plain_state(rng.state_dict())
    state["world_size"] = 2
    with caplog.at_level(logging.WARNING, logger="devrng"), \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rng.load_state_dict(resealed(state), strict=False)
    [message] = [str(w.message) for w in caught if issubclass(w.category, devrng.DevRNGWarning)
                 and "written by a run of 2 process(es)" in str(w.message)]
    return message


def test_the_world_size_warning_says_what_shards_the_data(caplog: pytest.LogCaptureFixture
                                                          ) -> None:
    """It names a DistributedSampler only where there is one."""
    shuffled = DataLoader(range(8), shuffle=True)
    sentence = _world_size_sentence(shuffled, caplog)
    assert "DistributedSampler" not in sentence, sentence
    assert "no loader here shards the data by process (the loader 'loader', a " \
           "RandomSampler: each process sees every sample, as before)" in sentence
    sharded = DataLoader(range(8), sampler=torch.utils.data.DistributedSampler(
        range(8), num_replicas=2, rank=0))
    sentence = _world_size_sentence(sharded, caplog)
    assert "the data is split among the processes by their number (the loader 'loader' (its " \
           "DistributedSampler shards it)), so each process sees other samples; resume on 2 " \
           "process(es)" in sentence
    sentence = _world_size_sentence(None, caplog)
    assert "devrng knows no loader of this run, so it cannot tell whether the data is split" \
           in sentence


def test_a_ranked_loads_warnings_point_at_the_callers_line() -> None:
    """Both warnings of a lenient load of one rank's entry (the world size it records is
    not this job's) name the line that called load_state_dict."""
    import io

    rng = devrng.TrainingRNG(seed=0, strict=False)
    state = plain_state(rng.state_dict())
    state["world_size"] = 2
    buffer = io.BytesIO()
    torch.save(resealed(state), buffer)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rng.load_state_dict({"devrng_rank_0": buffer.getvalue()})
    found = [w for w in caught if issubclass(w.category, devrng.DevRNGWarning)]
    where = [(w.filename, w.lineno) for w in found]
    assert len(where) == 2 and where[0] == where[1] and where[0][0] == __file__, where


def test_a_version_1_state_loads_and_unknown_versions_are_refused(no_warnings: None) -> None:
    rng = devrng.TrainingRNG(seed=0)
    state = plain_state(rng.state_dict())
    del state["loaders"]
    state = unsealed(state, 1)  # devrng 0.1 wrote no loader records
    a = torch.rand(2)  # drawn after the state was taken
    rng.load_state_dict(state)
    assert torch.equal(torch.rand(2), a)
    for version in (4, [2], "2", True):
        state["version"] = version
        with pytest.raises(devrng.DevRNGError, match=r"this devrng reads versions 1, 2, 3\."):
            rng.load_state_dict(state)


def test_records_that_are_not_records_are_ignored_and_odd_values_refused(no_warnings: None) -> None:
    rng = devrng.TrainingRNG(seed=0)
    rng.track("loader", DataLoader(range(4)))
    for bad in ([1, 2], {"loader": "not a record"}, {"loader": [4]}):
        state = plain_state(rng.state_dict())
        state["loaders"] = bad
        rng.load_state_dict(resealed(state))  # nothing to compare with: no warning, no error
    state = plain_state(rng.state_dict())
    # A record of values describe() never writes: refused before it is compared or quoted.
    state["loaders"] = {"loader": {"batch_size": [1]}}
    with pytest.raises(devrng.DevRNGError, match=r"The saved record of the loader 'loader' "
                                                 r"holds \[1\] under 'batch_size'"):
        rng.load_state_dict(resealed(state))


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
    assert describe_loader(device_loader) == describe_loader(inner)  # as trainers pass it
    assert plain_state(rng.state_dict())["loaders"]["loader"]["batch_size"] == 4
    [message] = resumed(device_loader, MpDeviceLoader(DataLoader(range(8), batch_size=2),
                                                      "xla:0"), caplog)
    assert "the loader 'loader' had batch size 4 and has 2" in message


def test_a_stateful_loader_without_a_generator_has_a_private_shuffle() -> None:
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    own = stateful.StatefulDataLoader(range(8), shuffle=True)
    assert describe_loader(own)["private_shuffle"]
    rng = devrng.TrainingRNG(seed=0)
    ours = stateful.StatefulDataLoader(range(8), shuffle=True, **rng.dataloader_kwargs())
    info = describe_loader(ours)
    assert not info["private_shuffle"] and info["devrng_seeded"] and info["stateful"]
    assert not describe_loader(DataLoader(range(8), shuffle=True))["private_shuffle"]


def _kept_epochs(workers: int, epochs: int, *, seeded: bool = True) -> list[dict[int, float]]:
    """Each epoch's draws by index, from a loader whose workers are kept across epochs
    (generator seeded alike in every call: epochs equal across calls are the same epochs)."""
    kwargs: dict[str, Any] = {"generator": torch.Generator().manual_seed(3)}
    if seeded:
        kwargs["worker_init_fn"] = devrng.seed_worker
    loader = DataLoader(PerSample(), batch_size=2, num_workers=workers, persistent_workers=True,
                        **kwargs)
    return [by_index(loader) for _ in range(epochs)]


def test_kept_workers_seeded_by_devrng_augment_anew_each_epoch() -> None:
    """sample_rng in workers kept across epochs: their base seed is the first epoch's, so
    without devrng's seeding every epoch repeats each sample's draws (the control); with it
    each later epoch has a seed of its own -- the same whichever worker loads the sample."""
    two = _kept_epochs(2, 3)
    assert len({tuple(sorted(epoch.items())) for epoch in two}) == 3
    assert _kept_epochs(1, 3) == two  # independent of the number of workers
    plain = _kept_epochs(2, 2, seeded=False)
    assert plain[0] == plain[1] == two[0]  # the same first epoch; then repeated


def test_the_epoch_seed_reaches_persistent_workers() -> None:
    """set_epoch_seed (what the Lightning callback gives kept workers each epoch) decides the
    epoch's draws alone; None goes back to the workers' own."""
    rng = devrng.TrainingRNG(seed=0)
    kwargs = rng.dataloader_kwargs()
    loader = DataLoader(PerSample(), batch_size=2, num_workers=2, persistent_workers=True,
                        **kwargs)
    seeding: WorkerSeeding = kwargs["worker_init_fn"]
    first = by_index(loader)
    seeding.set_epoch_seed(12345)
    epoch_seeded = by_index(loader)
    assert epoch_seeded != first and set(epoch_seeded) == set(first)
    seeding.set_epoch_seed(2**64 - 5)  # any 64-bit seed fits the int64 slot
    assert by_index(loader) not in (first, epoch_seeded)
    seeding.set_epoch_seed(12345)
    assert by_index(loader) == epoch_seeded  # the epoch seed alone decides
    seeding.set_epoch_seed(None)
    own = by_index(loader)  # the workers' own seed of their fifth epoch
    assert own not in (first, epoch_seeded) and set(own) == set(first)


def _collate_drawing(rows: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack(rows) + random.random()  # a batch-level draw, outside sample_rng


def _none_inside_outside_collate() -> dict[str, DataLoader[Any]]:
    rng = devrng.TrainingRNG(seed=0)
    return {
        "none": DataLoader(range(8), batch_size=2, num_workers=1, **rng.dataloader_kwargs()),
        "inside": DataLoader(PerSample(inside=True), batch_size=2, num_workers=1,
                             **rng.dataloader_kwargs()),
        "outside": DataLoader(PerSample(inside=False), batch_size=2, num_workers=1,
                              **rng.dataloader_kwargs()),
        "collate": DataLoader(PerSample(inside=True), batch_size=2, num_workers=1,
                              collate_fn=_collate_drawing, **rng.dataloader_kwargs()),
        "unseeded": DataLoader(PerSample(inside=False), batch_size=2, num_workers=1),
        "main": DataLoader(PerSample(inside=False), batch_size=2, **rng.dataloader_kwargs()),
    }


@pytest.mark.slow  # starts 6 worker processes
def test_workers_report_draws_outside_sample_rng() -> None:
    """A worker whose generators moved outside sample_rng -- in the dataset or the collate_fn
    -- says so (worker_draws); draws inside sample_rng, or none, are not draws outside; devrng
    cannot tell for workers it does not seed; the main process draws from saved generators."""
    loaders = _none_inside_outside_collate()
    for loader in loaders.values():
        assert describe_loader(loader)["worker_draws"] in (False, None)  # nothing loaded yet
        list(loader)
    found = {name: describe_loader(loader)["worker_draws"] for name, loader in loaders.items()}
    assert found == {"none": False, "inside": False, "outside": True, "collate": True,
                     "unseeded": None, "main": False}


def test_a_state_with_a_corrupt_epoch_start_is_refused_before_anything_changes() -> None:
    """The generators of an epoch's start are checked with the rest of the state: one that is
    not a record devrng wrote is refused, and nothing changes."""
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    rng = devrng.TrainingRNG(seed=0)
    loader = rng.track("loader", stateful.StatefulDataLoader(
        range(16), batch_size=2, sampler=torch.utils.data.SubsetRandomSampler(range(12)),
        **rng.dataloader_kwargs()))
    batches = iter(loader)
    next(batches)
    state = plain_state(rng.state_dict())
    start = state["epoch_starts"]["loader"]
    assert set(start) == {"host", "sampler", "first"}
    before = torch.get_rng_state()
    for key, bad in (("host", {"cpu": "not a state"}), ("first", 3),
                     ("first", {**start, "first": None})):  # ('first' holds no 'first')
        state["epoch_starts"]["loader"] = {**start, key: bad}
        with pytest.raises(devrng.DevRNGError, match=r"TrainingRNG.load_state_dict: the saved "
                                                     r"epoch start of the loader 'loader' is "
                                                     r"not a record devrng wrote"):
            rng.load_state_dict(resealed(state))
        assert torch.equal(torch.get_rng_state(), before)
    # As devrng 0.4 wrote them: an epoch start without 'first', and none at all. They load.
    state["epoch_starts"]["loader"] = {"host": start["host"], "sampler": start["sampler"]}
    rng.load_state_dict(resealed(state))
    del state["epoch_starts"]
    rng.load_state_dict(resealed(state))


def test_a_stateful_loader_saved_inside_an_epoch_takes_another_number_of_workers(
        caplog: pytest.LogCaptureFixture) -> None:
    """A place saved with 2 workers continues with 3 (the batches as the uninterrupted run's);
    with 0, torchdata keeps it in another form: a DevRNGError sentence, nothing changed, and
    with strict=False the epoch starts afresh with a warning."""
    stateful = pytest.importorskip("torchdata.stateful_dataloader")

    def make(workers: int) -> tuple[devrng.TrainingRNG, Any]:
        rng = devrng.TrainingRNG(seed=0)
        return rng, rng.track("loader", stateful.StatefulDataLoader(
            PerSample(), batch_size=2, shuffle=True, num_workers=workers,
            **rng.dataloader_kwargs()))

    rng, loader = make(2)
    batches = iter(loader)
    first = next(batches)
    saved = rng.state_dict()
    rest = list(batches)
    rng, loader = make(3)
    assert resumed_quietly(rng, saved) == []
    assert all(torch.equal(a, b) for a, b in zip(list(loader), rest, strict=True))
    rng, loader = make(0)
    with pytest.raises(devrng.DevRNGError, match=r"the loader 'loader' was saved inside an epoch "
                                                 r"\(after batch 1\) with num_workers=2 and has "
                                                 r"num_workers=0.*resume with num_workers=2"):
        rng.load_state_dict(saved)
    skipped, different = resumed_quietly(rng, saved, strict=False)
    assert "did not restore: the place of the loader 'loader' in its epoch" in skipped
    assert "it starts the epoch afresh" in skipped and "had num_workers=2 and has 0" in different
    assert len(list(loader)) == 4  # a whole epoch: the saved place was not restored
    assert len(first) == 2


def resumed_quietly(rng: devrng.TrainingRNG, state: Any, **kwargs: Any) -> list[str]:
    """``rng.load_state_dict(state, **kwargs)``; the DevRNGWarning messages."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rng.load_state_dict(state, **kwargs)
    return [str(w.message) for w in caught if issubclass(w.category, devrng.DevRNGWarning)]
